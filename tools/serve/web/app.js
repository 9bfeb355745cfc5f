// The page of `mzcache serve` (docs/server.md, "The page"): a streaming chat and the pool live.
// Plain JavaScript, no framework, no build step; served from the binary with a strict
// Content-Security-Policy (this origin only, no inline script or style). The API key, when the
// server needs one, is asked for once and kept in this tab's sessionStorage; it is sent only as
// `Authorization: Bearer`, never in a URL. The histories of the conversations this page started
// are kept in localStorage (the server keeps their KV; the chat API resends the history).
'use strict';

const $ = (id) => document.getElementById(id);
const POLL_MS = 500;
const TRIM_NAMES = { 5: 'RUNNING_MODERATE', 10: 'RUNNING_LOW', 15: 'RUNNING_CRITICAL', 20: 'UI_HIDDEN',
  40: 'BACKGROUND', 60: 'MODERATE', 80: 'COMPLETE' };

const state = {
  key: sessionStorage.getItem('mz.key') || '',
  needKey: false,
  histories: loadHistories(),  // id -> [{role, content}]
  selected: '',                // '' = a new conversation
  sending: false,
  statusSticky: false,         // see setStatus
  lastEventSeq: null,          // the newest event shown (null: none fetched yet)
  convIds: '',                 // the conversation list the select was built from
  answeredAt: {},              // id -> performance.now() when this page last finished a turn in it
  pool: null,
};

function loadHistories() {
  try {
    const h = JSON.parse(localStorage.getItem('mz.histories') || '{}');
    return h && typeof h === 'object' ? h : {};
  } catch (e) {
    return {};
  }
}
function saveHistories() { localStorage.setItem('mz.histories', JSON.stringify(state.histories)); }

