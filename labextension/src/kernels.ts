/**
 * The panel's "Kernels" section: each kernel of this server with its hibernation state (awake,
 * hibernated since a time, waking, waiting with its place and why, refused with why), the server's
 * words for it, and its buttons (Hibernate now, Wake, Keep awake / Allow hibernation), which ask
 * through {@link HibernationWatch.press}.
 */
import { Action, Hibernation, HibernationWatch, KernelSleep, kernelName } from './hibernation';

function pad(n: number): string {
  return String(n).padStart(2, '0');
}

/** `14:05` today, else the date too. */
function clock(unixSeconds: number): string {
  const d = new Date(unixSeconds * 1000);
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

function durationWords(seconds: number): string {
  if (seconds < 60) {
    return `${Math.floor(seconds)} s`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min`;
  }
  const minutes = Math.floor(seconds / 60) % 60;
  return `${Math.floor(seconds / 3600)} h` + (minutes ? ` ${minutes} min` : '');
}

/** The state in a few words; the server's `words` say the rest. */
function headline(k: KernelSleep): string {
  switch (k.state) {
    case 'hibernated':
      return k.since ? `hibernated since ${clock(k.since)}` : 'hibernated';
    case 'hibernating':
      return 'hibernating…';
    case 'waking':
      return 'waking…';
    case 'waiting':
      if (!k.place) {
        return 'waiting to wake';
      }
      return k.place === 1 ? 'waiting to wake, next in line' : `waiting to wake, number ${k.place} in line`;
    case 'refused':
      return 'awake: hibernation refused';
    default:
      return k.keep_awake ? 'awake, kept awake' : 'awake';
  }
}

interface Press {
  label: string;
  action: Action;
  cls: string;
  title: string;
}

const HIBERNATE: Press = {
  label: 'Hibernate now',
  action: 'hibernate',
  cls: 'jp-mod-accept gpushare-hibernate-now',
  title: 'Move its GPU memory into host memory now; the next cell wakes it with every variable'
};
const WAKE: Press = {
  label: 'Wake',
  action: 'wake',
  cls: 'jp-mod-accept gpushare-wake',
  title: 'Move its GPU memory back onto the card now (once it fits in the slice)'
};
const KEEP_AWAKE: Press = {
  label: 'Keep awake',
  action: 'keep-awake',
  cls: 'gpushare-keep-awake',
  title: 'Never hibernate it when idle (wakes it if asleep)'
};
const ALLOW_SLEEP: Press = {
  label: 'Allow hibernation',
  action: 'allow-sleep',
  cls: 'gpushare-allow-sleep',
  title: 'Let it hibernate when idle again'
};

/** The buttons a kernel in its state has. */
function presses(k: KernelSleep): Press[] {
  const found: Press[] = [];
  if (k.state === 'awake' || k.state === 'refused') {
    found.push(HIBERNATE);
  }
  if (k.state === 'hibernated') {
    found.push(WAKE);
  }
  if (k.state !== 'hibernating' && k.state !== 'waking') {
    found.push(k.keep_awake ? ALLOW_SLEEP : KEEP_AWAKE);
  }
  return found;
}

function buttons(k: KernelSleep, watch: HibernationWatch): HTMLElement {
  const box = document.createElement('div');
  box.className = 'gpushare-kernel-buttons';
  for (const p of presses(k)) {
    const b = document.createElement('button');
    b.className = `jp-Button jp-mod-styled ${p.cls}`;
    b.textContent = p.label;
    b.title = p.title;
    b.disabled = watch.pending.has(k.id);
    b.addEventListener('click', () => watch.press(k.id, p.action));
    box.append(b);
  }
  return box;
}

function ruleWords(doc: Hibernation): string {
  const after = doc.hibernate_after;
  return after
    ? `Idle kernels hibernate after ${durationWords(after)} idle: their GPU memory moves into host memory ` +
        'and the next cell wakes them with every variable.'
    : 'Kernels hibernate only when you press Hibernate now: ' +
        "the hub's idle rule for this slice does not hibernate them.";
}

/** The panel's "Kernels" section (nothing for a server without hibernation). */
export function renderKernels(body: HTMLElement, watch: HibernationWatch, names: Map<string, string>): void {
  const { doc, error } = watch.reading;
  if (!doc && !error) {
    return; // not read yet, or an older server
  }
  const box = document.createElement('div');
  box.id = 'gpushare-kernels';
  const h = document.createElement('h3');
  h.textContent = 'Kernels';
  box.append(h);
  const note = document.createElement('p');
  box.append(note);
  body.append(box);
  if (!doc) {
    note.className = 'gpushare-problem';
    note.textContent = `hibernation state unavailable: ${error}`;
    return;
  }
  if (!doc.available) {
    note.textContent = `Kernels do not hibernate here: ${doc.why_not || 'hibernation is off'}.`;
    return;
  }
  note.className = 'gpushare-hibernation-rule';
  note.textContent = ruleWords(doc);
  const kernels = doc.kernels ?? [];
  if (kernels.length === 0) {
    note.textContent += ' No kernel is running.';
  }
  const table = document.createElement('table');
  table.id = 'gpushare-kernels-table';
  for (const k of kernels) {
    const tr = table.insertRow();
    tr.className = 'gpushare-kernel';
    tr.dataset.kernel = k.id;
    tr.dataset.state = k.state;
    const th = document.createElement('th');
    th.textContent = kernelName(k, names);
    th.title = `kernel ${k.id}`;
    const td = document.createElement('td');
    const state = document.createElement('div');
    state.className = 'gpushare-kernel-state';
    state.textContent = headline(k);
    td.append(state);
    const words = k.words ?? '';
    if (words && !words.startsWith('awake')) {
      const more = document.createElement('div');
      more.className = 'gpushare-kernel-words';
      more.textContent = words;
      td.append(more);
    }
    td.append(buttons(k, watch));
    tr.append(th, td);
  }
  if (kernels.length) {
    box.append(table);
  }
  if (watch.said) {
    const p = document.createElement('p');
    p.id = 'gpushare-kernels-said';
    p.className = 'gpushare-problem';
    p.textContent = watch.said;
    box.append(p);
  }
}
