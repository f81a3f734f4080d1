/**
 * gpushare-hub in JupyterLab: a status-bar item with this server's GPU slice (what it uses, the
 * cap in force, how many others share the card), and a panel with the details.
 *
 * Everything comes from the server extension's `<base>gpushare/api/status` (Python:
 * gpushare_hub/notebook/status.py), read every 10 s; the status line's words are made there. The
 * item adds what hibernation says (hibernation.ts), and the panel lists the kernels (kernels.ts);
 * the panel's Keep button is in keep.ts, its self-test in selftest.ts.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { HibernationWatch } from './hibernation';
import { IdleReturn, KeepState, pressKeep, renderKeep } from './keep';
import { renderKernels } from './kernels';
import { renderSelfTest, runSelfTest, SelfTestState } from './selftest';

const POLL_MS = 10_000;
const ROUTE = 'gpushare/api/status';

interface Slice {
  card_uuids?: string[];
  card_index?: number | null;
  slice_gib?: number | null;
  card_gib?: number | null;
  limit_mib?: number | null;
  card_mib?: number | null;
  torch_cap_mib?: number | null;
  card_cuda_mib?: number | null;
  torch_fraction?: number | null;
  mps_limit?: string | null;
  hook_on_path?: boolean;
  ledger?: boolean;
  framework_caps?: Record<string, string>;
  summary?: string;
}

interface SelfTest {
  ok?: boolean;
  observed?: string;
  claimed?: string;
  checked?: string;
  detail?: string;
}

interface Allocation {
  card_uuid?: string;
  node?: string;
  slice?: string;
  units?: number;
  used_mib?: number | null;
  usage_note?: string;
  // `check`: the node's last self-test, as the hub service's api/v1/me names it.
  isolation?: {
    tier?: string | null;
    words?: string;
    problem?: string;
    check?: SelfTest | null;
  } | null;
  neighbours?: { count?: number; units?: number; used_mib?: number | null } | null;
  // The slice's share of the card's SMs where MPS provisions one, and the SM use measured.
  compute?: { share?: number | null; words?: string } | null;
  sm_util?: number | null;
  // The hub service's idle rule, while this slice is idle on the GPU.
  idle_return?: IdleReturn | null;
}

interface Larger {
  slug?: string;
  display_name?: string;
  gib?: number;
}

interface Status {
  slice: Slice;
  hub: { larger_free?: Larger[]; spawn_url?: string; unit?: string } | null;
  allocation: Allocation | null;
  problem: string;
  text: string;
}

async function readStatus(settings: ServerConnection.ISettings): Promise<Status> {
  const url = URLExt.join(settings.baseUrl, ROUTE);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
  } catch (err) {
    throw new Error('notebook server unreachable');
  }
  if (response.status === 404) {
    throw new Error('the gpushare server extension is not loaded');
  }
  if (!response.ok) {
    throw new Error(`the notebook server answered HTTP ${response.status}`);
  }
  return (await response.json()) as Status;
}

/**
 * A hub path such as /hub/spawn/alice; anything else (another scheme, another host) is refused.
 * No backslash anywhere: browsers read `/\host` as `//host`, another host.
 */
function hubPath(value: unknown): string | null {
  return typeof value === 'string' && value.startsWith('/') && !value.startsWith('//') && !value.includes('\\')
    ? value
    : null;
}

function row(table: HTMLTableElement, label: string, value: string, cls: string): void {
  if (!value) {
    return;
  }
  const tr = table.insertRow();
  tr.className = cls;
  const th = document.createElement('th');
  th.textContent = label;
  const td = document.createElement('td');
  td.textContent = value;
  tr.append(th, td);
}

function gib(mib: number): string {
  return `${(mib / 1024).toFixed(1)} GiB`;
}

