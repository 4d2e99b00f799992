/*
 * The console page of `vmr-host serve --console` (docs/console.md).
 *
 * Plain modern JavaScript, no build step, no external file. It reads the REST API /api/v1/
 * and follows the live stream /api/v1/stream (Server-Sent Events read with fetch(), since
 * EventSource cannot send the Authorization header); on `lagged` or a dropped stream it
 * reloads through the REST API and reconnects with a backoff.
 *
 * Token: reads on a loopback console need none; writes (RESUME, release) always do. It comes
 * from the URL fragment `#token=...` (a fragment is never sent to the server) or from the
 * confirmation dialog, is kept in sessionStorage and sent as `Authorization: Bearer`.
 *
 * Guests are hostile: every string that comes from the experiment (entry output, executables,
 * stages, interface names...) is escaped with esc() or set with textContent, never put raw
 * into innerHTML. The timeline fragment is the server's rendering, which escapes them itself.
 *
 * Times: UTC plus experiment time (t=-3.2 s / t=+12.0 s); durations with units.
 */
(() => {
  'use strict';

  // The state words, in the order the server sorts and counts them: the experiment object's
  // `states` (host/model/stateword.py STATES), kept here once it came.
  let STATE_ORDER = new Map();
  const TOKEN_KEY = 'vmr-console-token';
  const TIMELINE_EVERY = 2000; // ms: the timeline is fetched again at most this often
  const DETAIL_EVERY = 1000; // ms: the selected VM's detail likewise
  const FLUSH_AFTER = 120; // ms: changed rows are drawn in batches
  const SPARK_POINTS = 30; // KPI samples kept per VM for the table's sparkline
  const STALL = 40000; // ms without a byte on the stream (keepalive: 15 s) = dropped
  const BACKOFF = [1000, 2000, 4000, 8000, 15000]; // ms between reconnection attempts
  const TAIL = 20; // output lines of an entry's tail
  const OVERSCAN = 30; // rows drawn above and below those in view

  const $ = (id) => document.getElementById(id);
  const collator = new Intl.Collator('en', { numeric: true });

  // ------------------------------------------------------------------ escaping and formats
  const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  /** Text made safe for HTML text and attribute values. */
  const esc = (value) => String(value ?? '').replace(/[&<>"']/g, (c) => ESC[c]);
  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  const pad = (n) => String(n).padStart(2, '0');

  /** A duration in seconds, with its unit: 4.2 ms, 12.3 s, 4 min 05 s, 2 h 03 min, 3 d 4 h. */
  function fmtDur(s) {
    if (s === Infinity || s === 'inf') return '∞';
    if (!isNum(s)) return '–';
    const a = Math.abs(s);
    const sign = s < 0 ? '-' : '';
    if (a < 1) return `${sign}${(a * 1000).toFixed(a < 0.01 ? 1 : 0)} ms`;
    if (a < 60) return `${sign}${a.toFixed(a < 10 ? 2 : 1)} s`;
    if (a < 3600) return `${sign}${Math.floor(a / 60)} min ${pad(Math.floor(a % 60))} s`;
    if (a < 86400) return `${sign}${Math.floor(a / 3600)} h ${pad(Math.floor((a % 3600) / 60))} min`;
    return `${sign}${Math.floor(a / 86400)} d ${Math.floor((a % 86400) / 3600)} h`;
  }

  /** UTC epoch seconds as `2024-05-01 12:00:03.1 UTC` (or without the date). */
  function fmtUtc(t, withDate = true) {
    if (!isNum(t)) return '–';
    const iso = new Date(t * 1000).toISOString();
    return `${withDate ? iso.slice(0, 10) + ' ' : ''}${iso.slice(11, 21)} UTC`;
  }

  /** The experiment time of UTC `t`: `t=+12.0 s` ('' before the start time is known). */
  function fmtT(t) {
    const start = S.exp ? S.exp.start_time : null;
    if (!isNum(t) || !isNum(start)) return '';
    const x = t - start;
    return `t=${x < 0 ? '-' : '+'}${Math.abs(x).toFixed(1)} s`;
  }

  /** UTC and experiment time of `t`, e.g. `12:00:03.1 UTC (t=+2.0 s)`. */
  function fmtWhen(t, withDate = false) {
    if (!isNum(t)) return '–';
    const x = fmtT(t);
    return x ? `${fmtUtc(t, withDate)} (${x})` : fmtUtc(t, withDate);
  }

  /** The age of UTC `t` against the server's clock: `3.1 s ago`. */
  function fmtAge(t) {
    if (!isNum(t)) return '';
    return `${fmtDur(Math.max(0, serverNow() - t))} ago`;
  }

  function fmtBytes(n) {
    if (!isNum(n)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = Math.abs(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return `${n < 0 ? '-' : ''}${v.toFixed(v < 10 && i ? 1 : 0)} ${units[i]}`;
  }
  const fmtRate = (n) => (isNum(n) ? `${fmtBytes(n)}/s` : '–');
  const fmtPct = (v) => (isNum(v) ? `${v.toFixed(v < 10 ? 1 : 0)} %` : '–');
  const fmtNum = (v) => (isNum(v) ? String(Math.round(v * 100) / 100) : '–');
  const stateWord = (s) => String(s || '').replace(/_/g, ' ');

  /** A guest's output line made visible: control characters as \xNN, a final newline dropped. */
  function visible(text) {
    return text.replace(/\r?\n$/, '').replace(/[\x00-\x08\x0b-\x1f\x7f]/g,
      (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
  }

  /** The text of an `output` event's data (`line`, or `line_b64` for bytes that are not UTF-8). */
  function outputText(d) {
    if (typeof d.line === 'string') return visible(d.line);
    if (typeof d.line_b64 !== 'string') return '';
    let bytes;
    try { bytes = Uint8Array.from(atob(d.line_b64), (c) => c.charCodeAt(0)); } catch { return '(undecodable)'; }
    try { return visible(new TextDecoder('utf-8', { fatal: true }).decode(bytes)); } catch { /* below */ }
    return Array.from(bytes, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b)
      : `\\x${b.toString(16).padStart(2, '0')}`)).join('').replace(/\\x0a$/, '');
  }

  // ------------------------------------------------------------------ sparklines
  /** Polyline point lists of `values` (null values cut the line) in a w x h box. */
  function lines(values, w, h, lo, hi) {
    const n = values.length;
    const span = hi - lo || 1;
    const out = [];
    let cur = [];
    values.forEach((v, i) => {
      if (!isNum(v)) { if (cur.length) out.push(cur); cur = []; return; }
      const x = n > 1 ? (i * w) / (n - 1) : 0;
      const y = h - ((Math.min(hi, Math.max(lo, v)) - lo) * (h - 2)) / span - 1;
      cur.push(`${x.toFixed(1)},${y.toFixed(1)}`);
    });
    if (cur.length) out.push(cur);
    return out.map((pts) => (pts.length === 1 ? [pts[0], pts[0]] : pts).join(' '));
  }

  function range(values, lo0, hi0) {
    const nums = values.filter(isNum);
    if (!nums.length) return [0, 1];
    return [lo0 ?? Math.min(...nums), hi0 ?? Math.max(...nums)];
  }

  /** The table's tiny sparkline: CPU % (0-100) and memory used (its own range). */
  function tinySpark(cpu, mem) {
    const [mlo, mhi] = range(mem);
    const a = lines(cpu, 60, 14, 0, 100).map((p) => `<polyline points="${p}"/>`).join('');
    const b = lines(mem, 60, 14, mlo, mhi).map((p) => `<polyline class="mem" points="${p}"/>`).join('');
    return `<svg class="spark" width="60" height="14" viewBox="0 0 60 14" aria-hidden="true">${a}${b}</svg>`;
  }

  /** A detail sparkline of one KPI series (scaled to its own range, or lo..hi). */
  function bigSpark(values, lo, hi) {
    const [a, b] = range(values, lo, hi);
    const ps = lines(values, 200, 28, a, Math.max(b, a + 1e-9));
    return `<svg viewBox="0 0 200 28" preserveAspectRatio="none" aria-hidden="true">${
      ps.map((p) => `<polyline points="${p}"/>`).join('')}</svg>`;
  }

  // ------------------------------------------------------------------ state
  const S = {
    exp: null, // the /api/v1/experiment object
    offset: 0, // server clock - this browser's clock, s
    rows: new Map(), // VM -> row
    hist: new Map(), // VM -> {at, cpu: [], mem: []} (the table's sparkline)
    list: [], // the rows that pass the filter, in order
    order: [], // their VM names
    trs: new Map(), // VM -> its <tr> (the rows drawn: those in view)
    win: [0, 0], // the part of list drawn, [from, to)
    rowH: 25, // px: the height of a row (measured)
    sort: { key: 'problems', dir: 1 },
    terms: [], // filter words (lower case)
    states: new Set(), // state chips on
    problemsOnly: false,
    selected: null, // VM of the detail
    tails: new Map(), // run position -> {entry, lines, output (count when fetched)}: the open output tails
    pending: new Set(), // VMs whose row changed since the last draw
    full: false, // the next draw redraws every row
    flushTimer: 0,
    touched: null, // VMs updated by the stream while a REST reload runs (they win over it)
    loaded: false,
    stats: { renders: 0, lastMs: 0, rows: 0, partial: 0 },
  };
  // The host's clock as the page keeps it; stopped at the last time the host was heard from once
  // it is gone (the stream dropped and a reconnection found nobody: Live.goneAt).
  const serverNow = () => (Live.goneAt !== null ? Live.goneAt : Date.now() / 1000 + S.offset);

  // ------------------------------------------------------------------ token and API
  const Token = {
    mem: '',
    get() { try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return this.mem; } },
    set(v) { this.mem = v; try { if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY); } catch { /* private mode */ } },
    /** `#token=...` of the URL, kept and removed from the address bar. */
    fromUrl() {
      const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
      if (!m) return;
      let token = m[1];
      try { token = decodeURIComponent(token); } catch { /* kept as written */ }
      this.set(token.trim());
      history.replaceState(null, '', location.pathname + location.search);
    },
  };
  const NEEDS_TOKEN = 'needs the token from <logs>/console.token on the host';

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  /** A request to the console: the JSON (or text) answer; HttpError with the server's sentence. */
  async function api(path, { method = 'GET', body } = {}) {
    const headers = { Accept: 'application/json, text/html' };
    const token = Token.get();
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, { method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      throw new HttpError(0, `the console does not answer (${e.message})`);
    }
    const text = await res.text();
    let data = text;
    if ((res.headers.get('Content-Type') || '').includes('json')) {
      try { data = JSON.parse(text); } catch { data = null; }
    }
    if (!res.ok) {
      const why = data && typeof data.error === 'string' ? data.error : `HTTP ${res.status} ${res.statusText}`;
      if (res.status === 401 && method === 'GET') showAuth(why);
      throw new HttpError(res.status, why);
    }
    return data;
  }

  function showAuth(why) {
    $('auth-text').textContent = `Reading this console ${NEEDS_TOKEN}.`;
    $('auth-text').title = why; // the server's sentence
    $('auth').hidden = false;
  }

  let noticeTimer = 0;
  /** A short message under the header (an error stays longer). */
  function notify(text, bad = false) {
    const el = $('notice');
    el.textContent = text;
    el.className = bad ? 'notice bad' : 'notice';
    el.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => { el.hidden = true; }, bad ? 20000 : 8000);
  }

  /** `fn` run at most once every `every` ms (a call meanwhile runs it once afterwards). */
  function throttled(fn, every) {
    let last = 0; let timer = 0; let busy = false; let again = false;
    const run = async () => {
      timer = 0;
      if (busy) { again = true; return; }
      busy = true;
      last = Date.now();
      try { await fn(); } finally {
        busy = false;
        if (again) { again = false; soon(); }
      }
    };
    const soon = () => { if (!timer) timer = setTimeout(run, Math.max(0, last + every - Date.now())); };
    return soon;
  }

  // ------------------------------------------------------------------ header
  function setExperiment(x) {
    if (!x || typeof x !== 'object') return;
    if (S.exp && isNum(S.exp.now) && isNum(x.now) && x.now < S.exp.now) return; // an older answer
    const startChanged = !S.exp || S.exp.start_time !== x.start_time;
    S.exp = x;
    if (Array.isArray(x.states)) STATE_ORDER = new Map(x.states.map((s, i) => [s, i]));
    if (isNum(x.now)) S.offset = x.now - Date.now() / 1000;
    renderHeader();
    if (startChanged && S.selected) detailSoon();
  }

  function renderHeader() {
    const x = S.exp;
    if (!x) return;
    const name = x.name || 'experiment';
    document.title = `${name} — vmr console`;
    $('x-name').textContent = name;
    $('x-mode').textContent = x.mode || '';
    $('x-run').textContent = x.run_id ? `run ${x.run_id}` : '';
    $('x-start').textContent = isNum(x.start_time) ? `start ${fmtUtc(x.start_time)}` : 'start time not set';
    const b = x.barrier || {};
    const waiting = Array.isArray(b.waiting_for) ? b.waiting_for : [];
    const el = $('x-barrier');
    if (!isNum(x.start_time) && waiting.length) {
      const few = waiting.slice(0, 8).join(', ') + (waiting.length > 8 ? `, … (${waiting.length - 8} more)` : '');
      el.textContent = `barrier waiting for ${waiting.length} VM${waiting.length > 1 ? 's' : ''}: ${few}`;
      el.className = 'waiting';
    } else if (!isNum(x.start_time)) {
      el.textContent = 'barrier: waiting for the VMs to configure';
      el.className = 'waiting';
    } else {
      const out = [...(b.excluded || []), ...(b.released || [])];
      el.textContent = out.length ? `started without ${out.length}: ${out.slice(0, 8).join(', ')}` : '';
      el.className = 'muted';
    }
    $('btn-release').hidden = !(!isNum(x.start_time) && waiting.length);
    const resumes = Array.isArray(x.resumes) ? x.resumes : [];
    const last = resumes[resumes.length - 1];
    $('x-resumes').textContent = last
      ? `${resumes.length} RESUME${resumes.length > 1 ? 's' : ''}, last ${fmtWhen(last.issued)} to ${(last.targets || []).length} VM(s)`
      : '';
    renderChips();
    tick();
  }

  function renderChips() {
    const x = S.exp;
    if (!x) return;
    const none = !S.states.size && !S.problemsOnly;
    let html = `<button type="button" class="chip${none ? ' on' : ''}" data-chip="all">all<b>${esc(x.vms)}</b></button>`;
    if (x.problems) {
      html += `<button type="button" class="chip st-failed${S.problemsOnly ? ' on' : ''}" data-chip="problems">problems<b>${esc(x.problems)}</b></button>`;
    }
    for (const [state, n] of Object.entries(x.counts || {})) {
      html += `<button type="button" class="chip st-${esc(state)}${S.states.has(state) ? ' on' : ''}" data-chip="state" data-state="${esc(state)}">${esc(stateWord(state))}<b>${esc(n)}</b></button>`;
    }
    html += Live.goneAt !== null  // nothing is known to be connected to a host that is gone
      ? `<span class="muted">${esc(x.connected)} connected as of ${esc(fmtWhen(Live.goneAt, true))}</span>`
      : `<span class="muted">${esc(x.connected)} connected</span>`;
    $('chips').innerHTML = html;
  }

  /** The header's clock: `starts in 4.2 s` before the start, `t=+12.3 s` after. */
  function tick() {
    const x = S.exp;
    if (!x) return;
    const now = serverNow();
    let text = '';
    if (!isNum(x.start_time)) text = '';
    else if (now < x.start_time) text = `starts in ${fmtDur(x.start_time - now)} (${fmtT(now)})`;
    else text = fmtT(now);
    if (Live.goneAt !== null) text = `${text ? `${text}, ` : ''}stopped: the host is gone`;
    $('x-clock').textContent = text;
  }

  /** The ages in the table (cheap: text only, every 2 s). */
  function refreshAges() {
    for (const td of $('vm-rows').querySelectorAll('td[data-seen]')) {
      const t = Number(td.dataset.seen);
      if (td.dataset.seen !== '' && Number.isFinite(t)) td.textContent = fmtAge(t);
    }
  }

  // ------------------------------------------------------------------ the VM table
  function pushHist(row) {
    const k = row.kpi;
    if (!k || !isNum(k.at)) return;
    let h = S.hist.get(row.vm);
    if (!h) { h = { at: null, cpu: [], mem: [] }; S.hist.set(row.vm, h); }
    if (h.at === k.at) return;
    h.at = k.at;
    h.cpu.push(isNum(k.cpu_percent) ? k.cpu_percent : null);
    h.mem.push(isNum(k.mem_used) ? k.mem_used : null);
    if (h.cpu.length > SPARK_POINTS) { h.cpu.shift(); h.mem.shift(); }
  }

  function onRow(row) {
    if (!row || typeof row.vm !== 'string') return;
    S.rows.set(row.vm, row);
    pushHist(row);
    if (S.touched) S.touched.add(row.vm);
    S.pending.add(row.vm);
    scheduleFlush();
  }

  const byName = (a, b) => collator.compare(a.vm, b.vm);
  const stateRank = (r) => STATE_ORDER.get(r.state) ?? STATE_ORDER.size;
  const problemsFirst = (a, b) => (b.problem - a.problem) || (stateRank(a) - stateRank(b)) || byName(a, b);
  const orNone = (v) => (isNum(v) ? v : -Infinity);
  const KEYS = {
    state: stateRank,
    where: (r) => r.where || '',
    hold: (r) => (r.at_break != null ? 2 : r.paused != null ? 1 : 0),
    running: (r) => r.running || 0,
    failures: (r) => r.failures || 0,
    lateness: (r) => orNone(r.max_lateness),
    seen: (r) => orNone(r.last_seen),
    cpu: (r) => orNone(r.kpi && r.kpi.cpu_percent),
  };
  const FIRST_DIR = { running: -1, failures: -1, lateness: -1, cpu: -1, hold: -1 };

  function comparator() {
    const { key, dir } = S.sort;
    if (key === 'problems') return problemsFirst;
    if (key === 'vm') return (a, b) => byName(a, b) * dir;
    const f = KEYS[key];
    return (a, b) => {
      const x = f(a); const y = f(b);
      return (x < y ? -1 : x > y ? 1 : 0) * dir || problemsFirst(a, b);
    };
  }

  function matches(r) {
    if (S.problemsOnly && !r.problem) return false;
    if (S.states.size && !S.states.has(r.state)) return false;
    if (!S.terms.length) return true;
    const name = r.vm.toLowerCase();
    return S.terms.every((t) => name.includes(t) || r.state.includes(t) || stateWord(r.state).includes(t));
  }

  function visibleRows() {
    const out = [];
    for (const r of S.rows.values()) if (matches(r)) out.push(r);
    return out.sort(comparator());
  }

  function kpiCell(r) {
    const k = r.kpi;
    if (!k) return '';
    const mem = isNum(k.mem_used) ? fmtBytes(k.mem_used) : '–';
    const h = S.hist.get(r.vm);
    return `${fmtPct(k.cpu_percent)} · ${mem}${h && h.cpu.length > 1 ? tinySpark(h.cpu, h.mem) : ''}`;
  }

  /** One row's HTML (every value escaped or formatted here). */
  function rowHtml(r) {
    const cls = `${r.problem ? 'problem' : ''}${r.vm === S.selected ? ' sel' : ''}`;
    const hold = r.at_break != null ? `break #${esc(r.at_break)}` : r.paused != null ? `pause #${esc(r.paused)}` : '';
    const fails = r.failures ? `${esc(r.failures)}${r.failed_entry != null ? ` (#${esc(r.failed_entry)})` : ''}` : '';
    const seen = isNum(r.last_seen) ? r.last_seen : '';
    return `<tr data-vm="${esc(r.vm)}" data-state="${esc(r.state)}" class="${cls}">`
      + `<td title="${esc(r.vm)}"><button type="button" class="link">${esc(r.vm)}</button></td>`
      + `<td><span class="state st-${esc(r.state)}">${esc(stateWord(r.state))}</span></td>`
      + `<td class="where" title="${esc(r.where || '')}">${esc(r.where || '')}</td>`
      + `<td>${hold}</td>`
      + `<td class="num">${r.running ? esc(r.running) : ''}</td>`
      + `<td class="num${r.failures ? ' bad' : ''}">${fails}</td>`
      + `<td class="num">${isNum(r.max_lateness) ? fmtDur(r.max_lateness) : ''}</td>`
      + `<td class="num" data-seen="${seen}">${fmtAge(r.last_seen)}</td>`
      + `<td>${kpiCell(r)}</td></tr>`;
  }

  function makeRow(r) {
    const t = document.createElement('template');
    t.innerHTML = rowHtml(r);
    return t.content.firstElementChild;
  }

  /**
   * The table again: filter, sort, then draw the rows in view (virtualised: the rows above and
   * below are empty space of their height), with one innerHTML assignment. The milliseconds it
   * took, layout included.
   */
  function renderTable() {
    const t0 = performance.now();
    const list = visibleRows();
    S.list = list;
    S.order = list.map((r) => r.vm);
    drawWindow(true);
    $('empty').hidden = list.length > 0 || S.rows.size === 0;
    $('shown').textContent = list.length === S.rows.size ? `${S.rows.size} VMs` : `${list.length} of ${S.rows.size} VMs`;
    for (const th of document.querySelectorAll('#vms th[data-sort]')) {
      const on = th.dataset.sort === S.sort.key;
      if (on) th.setAttribute('aria-sort', S.sort.dir > 0 ? 'ascending' : 'descending');
      else th.removeAttribute('aria-sort');
    }
    $('sort-reset').disabled = S.sort.key === 'problems';
    void $('vm-rows').offsetHeight; // the layout is part of what the reader waits for
    const ms = performance.now() - t0;
    S.stats.renders += 1;
    S.stats.lastMs = ms;
    S.stats.rows = list.length;
    return ms;
  }

  /** The rows [first, last) of S.list in view of the table's scroll box. */
  function inView() {
    const wrap = $('table-wrap');
    const total = S.list.length;
    const head = $('vms').tHead.offsetHeight;
    const top = Math.max(0, Math.min(wrap.scrollTop - head, total * S.rowH - wrap.clientHeight));
    const first = Math.max(0, Math.floor(top / S.rowH));
    return [first, Math.min(total, Math.ceil((top + wrap.clientHeight) / S.rowH) + 1)];
  }

  /** Draw the rows in view and OVERSCAN more each side, unless they are drawn already (`force`: always). */
  function drawWindow(force) {
    const [first, last] = inView();
    if (!force && first >= S.win[0] && last <= S.win[1]) return;
    const from = Math.max(0, first - OVERSCAN);
    const to = Math.min(S.list.length, last + OVERSCAN);
    const pad = (n) => (n > 0 ? `<tr class="pad" aria-hidden="true"><td colspan="9" style="height:${n * S.rowH}px"></td></tr>` : '');
    const tbody = $('vm-rows');
    tbody.innerHTML = pad(from) + S.list.slice(from, to).map(rowHtml).join('') + pad(S.list.length - to);
    S.win = [from, to];
    S.trs = new Map();
    for (const tr of tbody.rows) if (tr.dataset.vm) S.trs.set(tr.dataset.vm, tr);
    const one = S.trs.values().next().value;
    if (one && one.offsetHeight && one.offsetHeight !== S.rowH) { // the style decides: measure it once
      S.rowH = one.offsetHeight;
      drawWindow(true);
    }
  }

  let scrollFrame = 0;
  function onTableScroll() {
    if (scrollFrame) return;
    scrollFrame = requestAnimationFrame(() => { scrollFrame = 0; drawWindow(false); });
  }

  /** A draw soon: after FLUSH_AFTER ms, or longer when a full draw is slow (at most ~10 % of the time). */
  function scheduleFlush() {
    if (!S.flushTimer) S.flushTimer = setTimeout(flush, Math.max(FLUSH_AFTER, 10 * S.stats.lastMs));
  }

  function redraw() {
    S.full = true;
    flush();
  }

  /** Draw what changed: only the changed rows while the order holds, else every row. */
  function flush() {
    clearTimeout(S.flushTimer);
    S.flushTimer = 0;
    const pending = S.pending;
    S.pending = new Set();
    updateResumeAll();
    if (!S.full) {
      const list = visibleRows();
      const same = list.length === S.order.length && list.every((r, i) => r.vm === S.order[i]);
      if (same) {
        S.list = list;
        for (const vm of pending) {
          const tr = S.trs.get(vm);
          const row = S.rows.get(vm);
          if (!tr || !row) continue;
          const fresh = makeRow(row);
          tr.replaceWith(fresh);
          S.trs.set(vm, fresh);
          S.stats.partial += 1;
        }
        return;
      }
    }
    S.full = false;
    renderTable();
  }

  function updateResumeAll() {
    let n = 0;
    for (const r of S.rows.values()) if (r.at_break != null) n += 1;
    const b = $('btn-resume-all');
    b.disabled = n === 0;
    b.textContent = n ? `Resume all at a break (${n})…` : 'Resume all at a break…';
  }

  function markSelected(vm) {
    for (const tr of $('vm-rows').querySelectorAll('tr.sel')) tr.classList.remove('sel');
    const tr = vm && S.trs.get(vm);
    if (tr) tr.classList.add('sel');
  }

  // ------------------------------------------------------------------ the selected VM
  function select(vm) {
    if (!vm) return;
    if (S.selected !== vm) {
      S.selected = vm;
      S.tails = new Map();
      $('d-name').textContent = vm;
      $('d-state').textContent = '';
      setHtml($('d-facts'), '<p class="muted">loading…</p>');
      setHtml($('d-kpi'), '');
      setHtml($('d-entries'), '');
    }
    markSelected(vm);
    const shown = !$('detail').hidden;
    $('detail').hidden = false;
    if (!shown && $('detail').getBoundingClientRect().top > window.innerHeight - 120) {
      $('detail').scrollIntoView({ block: 'start' }); // below the fold: bring its top into view
    }
    loadDetail();
  }

  function closeDetail() {
    S.selected = null;
    markSelected(null);
    $('detail').hidden = true;
  }

  let detailSeq = 0;
  async function loadDetail() {
    const vm = S.selected;
    if (!vm) return;
    const seq = ++detailSeq;
    const path = `/api/v1/vms/${encodeURIComponent(vm)}`;
    let d; let k;
    try {
      [d, k] = await Promise.all([api(path), api(`${path}/kpi`)]);
    } catch (e) {
      if (seq === detailSeq && S.selected === vm) setHtml($('d-facts'), `<p class="error">${esc(e.message)}</p>`);
      return;
    }
    if (seq !== detailSeq || S.selected !== vm) return;
    seedHist(vm, k && k.series);
    if (d.row) onRow(d.row);
    renderDetail(d, k || {});
    const entries = Array.isArray(d.entries) ? d.entries : [];
    for (const [run, tail] of S.tails) {
      const e = entries[run];
      if (e && e.output !== tail.output) loadTail(vm, run, tail.entry, e.output); // new output since
    }
  }

  const shownHtml = new WeakMap();
  /** Set `el`'s HTML when it differs from what was set last (the DOM, and a selection in it, stay). */
  function setHtml(el, html) {
    if (shownHtml.get(el) === html) return;
    shownHtml.set(el, html);
    el.innerHTML = html;
  }
  const detailSoon = throttled(loadDetail, DETAIL_EVERY);

  function seedHist(vm, series) {
    if (!series || !Array.isArray(series.cpu_percent)) return;
    const at = Array.isArray(series.at) ? series.at : [];
    S.hist.set(vm, {
      at: at.length ? at[at.length - 1] : null,
      cpu: series.cpu_percent.slice(-SPARK_POINTS),
      mem: (series.mem_used || []).slice(-SPARK_POINTS),
    });
  }

  function fact(name, html) {
    return html === '' || html == null ? '' : `<dt>${esc(name)}</dt><dd>${html}</dd>`;
  }

  function renderDetail(d, k) {
    const row = d.row || {};
    const st = $('d-state');
    st.className = `state st-${row.state || d.state || ''}`;
    st.textContent = stateWord(row.state || d.state);
    $('d-resume').textContent = row.at_break != null ? `Resume (break #${row.at_break})…` : 'Resume…';
    const phase = d.phase || {};
    const holds = [];
    if (phase.at_break) holds.push(`at the break of entry #${esc(phase.at_break.index)}`);
    if (phase.paused) holds.push(`paused at entry #${esc(phase.paused.index)}`);
    if (Array.isArray(phase.running_entries) && phase.running_entries.length) {
      holds.push(`running entr${phase.running_entries.length > 1 ? 'ies' : 'y'} ${phase.running_entries.map((i) => `#${esc(i)}`).join(', ')}`);
    }
    const sched = d.schedule || {};
    const agent = d.agent || {};
    const ev = d.events || {};
    let html = '<dl class="facts">';
    html += fact('connected', d.connected ? `yes (${esc(d.connections)} connection${d.connections === 1 ? '' : 's'})` : `no${d.connections ? ` (${esc(d.connections)} before)` : ''}`);
    html += fact('last seen', isNum(d.last_seen) ? `${esc(fmtWhen(d.last_seen, true))}, ${esc(fmtAge(d.last_seen))}` : 'never');
    html += fact('schedule', sched.state ? `${esc(sched.state)}${sched.details ? ` — ${esc(sched.details)}` : ''}` : '');
    html += fact('stage', d.stage ? esc(d.stage) : '');
    html += fact('configured', isNum(d.configured_at) ? esc(fmtWhen(d.configured_at, true)) : '');
    html += fact('now', holds.join('; '));
    html += fact('failures', d.failures ? `<span class="bad">${esc(d.failures)}</span>${d.failed_entry != null ? ` (failed entry #${esc(d.failed_entry)})` : ''}` : '');
    html += fact('failed', d.failed ? `<span class="bad">${esc(typeof d.failed === 'string' ? d.failed : 'yes')}</span>${isNum(d.failed_at) ? ` at ${esc(fmtWhen(d.failed_at))}` : ''}` : '');
    html += fact('max lateness', isNum(d.max_lateness) ? esc(fmtDur(d.max_lateness)) : '');
    html += fact('agent', agent.version ? `${esc(agent.version)}${agent.boot_id ? ` <span class="muted">boot ${esc(String(agent.boot_id).slice(0, 12))}</span>` : ''}` : '');
    html += fact('reports', isNum(ev.stored) ? `${esc(ev.stored)} stored${ev.duplicates ? `, ${esc(ev.duplicates)} duplicates` : ''}${ev.over_quota ? `, <span class="bad">${esc(ev.over_quota)} over quota</span>` : ''}` : '');
    html += '</dl>';
    setHtml($('d-facts'), html);
    setHtml($('d-kpi'), kpiHtml(k));
    setHtml($('d-entries'), entriesHtml(Array.isArray(d.entries) ? d.entries : []));
  }

  const KPI_VIEWS = [
    ['cpu_percent', 'CPU', fmtPct, 0, 100],
    ['mem_used', 'memory used', fmtBytes],
    ['load_1', 'load (1 min)', fmtNum, 0],
    ['net_recv', 'network in', fmtRate, 0],
    ['net_sent', 'network out', fmtRate, 0],
    ['disk_read_rate', 'disk read', fmtRate, 0],
    ['disk_write_rate', 'disk write', fmtRate, 0],
  ];

  function kpiHtml(k) {
    const series = k.series || {};
    const at = Array.isArray(series.at) ? series.at.filter(isNum) : [];
    if (!at.length && !k.latest) return '<h3>KPIs</h3><p class="muted">no KPI sample yet</p>';
    const span = at.length > 1 ? ` over ${fmtDur(at[at.length - 1] - at[0])}` : '';
    let html = `<h3>KPIs <span class="muted">(${at.length} sample${at.length === 1 ? '' : 's'}${esc(span)}${at.length ? `, last ${esc(fmtWhen(at[at.length - 1]))}` : ''})</span></h3><div class="kpis">`;
    for (const [name, label, fmt, lo, hi] of KPI_VIEWS) {
      const values = Array.isArray(series[name]) ? series[name] : [];
      const lastVal = [...values].reverse().find(isNum);
      const nums = values.filter(isNum);
      const tip = nums.length ? `min ${fmt(Math.min(...nums))}, max ${fmt(Math.max(...nums))}` : 'no value';
      html += `<div class="kpi" title="${esc(tip)}" data-kpi="${esc(name)}"><span class="muted">${esc(label)}</span> <span class="v">${esc(fmt(lastVal))}</span>${bigSpark(values, lo, hi)}</div>`;
    }
    html += '</div>';
    const latest = k.latest || {};
    const net = latest.net && typeof latest.net === 'object' ? Object.entries(latest.net) : [];
    if (net.length) {
      html += '<table class="entries"><thead><tr><th>interface</th><th>in</th><th>out</th><th>packets in/out</th></tr></thead><tbody>';
      for (const [iface, r] of net) {
        const v = r && typeof r === 'object' ? r : {};
        html += `<tr><td><code>${esc(iface)}</code></td><td>${esc(fmtRate(v.bytes_recv))}</td><td>${esc(fmtRate(v.bytes_sent))}</td><td>${esc(fmtNum(v.packets_recv))} / ${esc(fmtNum(v.packets_sent))} per s</td></tr>`;
      }
      html += '</tbody></table>';
    }
    const mem = isNum(latest.mem_total) ? `memory ${fmtBytes(latest.mem_used)} of ${fmtBytes(latest.mem_total)}` : '';
    const disk = isNum(latest.disk_total) ? `disk ${fmtBytes(latest.disk_used)} of ${fmtBytes(latest.disk_total)}` : '';
    if (mem || disk) html += `<p class="muted">${esc([mem, disk].filter(Boolean).join(' · '))}</p>`;
    return html;
  }

  function entriesHtml(entries) {
    if (!entries.length) return '<h3>Entries</h3><p class="muted">no entry has run yet</p>';
    let html = `<h3>Entries <span class="muted">(${entries.length} run${entries.length === 1 ? '' : 's'})</span></h3>`;
    html += '<table class="entries"><thead><tr><th>#</th><th>command</th><th>status</th><th>exit</th>'
      + '<th>lateness</th><th>start · end</th><th>output</th></tr></thead><tbody>';
    entries.forEach((e, run) => {
      const cmd = e.command || e.executable || '';
      const dur = isNum(e.start) && isNum(e.end) ? fmtDur(e.end - e.start) : '';
      const details = e.details ? `<div class="muted">${esc(e.details)}</div>` : '';
      const out = isNum(e.output) ? e.output : 0;
      const open = S.tails.has(run);
      const peek = Array.isArray(e.tail) && e.tail.length ? `last lines:\n${e.tail.join('\n')}` : '';
      html += `<tr data-run="${run}"><td>#${esc(e.index)}</td>`
        + `<td class="cmd"><code>${esc(cmd)}</code>${details}</td>`
        + `<td class="s-${esc(e.status)}">${esc(e.status)}${stopButton(e, run, entries)}</td>`
        + `<td class="num">${e.exit_code == null ? '' : esc(e.exit_code)}</td>`
        + `<td class="num">${isNum(e.lateness) ? esc(fmtDur(e.lateness)) : ''}</td>`
        + `<td class="when" title="${esc(`start ${fmtWhen(e.start, true)}; end ${fmtWhen(e.end, true)}`)}">${esc(fmtUtc(e.start, false))} <span class="muted">${esc(fmtT(e.start))}</span>`
        + `<br><span class="muted">${isNum(e.end) ? `end ${esc(fmtT(e.end) || fmtUtc(e.end, false))}, took ${esc(dur)}` : 'not ended'}</span></td>`
        + `<td><button type="button" class="tail-btn" data-run="${run}" data-entry="${esc(e.index)}" data-lines="${out}" title="${esc(peek)}"${e.index < 0 ? ' disabled' : ''}>`
        + `${open ? 'hide' : linesLabel(out)}</button></td></tr>`;
      const cached = S.tails.get(run);
      html += `<tr class="tail" data-tail="${run}"${open ? '' : ' hidden'}><td colspan="7"><pre class="out">${cached ? tailHtml(cached.lines) : ''}</pre></td></tr>`;
    });
    return `${html}</tbody></table>`;
  }

  /** A Stop button on the latest run of an entry while it runs (not on an entry the host runs). */
  function stopButton(e, run, entries) {
    const later = entries.slice(run + 1).some((x) => x.index === e.index);
    if (e.status !== 'running' || isNum(e.end) || later || !(e.index >= 0) || S.rows.get(S.selected)?.state === 'lost') return '';
    return ` <button type="button" class="stop-btn danger" data-entry="${esc(e.index)}"${e.positive ? '' : ' data-negative="1"'}`
      + ` title="end this entry's processes (vmr-host kill)">Stop…</button>`;
  }

  function stopEntry(vm, entry, negative) {
    const stage = negative
      ? '<p>It runs in a stage before the start: the stage ends when the entry ends, and the next stage begins.</p>'
      : '';
    confirmWrite({
      title: `Stop entry #${entry} on ${vm}?`,
      html: `<p>Its process tree gets SIGTERM, then SIGKILL after 10 s for what is left; it is reported `
        + `as killed by an operator, not as a failure.</p>${stage}`
        + '<p class="muted">Sent as vmr-host kill sends it (signed when the host has a signing key).</p>',
      okLabel: 'Stop',
      send: () => api('/api/v1/kill', { method: 'POST', body: { vms: [vm], entry } }),
      done: (a) => `kill ${a.id || ''} of entry #${entry} sent to ${(a.sent_now || []).join(', ') || vm}.`,
    });
  }

  const linesLabel = (n) => `${n} line${n === 1 ? '' : 's'}`;

  function tailHtml(lines) {
    if (!lines) return '<span class="muted">loading…</span>';
    if (!lines.length) return '<span class="muted">(no output)</span>';
    return lines.map((l) => (l.err ? `<span class="err">${esc(l.text)}</span>` : esc(l.text))).join('\n');
  }

  /** The last output lines of entry `entry` (run position `run` of the detail), fetched now. */
  async function loadTail(vm, run, entry, output) {
    let data;
    try {
      data = await api(`/api/v1/vms/${encodeURIComponent(vm)}/events?type=output&entry=${encodeURIComponent(entry)}&tail=${TAIL}`);
    } catch (e) {
      data = { events: [], error: e.message };
    }
    if (S.selected !== vm || !S.tails.has(run)) return;
    const lines = [];
    let open = false;
    for (const rec of data.events || []) {
      const ev = rec.event || {};
      const d = ev.data && typeof ev.data === 'object' ? ev.data : {};
      const text = outputText(d);
      const err = d.stream === 'stderr';
      if (open && lines.length) lines[lines.length - 1].text += text; // a line reported in pieces
      else lines.push({ text, err });
      open = d.eol === false;
    }
    if (data.error) lines.push({ text: `(${data.error})`, err: true });
    S.tails.set(run, { entry, lines, output });
    const pre = $('d-entries').querySelector(`tr[data-tail="${run}"] pre`);
    if (pre) pre.innerHTML = tailHtml(lines);
  }

  function toggleTail(btn) {
    const run = Number(btn.dataset.run);
    const row = $('d-entries').querySelector(`tr[data-tail="${run}"]`);
    if (!row) return;
    if (S.tails.has(run)) {
      S.tails.delete(run);
      row.hidden = true;
      btn.textContent = linesLabel(Number(btn.dataset.lines) || 0);
      return;
    }
    const output = Number(btn.dataset.lines) || 0;
    S.tails.set(run, { entry: btn.dataset.entry, lines: null, output });
    row.hidden = false;
    row.querySelector('pre').innerHTML = tailHtml(null);
    btn.textContent = 'hide';
    loadTail(S.selected, run, btn.dataset.entry, output);
  }

  // ------------------------------------------------------------------ confirmation and writes
  let dialogSubmit = null;

  /**
   * A confirmation dialog for a write. `send(force)` makes the request; a 401 asks for the
   * token, a refusal shows the server's sentence (and, for a RESUME of a VM at no break,
   * offers to send it anyway with force true).
   */
  function confirmWrite({ title, html, okLabel, send, done, canForce = false }) {
    const dlg = $('dlg');
    const ok = $('dlg-ok');
    const tokenRow = $('dlg-token-row');
    const error = $('dlg-error');
    let force = false;
    $('dlg-title').textContent = title;
    $('dlg-text').innerHTML = html;
    tokenRow.hidden = Boolean(Token.get());
    $('dlg-token').value = '';
    error.hidden = true;
    ok.textContent = okLabel;
    ok.className = 'primary';
    ok.disabled = false;
    const fail = (text) => { error.textContent = text; error.hidden = false; };
    dialogSubmit = async () => {
      if (!tokenRow.hidden) {
        const t = $('dlg-token').value.trim();
        if (!t) { fail(`This ${NEEDS_TOKEN}.`); return; }
        Token.set(t);
      }
      ok.disabled = true;
      try {
        const answer = await send(force);
        dlg.close();
        notify(done(answer));
        reload();
      } catch (e) {
        ok.disabled = false;
        if (e.status === 401) {
          Token.set('');
          tokenRow.hidden = false;
          fail(`This ${NEEDS_TOKEN}: ${e.message}`);
        } else if (canForce && e.status === 400 && /not at a break/.test(e.message) && !force) {
          force = true;
          fail(e.message);
          ok.textContent = 'Send anyway';
          ok.className = 'danger';
        } else {
          fail(e.message);
        }
      }
    };
    if (!dlg.open) dlg.showModal();
    (tokenRow.hidden ? ok : $('dlg-token')).focus();
  }

  function resumeDone(a) {
    const sent = (a.sent_now || []).length;
    const pending = (a.pending || []).length;
    return `RESUME ${a.id || ''} sent to ${sent} VM${sent === 1 ? '' : 's'}${pending ? `; ${pending} will get it when they reconnect` : ''}.`;
  }

  function resumeVm(vm) {
    const r = S.rows.get(vm);
    const where = r && r.at_break != null
      ? `${vm} is held at the break of entry #${r.at_break}: the RESUME ends it.`
      : `${vm} is not at a break now.`;
    confirmWrite({
      title: `Resume ${vm}?`,
      html: `<p>${esc(where)}</p><p class="muted">Sent as vmr-host resume sends it (stamped with the host's experiment time and signed).</p>`,
      okLabel: 'Resume',
      canForce: true,
      send: (force) => api('/api/v1/resume', { method: 'POST', body: { vms: [vm], force } }),
      done: resumeDone,
    });
  }

  function resumeAllAtBreak() {
    const vms = [...S.rows.values()].filter((r) => r.at_break != null).map((r) => r.vm).sort(collator.compare);
    if (!vms.length) return;
    const few = vms.slice(0, 40).map((v) => `<li>${esc(v)} <span class="muted">(break #${esc(S.rows.get(v).at_break)})</span></li>`).join('');
    confirmWrite({
      title: `Resume ${vms.length} VM${vms.length === 1 ? '' : 's'} at a break?`,
      html: `<p>A RESUME ends the break each of these VMs is held at:</p><ul>${few}${vms.length > 40 ? `<li>… and ${vms.length - 40} more</li>` : ''}</ul>`,
      okLabel: `Resume ${vms.length}`,
      canForce: true,
      send: (force) => api('/api/v1/resume', { method: 'POST', body: { vms, force } }),
      done: resumeDone,
    });
  }

  function release() {
    const waiting = (S.exp && S.exp.barrier && S.exp.barrier.waiting_for) || [];
    const few = waiting.slice(0, 40).map((v) => `<li>${esc(v)}</li>`).join('');
    confirmWrite({
      title: 'Start without the missing VMs?',
      html: `<p>The barrier waits for ${esc(waiting.length)} VM${waiting.length === 1 ? '' : 's'}:</p><ul>${few}${waiting.length > 40 ? `<li>… and ${waiting.length - 40} more</li>` : ''}</ul>`
        + '<p>Releasing sets the start time for the VMs that are configured; those left out get it when they arrive.</p>',
      okLabel: 'Release',
      send: () => api('/api/v1/release', { method: 'POST', body: { exclude: [] } }),
      done: (a) => `Released: start time ${fmtUtc(a.start_time)}${(a.excluded || []).length ? `, without ${a.excluded.length} VM(s)` : ''}.`,
    });
  }

  // ------------------------------------------------------------------ the timeline
  const TL = { text: null };
  async function loadTimeline() {
    const host = $('timeline');
    let html;
    try {
      html = await api('/api/v1/timeline');
    } catch (e) {
      $('timeline-note').textContent = e.message;
      return;
    }
    if (typeof html !== 'string' || html === TL.text) return;
    TL.text = html;
    const left = host.scrollLeft; const top = host.scrollTop;
    host.innerHTML = html; // the server's rendering: it escapes every guest string itself
    if (window.VmrTimeline && typeof window.VmrTimeline.attach === 'function') {
      try { window.VmrTimeline.attach(host); } catch (e) { $('timeline-note').textContent = `zoom unavailable: ${e.message}`; }
    }
    host.scrollLeft = left; host.scrollTop = top;
    $('timeline-note').textContent = `updated ${fmtWhen(serverNow())}`;
  }
  const timelineSoon = throttled(loadTimeline, TIMELINE_EVERY);

  // ------------------------------------------------------------------ REST reload
  let reloading = null;
  /** The experiment and every row from the REST API (rows the stream updated meanwhile win). */
  function reload() {
    if (reloading) return reloading;
    reloading = (async () => {
      S.touched = new Set();
      try {
        const [x, v] = await Promise.all([api('/api/v1/experiment'), api('/api/v1/vms')]);
        setExperiment(x);
        const touched = S.touched;
        const names = new Set();
        for (const r of v.vms || []) {
          names.add(r.vm);
          if (!touched.has(r.vm)) { S.rows.set(r.vm, r); pushHist(r); }
        }
        for (const vm of [...S.rows.keys()]) if (!names.has(vm) && !touched.has(vm)) S.rows.delete(vm);
        S.loaded = true;
        $('auth').hidden = true;
        redraw();
      } catch (e) {
        if (e.status !== 401) notify(`cannot load the experiment: ${e.message}`, true);
      } finally {
        S.touched = null;
        reloading = null;
      }
      timelineSoon();
      if (S.selected) detailSoon();
    })();
    return reloading;
  }

  // ------------------------------------------------------------------ the live stream
  // goneAt: host UTC the host was last heard from, once it is gone (null while it answers)
  const Live = { ctrl: null, attempt: 0, timer: 0, lastByte: 0, open: false, stalled: false, goneAt: null };

  /** The host answered again: its clock runs again. */
  function hostBack() {
    if (Live.goneAt === null) return;
    Live.goneAt = null;
    tick();
    renderChips();
  }

  /** The stream dropped and a reconnection found no host: say so plainly, stop the clock at the
   *  last time the host was heard from. */
  function hostGone(wait) {
    if (Live.goneAt === null) {
      Live.goneAt = Live.lastByte ? Live.lastByte / 1000 + S.offset : Date.now() / 1000 + S.offset;
      tick();
      renderChips();
      refreshAges();
    }
    setConn('gone', `vmr-host is gone: nothing since ${fmtWhen(Live.goneAt, true)}; `
      + `what you see is as of then; retrying in ${Math.round(wait / 1000)} s`);
  }

  function setConn(kind, text) {
    $('conn').className = `conn conn-${kind}`;
    $('conn-text').textContent = text;
  }

  function dispatch(kind, text) {
    let data;
    try { data = JSON.parse(text); } catch { return; }
    if (kind === 'experiment') {
      setExperiment(data);
      timelineSoon();
    } else if (kind === 'vm') {
      onRow(data);
      if (data.vm === S.selected) detailSoon();
    } else if (kind === 'vm_event') {
      timelineSoon();
      if (data && data.vm === S.selected) detailSoon();
    }
  }

  /** Read Server-Sent Events from `body`; true when the server said `lagged`. */
  async function readEvents(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      Live.lastByte = Date.now();
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let kind = 'message';
        const data = [];
        for (const raw of block.split('\n')) {
          const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
          if (!line || line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? '' : line.slice(colon + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'event') kind = val;
          else if (field === 'data') data.push(val);
        }
        if (kind === 'lagged') return true;
        if (data.length) dispatch(kind, data.join('\n'));
      }
    }
  }

  async function connect() {
    clearTimeout(Live.timer);
    Live.timer = 0;
    if (Live.ctrl) Live.ctrl.abort();
    const ctrl = new AbortController();
    Live.ctrl = ctrl;
    Live.open = false;
    setConn('down', Live.attempt ? 'reconnecting…' : 'connecting…');
    let lagged = false;
    let why = 'the stream ended';
    let answered = false; // the host answered the request (even with an error status)
    let unreachable = false; // the request found no host (not aborted by the page)
    try {
      const headers = { Accept: 'text/event-stream' };
      const token = Token.get();
      if (token) headers.Authorization = `Bearer ${token}`;
      const res = await fetch('/api/v1/stream', { headers, signal: ctrl.signal, cache: 'no-store' });
      answered = true;
      hostBack();
      if (!res.ok) {
        let msg = `HTTP ${res.status}`;
        try { msg = (await res.json()).error || msg; } catch { /* not JSON */ }
        if (res.status === 401) {
          showAuth(msg);
          msg = 'needs the token';
        }
        throw new Error(msg);
      }
      Live.open = true;
      Live.attempt = 0;
      Live.lastByte = Date.now();
      setConn('live', 'live');
      reload();
      lagged = await readEvents(res.body);
    } catch (e) {
      why = ctrl.signal.aborted ? (Live.stalled ? 'no data for 40 s' : 'closed') : e.message;
      unreachable = !answered && !ctrl.signal.aborted;
    }
    if (Live.ctrl !== ctrl) return; // replaced by a newer connection
    Live.stalled = false;
    Live.open = false;
    ctrl.abort();
    if (lagged) {
      setConn('down', 'fell behind: reloading…');
      Live.attempt = 1;
      Live.timer = setTimeout(connect, 200);
      return;
    }
    if (!S.loaded) reload(); // show what the REST API has even while the stream fails
    const wait = BACKOFF[Math.min(Live.attempt, BACKOFF.length - 1)];
    Live.attempt += 1;
    if (unreachable && Live.attempt > 1) hostGone(wait); // the stream dropped and does not come back
    else setConn('lost', `disconnected (${why}); retrying in ${Math.round(wait / 1000)} s`);
    Live.timer = setTimeout(connect, wait);
  }

  function watchdog() {
    if (Live.open && Live.ctrl && Date.now() - Live.lastByte > STALL) {
      Live.stalled = true;
      Live.ctrl.abort();
    }
  }

  // ------------------------------------------------------------------ wiring
  function wire() {
    const sortBy = (ev) => {
      const th = ev.target.closest('th[data-sort]');
      if (!th || (ev.type === 'keydown' && ev.key !== 'Enter' && ev.key !== ' ')) return;
      ev.preventDefault();
      const key = th.dataset.sort;
      S.sort = S.sort.key === key ? { key, dir: -S.sort.dir } : { key, dir: FIRST_DIR[key] || 1 };
      redraw();
    };
    document.querySelector('#vms thead').addEventListener('click', sortBy);
    document.querySelector('#vms thead').addEventListener('keydown', sortBy);
    $('sort-reset').addEventListener('click', () => { S.sort = { key: 'problems', dir: 1 }; redraw(); });
    $('table-wrap').addEventListener('scroll', onTableScroll, { passive: true });
    window.addEventListener('resize', onTableScroll);
    $('vm-rows').addEventListener('click', (ev) => {
      const tr = ev.target.closest('tr[data-vm]');
      if (tr) select(tr.dataset.vm);
    });
    let filterTimer = 0;
    $('filter').addEventListener('input', (ev) => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(() => {
        S.terms = ev.target.value.toLowerCase().split(/\s+/).filter(Boolean);
        redraw();
      }, 100);
    });
    $('chips').addEventListener('click', (ev) => {
      const chip = ev.target.closest('[data-chip]');
      if (!chip) return;
      if (chip.dataset.chip === 'all') { S.states.clear(); S.problemsOnly = false; }
      else if (chip.dataset.chip === 'problems') S.problemsOnly = !S.problemsOnly;
      else if (S.states.has(chip.dataset.state)) S.states.delete(chip.dataset.state);
      else S.states.add(chip.dataset.state);
      renderChips();
      redraw();
    });
    $('d-close').addEventListener('click', closeDetail);
    $('d-resume').addEventListener('click', () => { if (S.selected) resumeVm(S.selected); });
    $('d-body').addEventListener('click', (ev) => {
      const stop = ev.target.closest('button.stop-btn');
      if (stop && S.selected) {
        stopEntry(S.selected, Number(stop.dataset.entry), stop.dataset.negative === '1');
        return;
      }
      const btn = ev.target.closest('button.tail-btn');
      if (btn && !btn.disabled) toggleTail(btn);
    });
    $('btn-resume-all').addEventListener('click', resumeAllAtBreak);
    $('btn-release').addEventListener('click', release);
    $('dlg-form').addEventListener('submit', (ev) => { ev.preventDefault(); if (dialogSubmit) dialogSubmit(); });
    $('dlg-cancel').addEventListener('click', () => $('dlg').close());
    $('dlg').addEventListener('close', () => { dialogSubmit = null; });
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && !$('dlg').open && S.selected) closeDetail();
    });
    $('auth-use').addEventListener('click', () => {
      const t = $('auth-token').value.trim();
      if (!t) return;
      Token.set(t);
      $('auth').hidden = true;
      Live.attempt = 0;
      connect();
    });
  }

  function main() {
    Token.fromUrl();
    wire();
    setInterval(tick, 1000);
    setInterval(refreshAges, 2000);
    setInterval(watchdog, 5000);
    connect();
  }

  /** For tests and benchmarks: the render figures, and a full redraw of the table (its ms). */
  window.VmrConsole = { stats: S.stats, renderTable, state: S };

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', main);
  else main();
})();
