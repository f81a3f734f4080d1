/**
 * The panel's Keep button: while the hub service is about to return this idle slice, ask it
 * (`POST <base>gpushare/api/keep`, through this server: gpushare_hub/notebook/slicepage.py) to put
 * the return off, once, and say what it answered.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const KEEP_ROUTE = 'gpushare/api/keep';

/** The hub service's idle rule, while this slice is idle on the GPU (api/v1/me's idle_return). */
export interface IdleReturn {
  action?: string;
  phase?: string;
  can_keep?: boolean;
  kept?: boolean;
  words?: string;
}

/** Keep: ask the hub service (through this server) to put off returning the idle slice. */
export async function pressKeep(settings: ServerConnection.ISettings): Promise<string> {
  const url = URLExt.join(settings.baseUrl, KEEP_ROUTE);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  } catch (err) {
    return 'notebook server unreachable';
  }
  let body: { message?: string; seconds_left?: number } | null = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;
  }
  if (!response.ok) {
    return body?.message || `the notebook server answered HTTP ${response.status}`;
  }
  const minutes = Math.round((body?.seconds_left ?? 0) / 60);
  return `Kept: your GPU slice stays for at least ${minutes} min more.`;
}

export interface KeepState {
  said: string;
  press: () => void;
}

export function renderKeep(body: HTMLElement, ret: IdleReturn | null | undefined, keep: KeepState): void {
  if (!ret || !(ret.can_keep || keep.said)) {
    return;
  }
  const box = document.createElement('div');
  box.id = 'gpushare-keep-box';
  if (ret.can_keep) {
    const button = document.createElement('button');
    button.id = 'gpushare-keep';
    button.className = 'jp-Button jp-mod-styled jp-mod-warn';
    button.textContent = 'Keep my GPU slice';
    button.title = 'Put off returning this idle slice (once); using the GPU also keeps it';
    button.addEventListener('click', () => keep.press());
    box.append(button);
  }
  if (keep.said) {
    const p = document.createElement('p');
    p.id = 'gpushare-keep-result';
    p.textContent = keep.said;
    box.append(p);
  }
  body.append(box);
}