function capsInForce(slice: Slice): string[] {
  const caps: string[] = [];
  if (slice.mps_limit) {
    caps.push(`MPS memory limit ${slice.mps_limit} (every CUDA program)`);
  }
  if (slice.torch_fraction !== null && slice.torch_fraction !== undefined) {
    const pct = (slice.torch_fraction * 100).toFixed(1);
    caps.push(
      `PyTorch ${pct}% of the card = ${slice.torch_cap_mib ?? slice.limit_mib} MiB of ` +
        `${slice.card_cuda_mib ?? slice.card_mib} MiB` +
        (slice.hook_on_path ? ' (start-up hook loaded)' : ' (start-up hook NOT loaded: not in force)')
    );
  }
  if (slice.ledger) {
    caps.push("one slice for all of this server's PyTorch processes together (the hook's container ledger)");
  }
  for (const [name, value] of Object.entries(slice.framework_caps ?? {})) {
    caps.push(`${name}=${value}`);
  }
  return caps;
}

function renderPanel(
  body: HTMLElement,
  status: Status | null,
  error: string,
  selftest: SelfTestState,
  keep: KeepState,
  kernels: (body: HTMLElement) => void
): void {
  body.replaceChildren();
  const h = document.createElement('h2');
  h.textContent = 'Your GPU slice';
  body.append(h);
  if (status === null) {
    const p = document.createElement('p');
    p.className = 'gpushare-problem';
    p.textContent = error || 'reading the status ...';
    body.append(p);
    kernels(body);
    return;
  }
  const summary = document.createElement('p');
  summary.className = 'gpushare-summary';
  summary.textContent = status.text;
  body.append(summary);

  const slice = status.slice;
  const alloc = status.allocation ?? {};
  const table = document.createElement('table');
  table.id = 'gpushare-panel-table';
  const card = (slice.card_uuids ?? []).join(', ') || alloc.card_uuid || 'none';
  row(table, 'card', card + (alloc.node ? ` on node ${alloc.node}` : ''), 'gpushare-card');
  if (slice.slice_gib !== null && slice.slice_gib !== undefined) {
    const whole = slice.card_gib ? ` of ${slice.card_gib} GiB` : '';
    row(table, 'slice', `${slice.slice_gib} GiB${whole}` + (alloc.slice ? ` (${alloc.slice})` : ''), 'gpushare-slice');
  }
  if (alloc.used_mib !== null && alloc.used_mib !== undefined) {
    row(table, 'used now', gib(alloc.used_mib), 'gpushare-used');
  } else if (status.allocation) {
    row(table, 'used now', alloc.usage_note || 'not measured', 'gpushare-used');
  }
  row(table, 'caps in force', capsInForce(slice).join('; ') || 'none', 'gpushare-caps');
  const iso = alloc.isolation;
  if (iso) {
    row(table, 'isolation', (iso.words || iso.tier || '') + (iso.problem ? ` (${iso.problem})` : ''), 'gpushare-tier');
    const t = iso.check;
    const test = t
      ? `${t.ok ? 'passed' : 'FAILED'}` +
        (t.observed ? `: observed ${t.observed}` : '') +
        (t.detail ? ` (${t.detail})` : '') +
        (t.checked ? `, ${t.checked}` : '')
      : 'none recorded';
    row(table, 'last self-test', test, 'gpushare-selftest');
  }
  if (alloc.compute) {
    const util = alloc.sm_util !== null && alloc.sm_util !== undefined ? `; using ${alloc.sm_util}% of the SMs now` : '';
    row(table, 'compute', (alloc.compute.words || '') + util, 'gpushare-compute');
  }
  const n = alloc.neighbours;
  if (n) {
    const count = n.count ?? 0;
    const used = n.used_mib !== null && n.used_mib !== undefined ? `, using ${gib(n.used_mib)}` : '';
    const servers = count === 1 ? '1 server' : `${count} servers`;
    row(table, 'others on this card', count ? `${servers} holding ${n.units ?? 0} GiB${used}` : 'none', 'gpushare-neighbours');
  }
  body.append(table);

  if (status.problem) {
    const p = document.createElement('p');
    p.className = 'gpushare-problem';
    p.textContent = status.problem;
    body.append(p);
  }
  renderKeep(body, alloc.idle_return, keep);
  const larger = (status.hub?.larger_free ?? [])[0];
  const spawn = hubPath(status.hub?.spawn_url);
  if (larger && spawn) {
    const p = document.createElement('p');
    const a = document.createElement('a');
    a.id = 'gpushare-larger';
    a.href = spawn;
    a.target = '_blank';
    a.textContent = `Need more? ${larger.display_name ?? larger.slug} (${larger.gib} GiB) is free now: open the hub's spawn page`;
    p.append(a, document.createTextNode(' (stop this server first, or start a named one).'));
    body.append(p);
  }
  kernels(body);
  if (slice.card_uuids && slice.card_uuids.length) {
    renderSelfTest(body, selftest);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpushare-hub-statusbar:plugin',
  description: "This server's GPU slice in the status bar.",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    if (!statusBar) {
      return;
    }
    const settings = ServerConnection.makeSettings();
    const item = new Widget({ node: document.createElement('span') });
    item.id = 'gpushare-statusbar';
    item.addClass('jp-StatusBar-TextItem');
    item.node.textContent = 'GPU …';
    item.node.title = 'Your GPU slice: click for details';

    let last: Status | null = null;
    let error = '';
    let panel: MainAreaWidget<Widget> | null = null;
    const selftest: SelfTestState = {
      running: false,
      run: null,
      start: () => {
        if (selftest.running) {
          return;
        }
        selftest.running = true;
        show();
        void runSelfTest(settings).then(run => {
          selftest.running = false;
          selftest.run = run;
          show();
        });
      }
    };

    const keep: KeepState = {
      said: '',
      press: () => {
        void pressKeep(settings).then(said => {
          keep.said = said;
          void poll();
        });
      }
    };

    // The notebook each kernel runs, by JupyterLab's own list of sessions.
    const names = (): Map<string, string> => {
      const found = new Map<string, string>();
      for (const s of app.serviceManager.sessions.running()) {
        if (s.kernel) {
          found.set(s.kernel.id, s.path || s.name);
        }
      }
      return found;
    };
    const show = () => {
      const degraded = last === null || !!last.problem;
      const sleep = hibernation.itemWords();
      const text = last ? last.text : `GPU status unavailable: ${error}`;
      item.node.textContent = sleep ? `${text} · ${sleep}` : text;
      const why = last ? last.problem || last.slice.summary || '' : error;
      item.node.title = [why, hibernation.tooltip(names())].filter(Boolean).join('\n') + ' (click for details)';
      item.toggleClass('gpushare-degraded', degraded);
      if (panel && !panel.isDisposed) {
        const body = panel.content.node.firstElementChild as HTMLElement;
        renderPanel(body, last, error, selftest, keep, b => renderKernels(b, hibernation, names()));
      }
    };
    const hibernation = new HibernationWatch(settings, show);
    const poll = async () => {
      try {
        last = await readStatus(settings);
        error = '';
      } catch (err) {
        last = null;
        error = (err as Error).message;
      }
      show();
    };

    item.node.addEventListener('click', () => {
      if (!panel || panel.isDisposed) {
        const content = new Widget();
        const body = document.createElement('div');
        body.className = 'gpushare-panel-body';
        content.node.append(body);
        panel = new MainAreaWidget({ content });
        panel.id = 'gpushare-panel';
        panel.title.label = 'GPU slice';
        panel.title.closable = true;
        app.shell.add(panel, 'main');
      }
      show();
      app.shell.activateById(panel.id);
    });

    statusBar.registerStatusItem('gpushare-hub-statusbar:item', { item, align: 'left', rank: 100 });
    void poll();
    window.setInterval(() => void poll(), POLL_MS);
    void hibernation.poll();
    app.serviceManager.sessions.runningChanged.connect(() => show());
  }
};

export default plugin;
