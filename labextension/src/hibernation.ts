/**
 * Hibernation's state for the status bar: the item's few words ("1 kernel hibernated", "waking…",
 * "wake waiting (1 ahead)"), and what the panel's "Kernels" section shows (kernels.ts) and its
 * buttons ask for.
 *
 * Everything comes from the server extension's `<base>gpushare/api/hibernation` (Python:
 * gpushare_hub/notebook/wakeonrun.py; the words are made in sleepstate.py), read every 10 s and
 * every second while a kernel is on its way to sleep or back. A server without the route (404: an
 * older gpushare-hub) shows nothing of it; one without a GPU slice (`available: false`) says why.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const ROUTE = 'gpushare/api/hibernation';
const SLOW_MS = 10_000;
const FAST_MS = 1_000;
const MISSING_MS = 60_000; // an older server: ask again now and then (it may be restarted newer)
const MOVING = ['hibernating', 'waking', 'waiting'];

export type Action = 'hibernate' | 'wake' | 'keep-awake' | 'allow-sleep';

export interface KernelSleep {
  id: string;
  name?: string;
  state: 'awake' | 'hibernating' | 'hibernated' | 'waking' | 'waiting' | 'refused';
  since?: number | null;
  held_mib?: number;
  pids?: number[];
  place?: number | null;
  keep_awake?: boolean;
  words?: string;
}

export interface Hibernation {
  available?: boolean;
  why_not?: string;
  hibernate_after?: number | null;
  summary?: string;
  kernels?: KernelSleep[];
}

/** The route's answer: its document, or none (`missing`: the route is not there; `error`: words). */
export interface Reading {
  doc: Hibernation | null;
  missing: boolean;
  error: string;
}

async function readHibernation(settings: ServerConnection.ISettings): Promise<Reading> {
  const url = URLExt.join(settings.baseUrl, ROUTE);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
  } catch (err) {
    return { doc: null, missing: false, error: 'notebook server unreachable' };
  }
  if (response.status === 404) {
    return { doc: null, missing: true, error: '' };
  }
  if (!response.ok) {
    return { doc: null, missing: false, error: `the notebook server answered HTTP ${response.status}` };
  }
  try {
    return { doc: (await response.json()) as Hibernation, missing: false, error: '' };
  } catch (err) {
    return { doc: null, missing: false, error: 'the notebook server answered no JSON' };
  }
}

/** POST an action for one kernel; `''` when done, else the server's words. */
async function act(settings: ServerConnection.ISettings, kernelId: string, action: Action): Promise<string> {
  const url = URLExt.join(settings.baseUrl, ROUTE, encodeURIComponent(kernelId));
  let response: Response;
  try {
    const init = { method: 'POST', body: JSON.stringify({ action }) };
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (err) {
    return 'notebook server unreachable';
  }
  if (response.ok) {
    return '';
  }
  let message = '';
  try {
    message = ((await response.json()) as { message?: string }).message ?? '';
  } catch (err) {
    message = '';
  }
  return message || `the notebook server answered HTTP ${response.status}`;
}

/** Reads the route on its own clock, and tells `changed` when what it read (or a press) changed. */
export class HibernationWatch {
  reading: Reading = { doc: null, missing: false, error: '' };
  said = ''; // the server's words when a button's action was refused
  pending = new Set<string>(); // kernels whose button was pressed, until the server answers
  private timer = 0;
  private last = '';
  private asked = 0; // readings asked for, in order
  private shown = 0; // the latest reading applied: an answer to an earlier question is stale

  constructor(
    private settings: ServerConnection.ISettings,
    private changed: () => void
  ) {}

  async poll(): Promise<void> {
    window.clearTimeout(this.timer);
    const asked = ++this.asked;
    const reading = await readHibernation(this.settings);
    if (asked < this.shown) {
      return; // a later reading (after a button's answer) came back first: this one is older
    }
    this.shown = asked;
    this.reading = reading;
    const now = JSON.stringify(this.reading);
    if (now !== this.last) {
      this.last = now;
      this.changed();
    }
    const moving = (this.reading.doc?.kernels ?? []).some(k => MOVING.includes(k.state));
    const next = this.reading.missing ? MISSING_MS : moving ? FAST_MS : SLOW_MS;
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.poll(), next);
  }

  press(kernelId: string, action: Action): void {
    this.pending.add(kernelId);
    this.said = '';
    this.changed();
    void act(this.settings, kernelId, action).then(said => {
      this.pending.delete(kernelId);
      this.said = said;
      this.changed();
      void this.poll();
    });
  }

  /** The status-bar item's words: `1 kernel hibernated`, `waking…`, `wake waiting (1 ahead)`. */
  itemWords(): string {
    const summary = this.reading.doc?.available ? this.reading.doc.summary ?? '' : '';
    return summary === 'waking' || summary === 'hibernating' ? `${summary}…` : summary;
  }

  /** One line per kernel that is not simply awake, for the item's tooltip. */
  tooltip(names: Map<string, string>): string {
    return (this.reading.doc?.kernels ?? [])
      .filter(k => k.state !== 'awake')
      .map(k => `${kernelName(k, names)}: ${k.words ?? k.state}`)
      .join('\n');
  }
}

/** The notebook the kernel runs (JupyterLab's sessions, else the server's name), else its id. */
export function kernelName(k: KernelSleep, names: Map<string, string>): string {
  return names.get(k.id) || k.name || `kernel ${k.id.slice(0, 8)}`;
}