function fmtBytes(n) {
  if (!Number.isFinite(n) || n <= 0) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${u[i]}`;
}
function fmtMs(s) { return `${(s * 1000).toFixed(s < 0.1 ? 1 : 0)} ms`; }
function fmtTime(ms) { return new Date(ms).toLocaleTimeString(); }
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
// An action's outcome (a trim, a forget, an answer, an error) stays on the
// status line until the next action; the poll's "live" only replaces a status
// that the poll itself or a transient step ("key set", "generating...") wrote.
function setStatus(text, error, sticky = true) {
  $('status').textContent = text;
  $('status').classList.toggle('error', !!error);
  state.statusSticky = sticky;
}

// ---- the API
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}
async function check(res) {
  if (res.ok) return res;
  let message = `HTTP ${res.status}`;
  try {
    const j = await res.json();
    if (j && j.error && j.error.message) message = j.error.message;
  } catch (e) { /* not JSON */ }
  if (res.status === 401) askKey(message);
  throw new ApiError(res.status, message);
}
async function api(method, path, body) {
  const res = await fetch(path, { method, headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  await check(res);
  return res.json();
}
function askKey(message) {
  state.needKey = true;
  $('key-form').hidden = false;
  setStatus(state.key ? `the key was refused: ${message}` : 'an API key is needed', true);
  $('key').focus();
}

// ---- the pool, polled
async function poll() {
  if (!state.needKey) {
    try {
      const asked = performance.now();
      render(await api('GET', '/v1/mzcache/pool'), asked);
      if (!state.sending && !state.statusSticky) setStatus('live', false, false);
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 401)) setStatus(`pool: ${e.message}`, true, false);
    }
  }
  setTimeout(poll, POLL_MS);
}

// `asked`: when the report was asked for (performance.now()); a conversation the page finished
// after that may be missing from it without being gone.
function render(p, asked) {
  state.pool = p;
  const pool = p.pool || {};
  $('t-budget').textContent = pool.memory_budget ? fmtBytes(pool.memory_budget) : 'none';
  $('t-memory').textContent = fmtBytes(pool.in_memory);
  $('t-rss').textContent = p.rss ? fmtBytes(p.rss) : 'unknown';
  $('t-weights').textContent = `${fmtBytes(pool.weights_resident)} of ${fmtBytes(pool.weights_total)}`;
  $('t-storage').textContent = fmtBytes(pool.kv_storage);
  $('t-stored').textContent = fmtBytes(pool.stored_bytes);
  // The weights: resident, and the rest left in the model file (read back when needed).
  const w = $('weights');
  const wt = pool.weights_total || 0, wr = pool.weights_resident || 0;
  w.dataset.resident = wr;
  w.dataset.storage = Math.max(0, wt - wr);
  const [wres, wsto] = w.querySelectorAll('.seg');
  wres.style.width = `${wt ? (100 * wr) / wt : 0}%`;
  wsto.style.width = `${wt ? (100 * (wt - wr)) / wt : 0}%`;
  w.querySelector('.figures').textContent = `${fmtBytes(wr)} in memory · ${fmtBytes(Math.max(0, wt - wr))} left in the model file`;
  renderModels(p.models || []);
  renderConversations(p.conversations || [], asked);
  renderTurns(p.turns || []);
  renderEvents(p.events || []);
}

// Several models (docs/server.md): a picker for the next message and a weights bar per model
// (resident, given back but in the page cache, given back and evicted); hidden with one model.
function renderModels(models) {
  const several = models.length > 1;
  for (const e of document.querySelectorAll('.models-only')) e.hidden = !several;
  if (!several) return;
  // The pool's report names each conversation's model; a conversation this page just started may
  // not be in a report yet, so the model its answer named (send) is kept until the report has it.
  const known = {};
  for (const c of (state.pool && state.pool.conversations) || []) known[c.id] = c.model;
  for (const [id, m] of Object.entries(state.convModel || {}))
    if (!(id in known) && state.histories[id]) known[id] = m;
  state.convModel = known;
  const pick = $('model-pick');
  const names = models.map((m) => m.id).join(' ');
  if (pick.dataset.names !== names) {
    const keep = pick.value;
    pick.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
    pick.dataset.names = names;
    if (keep) pick.value = keep;
  }
  const rows = models.map((m) => {
    const w = m.weights || {};
    const total = w.total || 0, cached = w.dropped_cached || 0, evicted = w.evicted || 0;
    const row = el('div', 'conv weights');
    row.dataset.model = m.id;
    row.dataset.resident = w.resident || 0;
    row.dataset.pageCache = cached;
    row.dataset.evicted = evicted;
    const bar = el('div', 'bar');
    for (const [cls, v, what] of [['resident', w.resident || 0, 'in memory'], ['compressed', cached, 'in the page cache'],
      ['storage', evicted, 'evicted']]) {
      const seg = el('div', `seg ${cls}`);
      seg.style.width = `${total ? (100 * v) / total : 0}%`;
      seg.title = `${what}: ${fmtBytes(v)}`;
      bar.append(seg);
    }
    row.append(el('span', 'name', m.id), bar, el('span', '', m.in_use ? 'in use' : ''),
      el('span', 'figures', `${fmtBytes(w.resident || 0)} in memory · ${fmtBytes(cached)} in the page cache · ` +
        `${fmtBytes(evicted)} evicted · ${m.conversations} conversations`));
    return row;
  });
  $('model-weights').replaceChildren(...rows);
}

function renderConversations(list, asked) {
  // Forget what the pool no longer has (deleted elsewhere, or by the disk budget), but not a
  // conversation answered while this report was on its way: a report asked for before the turn
  // ended may not list it yet.
  const ids = new Set(list.map((c) => c.id));
  const gone = (id) => !ids.has(id) && !state.sending && !((state.answeredAt[id] || 0) >= asked);
  let changed = false;
  for (const id of Object.keys(state.histories))
    if (gone(id)) {
      delete state.histories[id];
      changed = true;
    }
  if (changed) saveHistories();
  if (state.selected && gone(state.selected)) select('');

  const key = list.map((c) => c.id).join(' ') + '|' + Object.keys(state.histories).join(' ');
  if (key !== state.convIds) {
    state.convIds = key;
    const sel = $('conv');
    sel.replaceChildren(new Option('New conversation', ''));
    for (const c of list) {
      const mine = !!state.histories[c.id];
      const o = new Option(mine ? c.id : `${c.id} (started elsewhere)`, c.id);
      o.disabled = !mine;  // its messages are not on this page: continuing it would cut it
      sel.add(o);
    }
    sel.value = state.selected;
  }

  const box = $('convs');
  const max = Math.max(1, ...list.map((c) => c.kv_resident + c.kv_mem_compressed + c.kv_storage));
  const rows = [];
  for (const c of list) {
    const row = el('div', 'conv');
    row.dataset.id = c.id;
    row.dataset.tokens = c.tokens;
    row.dataset.resident = c.kv_resident;
    row.dataset.compressed = c.kv_mem_compressed;
    row.dataset.storage = c.kv_storage;
    if (c.id === state.selected) row.classList.add('selected');
    const name = el('span', 'name', c.id);
    name.title = c.id;
    const bar = el('div', 'bar');
    for (const [cls, v] of [['resident', c.kv_resident], ['compressed', c.kv_mem_compressed], ['storage', c.kv_storage]]) {
      const seg = el('div', `seg ${cls}`);
      seg.style.width = `${(100 * v) / max}%`;
      seg.title = `${cls}: ${fmtBytes(v)}`;
      bar.append(seg);
    }
    const forget = el('button', 'forget', 'forget');
    forget.type = 'button';
    forget.title = `delete ${c.id}: its memory, swap and stored file`;
    forget.addEventListener('click', () => forgetConversation(c.id));
    const fig = el('span', 'figures',
      `${c.tokens} tokens · ${fmtBytes(c.kv_resident)} in memory · ${fmtBytes(c.kv_mem_compressed)} compressed · ` +
      `${fmtBytes(c.kv_storage)} on storage${c.busy ? ' · busy' : ''}${c.open ? '' : ' · stored only'}` +
      `${c.model && !$('model-pick').hidden ? ` · ${c.model}` : ''}`);
    row.append(name, bar, forget, fig);
    rows.push(row);
  }
  if (!rows.length) rows.push(el('p', 'empty', 'No conversation yet: say something.'));
  box.replaceChildren(...rows);
}

function renderTurns(turns) {
  const body = $('turns');
  const rows = [];
  for (const t of turns.slice().reverse()) {
    const tr = el('tr', t.new_conversation ? 'first' : 'return');
    tr.dataset.seq = t.seq;
    tr.dataset.ttft = t.ttft_s;
    tr.dataset.cached = t.cached_tokens;
    tr.dataset.bytesFromStorage = t.bytes_from_storage;
    const id = el('td', 'id', t.conversation);
    tr.append(el('td', '', fmtTime(t.t)), id, el('td', '', fmtMs(t.ttft_s)),
      el('td', '', `${t.cached_tokens}/${t.prompt_tokens}`),
      el('td', '', t.new_conversation ? 'first turn' : `${t.units_restored} units`),
      el('td', '', fmtBytes(t.bytes_from_storage)));
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

function renderEvents(events) {
  const list = $('events');
  const newest = events.length ? events[events.length - 1].seq : 0;
  if (state.lastEventSeq === newest && list.childElementCount === events.length) return;
  const before = state.lastEventSeq === null ? newest : state.lastEventSeq;
  const items = [];
  for (const e of events.slice().reverse()) {
    const li = el('li', e.seq > before ? 'fresh' : '');
    li.dataset.seq = e.seq;
    li.dataset.kind = e.kind;
    li.dataset.bytes = e.bytes;
    const verb = e.kind === 'restore' ? 'brought back' : e.kind === 'error' ? 'failed' : 'gave back';
    li.textContent = `${fmtTime(e.t)} ${e.kind} (${e.detail}): ${verb} ${fmtBytes(e.bytes)}`;
    items.push(li);
  }
  if (!items.length) items.push(el('li', 'empty', 'none yet'));
  list.replaceChildren(...items);
  state.lastEventSeq = newest;
}

// ---- actions
async function trim() {
  const level = Number($('trim-level').value);
  $('trim').disabled = true;
  try {
    const asked = performance.now();
    const r = await api('POST', '/v1/mzcache/trim', { level });
    setStatus(`trim ${level} (${TRIM_NAMES[level]}): gave back ${fmtBytes(r.freed)}`);
    render(r, asked);
  } catch (e) {
    setStatus(`trim: ${e.message}`, true);
  } finally {
    $('trim').disabled = false;
  }
}

async function forgetConversation(id) {
  try {
    await api('DELETE', `/v1/mzcache/conversations/${encodeURIComponent(id)}`);
    delete state.histories[id];
    saveHistories();
    if (state.selected === id) select('');
    setStatus(`forgot ${id}`);
    const asked = performance.now();
    render(await api('GET', '/v1/mzcache/pool'), asked);
  } catch (e) {
    setStatus(`forget: ${e.message}`, true);
  }
}

function select(id) {
  state.selected = id;
  $('conv').value = id;
  // A conversation keeps its model: the picker follows it.
  const model = state.convModel && state.convModel[id];
  if (model) $('model-pick').value = model;
  const log = $('log');
  log.replaceChildren();
  for (const m of state.histories[id] || []) log.append(el('div', `msg ${m.role}`, m.content));
  log.scrollTop = log.scrollHeight;
}

function cachedTokens(usage) { return (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0; }

function turnInfo(usage, mz) {
  if (!mz) return '';
  const parts = [`TTFT ${fmtMs(mz.ttft_s)}`];
  if (usage) parts.push(`${cachedTokens(usage)} of ${usage.prompt_tokens} prompt tokens cached`);
  if (mz.units_restored) parts.push(`${mz.units_restored} units restored, ${fmtBytes(mz.bytes_from_storage)} from storage`);
  if (mz.new_conversation) parts.push('new conversation');
  return parts.join(' · ');
}

async function send(text) {
  if (state.sending || !text.trim()) return;
  state.sending = true;
  $('send').disabled = true;
  const id = state.selected;
  const messages = (state.histories[id] || []).concat([{ role: 'user', content: text }]);
  const log = $('log');
  log.append(el('div', 'msg user', text));
  const out = el('div', 'msg assistant streaming');
  const body = el('span', 'text', '');
  out.append(body);
  log.append(out);
  log.scrollTop = log.scrollHeight;
  setStatus('generating...', false, false);
  const req = { messages, stream: true, stream_options: { include_usage: true },
    max_tokens: Math.max(1, Number($('max-tokens').value) || 48) };
  if (id) req.conversation = id;
  if (!$('model-pick').hidden && $('model-pick').value) req.model = $('model-pick').value;
  let usage = null, mz = null, failed = null, answeredBy = req.model || null;
  try {
    const res = await check(await fetch('/v1/chat/completions', { method: 'POST', headers: headers(true),
      body: JSON.stringify(req), cache: 'no-store' }));
    const conv = res.headers.get('X-Mz-Conversation') || id;
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let done = false;
    while (!done) {
      const r = await reader.read();
      if (r.done) break;
      buf += r.value;
      let cut;
      while (!done && (cut = buf.search(/\r?\n\r?\n/)) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (!data) continue;
        if (data === '[DONE]') { done = true; break; }
        const j = JSON.parse(data);
        if (j.error) { failed = j.error.message || 'error'; continue; }
        const delta = j.choices && j.choices[0] && j.choices[0].delta;
        if (delta && delta.content) {
          body.textContent += delta.content;
          log.scrollTop = log.scrollHeight;
        }
        if (j.usage) usage = j.usage;
        if (j.mzcache) mz = j.mzcache;
        if (j.model) answeredBy = j.model;
      }
    }
    if (failed) throw new Error(failed);
    const content = body.textContent;
    state.histories[conv] = messages.concat([{ role: 'assistant', content }]);
    state.answeredAt[conv] = performance.now();
    if (conv !== id && id && state.histories[id]) delete state.histories[id];
    saveHistories();
    state.selected = conv;
    if (answeredBy) state.convModel = Object.assign(state.convModel || {}, { [conv]: answeredBy });
    state.convIds = '';  // the next poll rebuilds the select from the pool
    const sel = $('conv');
    if (![...sel.options].some((o) => o.value === conv)) sel.add(new Option(conv, conv));
    sel.value = conv;
    out.classList.remove('streaming');
    const info = el('span', 'info', turnInfo(usage, mz));
    if (mz) {
      out.dataset.ttft = mz.ttft_s;
      out.dataset.bytesFromStorage = mz.bytes_from_storage;
      out.dataset.unitsRestored = mz.units_restored;
    }
    if (usage) out.dataset.cached = cachedTokens(usage);
    out.dataset.conversation = conv;
    out.append(info);
    setStatus(`answered in ${conv}`);
  } catch (e) {
    out.classList.remove('streaming');
    out.classList.add('error');
    out.append(el('span', 'info', e.message));
    setStatus(`chat: ${e.message}`, true);
  } finally {
    out.classList.add('done');
    state.sending = false;
    $('send').disabled = false;
  }
}

// ---- wiring
$('key-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.key = $('key').value.trim();
  sessionStorage.setItem('mz.key', state.key);
  $('key').value = '';
  $('key-form').hidden = true;
  state.needKey = false;
  setStatus('key set', false, false);
  loadModel();
});
$('send-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('msg').value;
  $('msg').value = '';
  send(text);
});
$('msg').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('send-form').requestSubmit();
  }
});
$('conv').addEventListener('change', () => select($('conv').value));
$('trim').addEventListener('click', trim);

async function loadModel() {
  try {
    const m = await api('GET', '/v1/models');
    $('model').textContent = (m.data || []).map((x) => x.id).join(' · ');
  } catch (e) { /* 401: the key form is shown */ }
}
loadModel();
poll();
