/**
 * The panel's self-test: a button that runs gpushare-selftest in this server
 * (`POST <base>gpushare/api/selftest`, Python: gpushare_hub/notebook/slicepage.py) and what it
 * found, framework by framework.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const SELFTEST_ROUTE = 'gpushare/api/selftest';

interface FrameworkRun {
  name?: string;
  held?: boolean;
  stopped_at_mib?: number | null;
  cap?: string | null;
  hard_cap_held?: boolean | null;
  error?: string | null;
}

export interface SelfTestRun {
  error?: string;
  ok?: boolean;
  observed_tier?: string;
  claimed_tier?: string | null;
  slice_mib?: number;
  frameworks?: FrameworkRun[];
  checked?: string;
}

export interface SelfTestState {
  running: boolean;
  run: SelfTestRun | null;
  start: () => void;
}

/** Run gpushare-selftest in this server (POST; it may take a minute). */
export async function runSelfTest(settings: ServerConnection.ISettings): Promise<SelfTestRun> {
  const url = URLExt.join(settings.baseUrl, SELFTEST_ROUTE);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  } catch (err) {
    return { error: 'notebook server unreachable' };
  }
  let body: unknown = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;
  }
  if (!response.ok) {
    const message = (body as { message?: string } | null)?.message;
    return { error: message || `the notebook server answered HTTP ${response.status}` };
  }
  return (body ?? { error: 'no answer' }) as SelfTestRun;
}

function describeRun(run: SelfTestRun): string[] {
  if (run.error) {
    return [`self-test not run: ${run.error}`];
  }
  const lines = [
    `${run.ok ? 'OK' : 'NOT OK'}: observed ${run.observed_tier ?? 'unknown'}` +
      (run.claimed_tier ? `, the node claims ${run.claimed_tier}` : '') +
      (run.checked ? ` (${run.checked})` : '')
  ];
  for (const f of run.frameworks ?? []) {
    if (f.error) {
      lines.push(`${f.name}: ${f.error}`);
      continue;
    }
    const at = f.stopped_at_mib !== null && f.stopped_at_mib !== undefined ? ` at ${f.stopped_at_mib} MiB` : '';
    const hard = f.hard_cap_held ? '; held with its own cap lifted' : '; its own cap lifted, it got past';
    lines.push(`${f.name}: ${f.held ? 'held' : 'not held'}${at}${f.cap ? ` by the ${f.cap} cap` : ''}${hard}`);
  }
  if ((run.frameworks ?? []).length === 0) {
    lines.push('no GPU framework (PyTorch, CuPy, JAX) is installed here to try');
  }
  return lines;
}

export function renderSelfTest(body: HTMLElement, state: SelfTestState): void {
  const box = document.createElement('div');
  box.id = 'gpushare-selftest-box';
  const button = document.createElement('button');
  button.id = 'gpushare-run-selftest';
  button.className = 'jp-Button jp-mod-styled jp-mod-accept';
  button.textContent = state.running ? 'Self-test running …' : 'Run the self-test';
  button.disabled = state.running;
  button.title = 'Allocate past the slice with each framework installed here (never more than the slice + 1 GiB)';
  button.addEventListener('click', () => state.start());
  box.append(button);
  if (state.run) {
    const out = document.createElement('pre');
    out.id = 'gpushare-selftest-result';
    out.textContent = describeRun(state.run).join('\n');
    box.append(out);
  }
  body.append(box);
}
