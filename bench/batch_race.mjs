#!/usr/bin/env node
// Races `mzcache serve` against llama.cpp's `llama-server` (same pinned source, same GGUF, same
// threads) with many users at once: N concurrent streaming chat completions through the official
// `openai` client (continuous batching on both sides).
//
//   node bench/batch_race.mjs --mzcache build/mzcache --llama-server PATH -m MODEL.gguf --openai DIR
//        [--streams 1,2,4,8] [--history-tokens 512] [--max-tokens 128] [--reps 2] [--threads 2]
//        [--ctx-per-seq 1024] [--kv q8_0|f16] [--long-prompt-tokens 0] [--systems mzcache,llama]
//        [--text FILE] [--api chat|completions|native] [--mzcache-base BIN] [-o DIR]
//   node bench/batch_race.mjs --check-native --llama-server PATH -m MODEL.gguf [-o DIR]
//
// --api completions sends the same text to /v1/completions (no chat template on either side).
// --api native: mzcache as with completions (the `openai` client on /v1/completions); llama-server
// through plain fetch on its own streamed `POST /completion` (prompt = the same text, n_predict =
// --max-tokens, temperature 0.8, seed i, ignore_eos; the server's default samplers either way) with
// `chat_parser` set to a PEG grammar that accepts anything (one epsilon parser). Why: llama-server
// (pinned source, tools/server) runs its chat reply parser on every completion task, whatever the
// endpoint (/v1/chat/completions, /v1/completions and /completion alike: server_response_reader
// updates each result's task_result_state, which calls common_chat_parse on the text so far), and
// the default content-only grammar fails on text that is not valid UTF-8, which random-weight
// models produce (a byte token that starts a character followed by one that does not continue it):
// the request then ends with "The model produced output that does not match the expected
// Content-only format" (its log: "common_chat_peg_parse: unparsed Content-only output"). The
// `chat_parser` request field (the serialized grammar the chat endpoint hands to its tasks) replaces
// that grammar for the request; an epsilon grammar parses nothing and never fails, and the native
// stream carries the raw text anyway. mzcache does no such parsing. The native stream's tokens:
// content = first chunk with text; completion tokens = the final chunk's tokens_predicted (what
// /v1 reports as usage.completion_tokens), prompt tokens = its tokens_evaluated; finish reason
// from stop_type (limit = length). --check-native shows both halves on the given llama-server (a
// reply forced to hold invalid UTF-8 fails without the grammar and streams whole with it; nothing
// timed) and exits 0 when they hold (ctest batch_race_native runs it and a tiny race). Long prefills (4k-token histories, 8 streams on 2 cores)
// exceed Node's fetch (undici) default 300 s headers and body timeouts: they are turned off here.
// Systems (alternated within every rep, A B A B ..., the first one alternating between reps), each
// started fresh for every (rep, streams level), so nothing is cached between levels:
//   mzcache  `mzcache serve --port 0 --port-file F --pool-dir <fresh> --ctx C --no-watch-pressure
//            --parallel max(N,8)` (+ `--kv-type q8_0`); its defaults otherwise.
//   llama    `llama-server -t T -tb T -np N -c N*C --no-webui --no-jinja` (+ `-ctk q8_0 -ctv q8_0 -fa on`);
//            continuous batching is its default.
//   base     with --mzcache-base BIN: the same `serve` command as mzcache from another binary (e.g.
//            main's, for an A/B of a change in the same run); added to the default systems
//            (mzcache,base,llama). Ratios are given for mzcache/llama, base/llama and mzcache/base.
// After each mzcache or base level, the server's own account is read from GET /v1/mzcache/pool
// before it stops: its batcher's steps, mean batch, tokens and prompt tokens, and the pool's
// persists (stored writes: one per finished turn is expected, more means writes mid-reply), and
// from GET /metrics its replies' seconds by part (mzcache_reply_seconds_total: decode calls,
// sampling, emit), in race.json (`server_report`) and race.md.
// C = --ctx-per-seq (default: 1024, raised to fit the history and the reply when they need more).
// At level N, N clients start at the same moment; client i sends one streamed chat completion
// (max_tokens --max-tokens, temperature 0.8, seed i, ignore_eos, stream_options.include_usage) whose
// user message is a distinct slice of the text (--text, default ~/.cache/mzcache/text/kjv.txt;
// deterministic pseudo-English when missing) of about --history-tokens tokens (1.3 tokens a word).
// Per level: aggregate tokens/s (sum of completion tokens / (last end - first start)); each
// stream's decode tokens/s ((tokens - 1) / (end - first token)) and the slowest one; TTFT (first
// streamed content) p50/p95; inter-token latency (gap between content chunks) p50/p95 over all
// streams; peak RSS of the server (VmRSS every 100 ms).
// --long-prompt-tokens L > 0 adds the ITL case on its own fresh server per rep and system (4 + 1
// slots: llama -np 5, mzcache --parallel 8; context raised to fit L): 4 streams decode; once each
// has its first token, a fifth client sends a prompt of about L tokens (max_tokens 8). Reported:
// the 4 streams' ITL p95 (and worst gap) without it, then, on the same server, with it.
// Writes race.json (every raw measurement), race.md and race.png (gnuplot) into -o DIR (default
// results/batch-race), server logs into DIR/logs. Progress on stderr. Exits non-zero on any failed
// request (its error printed), the servers killed (also on SIGINT).
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

function args() {
  const a = { streams: [1, 2, 4, 8], historyTokens: 512, maxTokens: 128, reps: 2, threads: 2, ctxPerSeq: 0,
              kv: 'f16', longPromptTokens: 0, api: 'chat', o: 'results/batch-race' };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i++) {
    const k = v[i], next = () => {
      if (i + 1 >= v.length) { console.error(`${k} needs a value (--help)`); process.exit(2); }
      return v[++i];
    };
    if (k === '--help' || k === '-h') {
      console.log(fs.readFileSync(new URL(import.meta.url)).toString().split('\n').filter(l => l.startsWith('//')).map(l => l.slice(3)).join('\n'));
      process.exit(0);
    } else if (k === '--mzcache') a.mzcache = next();
    else if (k === '--mzcache-base') a.mzcacheBase = next();
    else if (k === '--llama-server') a.llama = next();
    else if (k === '-m' || k === '--model') a.model = next();
    else if (k === '--openai') a.openai = next();
    else if (k === '--streams') a.streams = next().split(',').map(Number);
    else if (k === '--history-tokens') a.historyTokens = +next();
    else if (k === '--max-tokens') a.maxTokens = +next();
    else if (k === '--reps') a.reps = +next();
    else if (k === '--threads') a.threads = +next();
    else if (k === '--ctx-per-seq') a.ctxPerSeq = +next();
    else if (k === '--kv') a.kv = next();
    else if (k === '--long-prompt-tokens') a.longPromptTokens = +next();
    else if (k === '--systems') a.systems = next().split(',');
    else if (k === '--text') a.text = next();
    else if (k === '--api') a.api = next();
    else if (k === '-o') a.o = next();
    else if (k === '--check-native') a.checkNative = true;
    else { console.error(`unknown option ${k} (--help)`); process.exit(2); }
  }
  a.systems ??= a.mzcacheBase ? ['mzcache', 'base', 'llama'] : ['mzcache', 'llama'];
  const bad = (m) => { console.error(`${m} (--help)`); process.exit(2); };
  for (const s of a.systems) if (!['mzcache', 'llama', 'base'].includes(s)) bad(`unknown system ${s}: mzcache, base or llama`);
  if (a.systems.includes('base') && !a.mzcacheBase) bad('system base needs --mzcache-base BIN');
  if (!a.systems.includes('llama')) a.llama ??= '-';
  if (!a.systems.includes('mzcache')) a.mzcache ??= '-';
  if (a.checkNative) { a.mzcache ??= '-'; a.openai ??= '-'; }
  for (const k of ['mzcache', 'llama', 'model', 'openai']) if (!a[k]) bad(`--${k === 'llama' ? 'llama-server' : k} is required`);
  if (!['f16', 'q8_0'].includes(a.kv)) bad('--kv is f16 or q8_0');
  if (!['chat', 'completions', 'native'].includes(a.api)) bad('--api is chat, completions or native');
  if (!a.streams.length || a.streams.some(n => !Number.isInteger(n) || n < 1 || n > 64)) bad('--streams: integers in 1..64');
  for (const k of ['historyTokens', 'maxTokens', 'reps', 'threads']) if (!(Number.isInteger(a[k]) && a[k] >= 1)) bad(`bad ${k}`);
  if (!(Number.isInteger(a.longPromptTokens) && a.longPromptTokens >= 0)) bad('bad --long-prompt-tokens');
  // Context per sequence: the prompt (the 1.3 tokens/word estimate can be off by a fifth), the
  // chat template and the reply must fit.
  const need = roundUp(Math.ceil(a.historyTokens * 1.25) + 64 + a.maxTokens, 256);
  if (!a.ctxPerSeq) a.ctxPerSeq = Math.max(1024, need);
  else if (a.ctxPerSeq < need) console.error(`[batch] warning: --ctx-per-seq ${a.ctxPerSeq} may not hold ~${a.historyTokens} prompt + ${a.maxTokens} reply tokens (${need} would)`);
  a.ctxItl = Math.max(a.ctxPerSeq, roundUp(Math.ceil(a.longPromptTokens * 1.25) + 64 + 8, 256));
  a.text ??= path.join(os.homedir(), '.cache/mzcache/text/kjv.txt');
  return a;
}
function roundUp(x, m) { return Math.ceil(x / m) * m; }
const A = args();
const API = A.api;
await relaxFetchTimeouts();
const require = createRequire(import.meta.url);
const mod = A.checkNative ? null : await import(pathToFileURL(require.resolve('openai', { paths: [A.openai] })).href);
const OpenAI = mod && (mod.OpenAI ?? mod.default?.OpenAI ?? mod.default);
const log = (...m) => console.error('[batch]', ...m);
const sleep = ms => new Promise(r => setTimeout(r, ms));
const sleepUnref = ms => new Promise(r => setTimeout(r, ms).unref());  // a timeout that does not keep the process alive
const median = xs => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : NaN; };
// Percentile with linear interpolation between closest ranks (numpy's default).
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  const h = (s.length - 1) * p / 100, lo = Math.floor(h);
  return lo + 1 < s.length ? s[lo] + (h - lo) * (s[lo + 1] - s[lo]) : s[lo];
};
const procStatus = (pid, key) => { try { const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`${key}:\\s+(\\d+)`)); return m ? +m[1] / 1024 : NaN; } catch { return NaN; } };
const rssMiB = pid => procStatus(pid, 'VmRSS');

// ---- text: a distinct slice per client ----
const WORDS_PER_TOKEN = 1 / 1.3;
let words = [];
let textSource = A.text;
try { words = fs.readFileSync(A.text, 'utf8').split(/\s+/).filter(Boolean); } catch {}
if (words.length < 1000) {
  log(`no usable text at ${A.text}: deterministic pseudo-English instead`);
  textSource = 'pseudo-words';
  const vocab = ('the of and to in a is that for it as was with be by on not he this are or his from at which but have an ' +
    'they you were her she there been one all we their has would when if so no will more can other what who its into ' +
    'time only some could them then these two may first any new like our over such my very after also made many did ' +
    'before must through back years where much your way well down should because each just those people how too little ' +
    'state good man day both life long house world never under last right might while place hand small part great ' +
    'water old since against city light river stone morning field word king land night voice people bread door road').split(' ');
  let seed = 12345;
  const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
  for (let j = 0; j < 400000; j++) words.push(vocab[rnd() % vocab.length] + (rnd() % 17 === 0 ? '.' : ''));
}
const sliceWords = (start, count) => {
  const out = [];
  for (let j = 0; j < count; j++) out.push(words[(start + j) % words.length]);
  return out.join(' ');
};
const historyWords = Math.max(1, Math.round(A.historyTokens * WORDS_PER_TOKEN));
// Slice k of the history: level runs use k = client index (the same prompts for every system and
// rep); the ITL runs use other slices, so nothing a server has seen is asked again.
const historyText = k => sliceWords(k * historyWords, historyWords);
const longText = () => sliceWords(400 * historyWords, Math.max(1, Math.round(A.longPromptTokens * WORDS_PER_TOKEN)));

// ---- servers ----
const live = new Set();
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
  });
}
async function startServer(sys, slots, ctxPerSeq, logName) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mz-batch-'));
  const logFile = path.join(A.o, 'logs', `${logName}.log`);
  const fd = fs.openSync(logFile, 'w');
  let cmd, argv, port = 0, portFile = null;
  if (sys === 'mzcache' || sys === 'base') {
    portFile = path.join(tmp, 'port');
    cmd = sys === 'base' ? A.mzcacheBase : A.mzcache;
    argv = ['serve', '-m', A.model, '--port', '0', '--port-file', portFile, '--threads', String(A.threads),
            '--pool-dir', path.join(tmp, 'pool'), '--ctx', String(ctxPerSeq), '--no-watch-pressure',
            '--parallel', String(Math.max(slots, 8))];
    if (A.kv === 'q8_0') argv.push('--kv-type', 'q8_0');
  } else {
    port = await freePort();
    cmd = A.llama;
    argv = ['-m', A.model, '--host', '127.0.0.1', '--port', String(port), '-t', String(A.threads), '-tb', String(A.threads),
            '-np', String(slots), '-c', String(slots * ctxPerSeq), '--no-webui',
            // The random-weight model's output is not valid Qwen3 thinking/tool-call syntax: its jinja
            // chat parser fails such replies ("does not match the expected peg-native format", seen at
            // 8 streams); the built-in template renders the same chat without that parser.
            '--no-jinja'];
    if (A.kv === 'q8_0') argv.push('-ctk', 'q8_0', '-ctv', 'q8_0', '-fa', 'on');
  }
  const t0 = performance.now();
  const p = spawn(cmd, argv, { stdio: ['ignore', fd, fd] });
  fs.closeSync(fd);
  const s = { sys, p, t0, port, portFile, tmp, logFile, cmdline: [cmd, ...argv].join(' ') };
  live.add(s);
  p.on('exit', () => live.delete(s));
  p.on('error', e => { s.spawnError = e.message; });
  return s;
}
const logTail = s => { try { return fs.readFileSync(s.logFile, 'utf8').slice(-3000); } catch { return ''; } };
async function waitReady(s) {
  for (let i = 0; i < 3000; i++) {
    if (s.spawnError) throw new Error(`${s.sys} could not start: ${s.spawnError}`);
    if (s.p.exitCode !== null || s.p.signalCode !== null) throw new Error(`${s.sys} exited (${s.p.exitCode ?? s.p.signalCode}):\n${logTail(s)}`);
    if (!s.port && s.portFile && fs.existsSync(s.portFile)) s.port = +fs.readFileSync(s.portFile, 'utf8').trim() || 0;
    if (s.port) {
      try { const r = await fetch(`http://127.0.0.1:${s.port}/health`); if (r.status === 200) return (performance.now() - s.t0) / 1000; } catch {}
    }
    await sleep(100);
  }
  throw new Error(`${s.sys} not ready in 300 s:\n${logTail(s)}`);
}
async function stopServer(s) {
  if (s.p.exitCode === null && s.p.signalCode === null) {
    const done = new Promise(r => s.p.once('exit', r));
    s.p.kill('SIGTERM');
    await Promise.race([done, sleepUnref(30000)]);
    if (s.p.exitCode === null && s.p.signalCode === null) { s.p.kill('SIGKILL'); await Promise.race([done, sleepUnref(5000)]); }
  }
  live.delete(s);
  fs.rmSync(s.tmp, { recursive: true, force: true });
}
function killAll() {
  for (const s of live) {
    try { s.p.kill('SIGKILL'); } catch {}
    try { fs.rmSync(s.tmp, { recursive: true, force: true }); } catch {}
  }
  live.clear();
}
process.on('exit', killAll);
process.on('SIGINT', () => { log('interrupted: killing the servers'); killAll(); process.exit(130); });
process.on('SIGTERM', () => { killAll(); process.exit(143); });
async function fail(e) {
  console.error(`[batch] FAILED: ${e?.stack ?? e}`);
  killAll();
  process.exit(1);
}

// Samples the server's RSS every 100 ms until stopped; returns the peak.
function rssSampler(pid) {
  let peak = rssMiB(pid);
  const t = setInterval(() => { const r = rssMiB(pid); if (r > peak || Number.isNaN(peak)) peak = r; }, 100);
  return () => { clearInterval(t); const r = rssMiB(pid); if (r > peak) peak = r; return peak; };
}

// ---- one streamed request ----
// API (chat, completions or native) is A.api, set at start.
// Node's fetch (undici) gives up on a response whose headers or next body bytes take more than
// 300 s: a long prefill behind other streams' prompts does. Its global dispatcher is replaced by
// one of the same class without those timeouts (Node exposes no Agent constructor of its own).
async function relaxFetchTimeouts() {
  const sym = Symbol.for('undici.globalDispatcher.1');
  if (!globalThis[sym]) { try { await fetch('http://127.0.0.1:9/'); } catch { /* only to make the dispatcher */ } }
  const d = globalThis[sym];
  if (!d) { console.error('[batch] warning: could not lift fetch timeouts (300 s)'); return; }
  globalThis[sym] = new d.constructor({ headersTimeout: 0, bodyTimeout: 0 });
}
// llama-server's request field `chat_parser` (a serialized PEG arena, see --api native): one epsilon
// parser as the root, which matches the empty string and so never fails on any reply.
const NO_PARSE = JSON.stringify({ parsers: [{ type: 'epsilon' }], rules: {}, root: 0 });
// llama-server's native streamed completion: POST /completion, server-sent events `data: {json}`
// (a line `:` alone is a keep-alive ping); yields each event's object; throws on an HTTP error or
// an `error` event (e.g. a failing reply parse), and when the stream ends without the final
// `stop: true` event.
async function* nativeCompletion(port, body) {
  const r = await fetch(`http://127.0.0.1:${port}/completion`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`llama-server /completion: HTTP ${r.status}: ${(await r.text()).slice(0, 500)}`);
  const dec = new TextDecoder();
  let buf = '', done = false;
  for await (const bytes of r.body) {
    buf += dec.decode(bytes, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data:')) continue;  // pings (`:`) and other fields
        const data = line.slice(5).trim();
        if (data === '[DONE]') continue;
        const o = JSON.parse(data);
        if (o.error) throw new Error(`llama-server /completion: ${JSON.stringify(o.error).slice(0, 500)}`);
        if (o.stop) done = true;
        yield o;
      }
    }
  }
  if (!done) throw new Error('llama-server /completion: the stream ended without its final event');
}
// Times in seconds from `base` (the level's start).
async function stream(s, i, content, maxTokens, base, onFirst) {
  const t0 = performance.now();
  const rec = { client: i, start_s: (t0 - base) / 1000, ttft_s: NaN, chunk_s: [], end_s: NaN,
                completion_tokens: null, prompt_tokens: null, content_chunks: 0, finish_reason: null, chars: 0 };
  const onText = d => {
    if (typeof d !== 'string' || d.length === 0) return;
    const now = performance.now();
    if (Number.isNaN(rec.ttft_s)) { rec.ttft_s = (now - t0) / 1000; onFirst?.(); }
    rec.chunk_s.push((now - base) / 1000);
    rec.content_chunks++;
    rec.chars += d.length;
  };
  if (API === 'native' && s.sys === 'llama') {
    rec.api = 'native /completion';
    for await (const ch of nativeCompletion(s.port, { prompt: content, n_predict: maxTokens, temperature: 0.8, seed: i,
                                                      stream: true, ignore_eos: true, chat_parser: NO_PARSE })) {
      onText(ch.content);
      if (ch.stop) {
        rec.completion_tokens = ch.tokens_predicted ?? null;
        rec.prompt_tokens = ch.tokens_evaluated ?? null;
        rec.finish_reason = ch.stop_type === 'limit' ? 'length' : ch.stop_type === 'none' ? null : 'stop';
        rec.server_timings = ch.timings;
      }
    }
  } else {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 1800000 });
    const req = { model: 'm', max_tokens: maxTokens, temperature: 0.8, seed: i,
                  stream: true, stream_options: { include_usage: true }, ignore_eos: true };
    const chat = API === 'chat';
    rec.api = chat ? '/v1/chat/completions' : '/v1/completions';
    if (chat) req.messages = [{ role: 'user', content }];
    else req.prompt = content;
    const st = chat ? await client.chat.completions.create(req) : await client.completions.create(req);
    for await (const ch of st) {
      const c = ch.choices?.[0];
      onText(chat ? c?.delta?.content : c?.text);
      if (c?.finish_reason) rec.finish_reason = c.finish_reason;
      if (ch.usage) { rec.completion_tokens = ch.usage.completion_tokens; rec.prompt_tokens = ch.usage.prompt_tokens; }
    }
  }
  rec.end_s = (performance.now() - base) / 1000;
  rec.usage_reported = rec.completion_tokens !== null;
  rec.tokens = rec.completion_tokens ?? rec.content_chunks;
  if (!(rec.tokens > 0) || Number.isNaN(rec.ttft_s))
    throw new Error(`${s.sys} client ${i}: no content streamed (finish_reason ${rec.finish_reason}, ${rec.tokens} tokens)`);
  rec.first_s = rec.start_s + rec.ttft_s;
  rec.decode_tok_s = rec.tokens > 1 && rec.end_s > rec.first_s ? (rec.tokens - 1) / (rec.end_s - rec.first_s) : NaN;
  rec.chunk_s = rec.chunk_s.map(x => +x.toFixed(6));
  return rec;
}
const gaps = r => r.chunk_s.slice(1).map((t, j) => t - r.chunk_s[j]);

function levelStats(recs) {
  const first = Math.min(...recs.map(r => r.start_s)), last = Math.max(...recs.map(r => r.end_s));
  const tokens = recs.reduce((x, r) => x + r.tokens, 0);
  const ttft = recs.map(r => r.ttft_s), itl = recs.flatMap(gaps);
  const dec = recs.map(r => r.decode_tok_s).filter(x => !Number.isNaN(x));
  return {
    completion_tokens: tokens, wall_s: last - first, aggregate_tok_s: tokens / (last - first),
    slowest_stream_tok_s: dec.length ? Math.min(...dec) : NaN, stream_tok_s_median: median(dec),
    ttft_p50_s: pct(ttft, 50), ttft_p95_s: pct(ttft, 95), itl_p50_s: pct(itl, 50), itl_p95_s: pct(itl, 95),
    itl_max_s: itl.length ? Math.max(...itl) : NaN, itl_n: itl.length,
    prompt_tokens_median: median(recs.map(r => r.prompt_tokens).filter(x => x !== null)),
    stopped_early: recs.filter(r => r.finish_reason && r.finish_reason !== 'length').length,
    usage_reported: recs.every(r => r.usage_reported),
  };
}

// ---- --check-native: the reason for --api native, checked on this llama-server ----
// One llama-server (1 slot, 2 threads); a token whose text ends inside a UTF-8 character (found
// through /tokenize with_pieces: its piece comes back as bytes) and the token " a" get logit_bias
// +100, sampled at temperature 4 with no top-k/top-p/min-p, so a reply of 12 tokens mixes them and
// may hold a started character followed by " a" (invalid UTF-8). For seeds 1..40 until one fails:
// the request without `chat_parser` must fail with an error event, then the same request (same
// seed, so the same tokens) with NO_PARSE must stream to its final event with all 12 tokens.
async function checkNative() {
  fs.mkdirSync(path.join(A.o, 'logs'), { recursive: true });
  const s = await startServer('llama', 1, 512, 'check-native');
  try {
    await waitReady(s);
    const post = async (route, body) => (await fetch(`http://127.0.0.1:${s.port}${route}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).json();
    const pieces = (await post('/tokenize', { content: '뷁 햏 쀍 𝔸 a', with_pieces: true })).tokens;
    const lead = b => b >= 0xc2 && b <= 0xf4;
    const cut = pieces.find(t => Array.isArray(t.piece) && lead(t.piece[t.piece.length - 1]));
    const a = pieces.find(t => t.piece === ' a');
    if (!cut || !a) throw new Error(`no token ending inside a character or no " a" in ${JSON.stringify(pieces)}`);
    const req = seed => ({ prompt: 'The king said', n_predict: 12, temperature: 4, top_k: 0, top_p: 1, min_p: 0, seed,
                           stream: true, ignore_eos: true, logit_bias: [[cut.id, 100], [a.id, 100]] });
    const run = async body => {
      let last = null;
      try { for await (const ch of nativeCompletion(s.port, body)) last = ch; } catch (e) { return { error: e.message }; }
      return { tokens: last?.tokens_predicted };
    };
    for (let seed = 1; seed <= 40; seed++) {
      const plain = await run(req(seed));
      if (!plain.error) continue;
      const fixed = await run({ ...req(seed), chat_parser: NO_PARSE });
      console.log(`seed ${seed} (tokens ${cut.id} ${JSON.stringify(cut.piece)} and ${a.id} " a"): without chat_parser: ${plain.error}`);
      console.log(`seed ${seed} with the epsilon chat_parser: ${fixed.error ?? `${fixed.tokens} tokens streamed to the final event`}`);
      if (fixed.error || fixed.tokens !== 12) throw new Error('the epsilon chat_parser did not let the reply through');
      return;
    }
    throw new Error('no seed in 1..40 made llama-server fail without chat_parser: --api native may no longer need its grammar');
  } finally { await stopServer(s); }
}
if (A.checkNative) {
  try { await checkNative(); } catch (e) { await fail(e); }
  console.log('check-native: ok');
  process.exit(0);
}

// ---- the race ----
function info(cmd, argv) {  // stdout and stderr of a short command, whatever its exit status
  const r = spawnSync(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'], timeout: 20000 });
  return `${r.stdout ?? ''}${r.stderr ?? ''}`;
}
const machine = { cpu: 'unknown', cores: os.cpus().length, date: new Date().toISOString(), kernel: os.release(), mem_total_mib: Math.round(os.totalmem() / 1048576) };
try { machine.cpu = execFileSync('sh', ['-c', "lscpu | sed -n 's/^Model name: *//p' | head -1"]).toString().trim() || 'unknown'; } catch {}
try { machine.cores = +execFileSync('sh', ['-c', "lscpu | sed -n 's/^CPU(s): *//p' | head -1"]).toString().trim() || machine.cores; } catch {}
const versions = {};
for (const [sys, bin] of [['mzcache', A.mzcache], ['base', A.mzcacheBase]]) {
  if (!A.systems.includes(sys)) continue;
  if (!fs.existsSync(bin)) await fail(`no mzcache binary at ${bin}`);
  const help = info(bin, ['serve', '--help']);
  if (A.kv === 'q8_0' && !help.includes('--kv-type')) await fail(`${bin} serve has no --kv-type (rebuild it)`);
}
if (A.systems.includes('llama')) {
  if (!fs.existsSync(A.llama)) await fail(`no llama-server at ${A.llama}`);
  versions.llama = info(A.llama, ['--version']).trim().split('\n').filter(l => /version|built/.test(l)).join('; ');
}
try { versions.repo = execFileSync('git', ['-C', path.dirname(new URL(import.meta.url).pathname), 'describe', '--always', '--dirty']).toString().trim(); } catch {}

fs.mkdirSync(path.join(A.o, 'logs'), { recursive: true });
const systems = A.systems;
const runs = [];   // one per (rep, streams level, system)
const itlRuns = [];  // one per (rep, system) when --long-prompt-tokens
const f3 = x => Number.isFinite(x) ? x.toFixed(3) : '-';
const f1 = x => Number.isFinite(x) ? x.toFixed(1) : '-';
log(`${systems.join(' vs ')}; streams ${A.streams.join(',')}; ~${A.historyTokens} history tokens (${historyWords} words of ${textSource}); ` +
    `${A.maxTokens} max tokens; ${A.reps} reps; ${A.threads} threads; ctx/seq ${A.ctxPerSeq}; KV ${A.kv}; machine ${machine.cpu}, ${machine.cores} cores`);

// An mzcache server's own account after a level (GET /v1/mzcache/pool): its batcher and the
// pool's stored writes; null when it cannot be read (an older binary without the batch object).
async function serverReport(s) {
  try {
    const j = await (await fetch(`http://127.0.0.1:${s.port}/v1/mzcache/pool`)).json();
    const b = j.batch ?? {};
    // Replies' time by part on the callers' threads (mzcache_reply_seconds_total, since session 37).
    const reply = {};
    try {
      const m = await (await fetch(`http://127.0.0.1:${s.port}/metrics`)).text();
      for (const [, part, v] of m.matchAll(/^mzcache_reply_seconds_total\{[^}]*part="(\w+)"[^}]*\} ([0-9.eE+-]+)$/gm)) reply[part] = +v;
    } catch {}
    return { steps: b.steps ?? null, mean_batch: b.mean_batch ?? null, max_batch: b.max_batch ?? null, tokens: b.tokens ?? null,
             prefill_tokens: b.prefill_tokens ?? null, persists: j.pool?.persists ?? null,
             reply_decode_s: reply.decode ?? null, reply_sample_s: reply.sample ?? null, reply_emit_s: reply.emit ?? null };
  } catch (e) { log(`${s.sys}: no /v1/mzcache/pool report (${e?.message ?? e})`); return null; }
}

async function runLevel(rep, N, sys) {
  const tag = `rep ${rep + 1}/${A.reps} N=${N} ${sys}`;
  log(`${tag}: start`);
  const s = await startServer(sys, N, A.ctxPerSeq, `${sys}-rep${rep + 1}-n${N}`);
  const load = await waitReady(s);
  log(`${tag}: ready in ${load.toFixed(2)} s (port ${s.port}, RSS ${rssMiB(s.p.pid).toFixed(0)} MiB)`);
  const rssIdle = rssMiB(s.p.pid);
  const stopRss = rssSampler(s.p.pid);
  const base = performance.now();
  let recs;
  try {
    recs = await Promise.all(Array.from({ length: N }, (_, i) => stream(s, i, historyText(i), A.maxTokens, base)));
  } catch (e) {
    stopRss();
    throw new Error(`${tag}: request failed: ${e?.message ?? e}\n--- server log tail (${s.logFile}) ---\n${logTail(s)}`);
  }
  const peak = stopRss();
  const hwm = procStatus(s.p.pid, 'VmHWM');
  const report = sys === 'llama' ? null : await serverReport(s);
  await stopServer(s);
  const st = levelStats(recs);
  log(`${tag}: aggregate ${f1(st.aggregate_tok_s)} tok/s, slowest stream ${f1(st.slowest_stream_tok_s)} tok/s, ` +
      `TTFT p50 ${f3(st.ttft_p50_s)} s p95 ${f3(st.ttft_p95_s)} s, ITL p95 ${f3(st.itl_p95_s)} s, peak RSS ${peak.toFixed(0)} MiB ` +
      `(${st.completion_tokens} tokens, prompt ~${st.prompt_tokens_median} tokens${st.stopped_early ? `, ${st.stopped_early} stopped early` : ''})`);
  if (report) log(`${tag}: server's account: ${report.steps} steps, mean batch ${f3(report.mean_batch)}, ` +
                  `${report.prefill_tokens} prompt tokens, ${report.persists} persists; replies' seconds (all streams): ` +
                  `decode ${f3(report.reply_decode_s)}, sample ${f3(report.reply_sample_s)}, emit ${f3(report.reply_emit_s)}`);
  runs.push({ rep, streams: N, system: sys, cmdline: s.cmdline, load_s: load, rss_idle_mib: rssIdle, peak_rss_mib: peak,
              vm_hwm_mib: hwm, ...st, server_report: report, per_stream: recs });
}

async function runItl(rep, sys) {
  const tag = `rep ${rep + 1}/${A.reps} ITL ${sys}`;
  log(`${tag}: start (4 streams + one ~${A.longPromptTokens}-token prompt; ctx/seq ${A.ctxItl})`);
  const s = await startServer(sys, 5, A.ctxItl, `${sys}-rep${rep + 1}-itl`);
  const load = await waitReady(s);
  log(`${tag}: ready in ${load.toFixed(2)} s`);
  const stopRss = rssSampler(s.p.pid);
  const out = { rep, system: sys, cmdline: s.cmdline, load_s: load };
  try {
    for (const withLong of [false, true]) {
      const base = performance.now();
      let firsts = 0, release;
      const allFirst = new Promise(r => { release = r; });
      const k0 = withLong ? 300 : 200;
      const ps = Array.from({ length: 4 }, (_, i) => stream(s, i, historyText(k0 + i), A.maxTokens, base, () => { if (++firsts === 4) release(); }));
      let long = null;
      if (withLong) {
        long = (async () => { await allFirst; return stream(s, 4, longText(), 8, base); })();
        long.catch(() => {});  // awaited below; a failure before then must not be an unhandled rejection
        // A stream failing before all have a first token would leave `allFirst` pending.
        Promise.allSettled(ps).then(() => release());
      }
      const recs = await Promise.all(ps);
      const lr = long ? await long : null;
      const itl = recs.flatMap(gaps);
      const r = { itl_p50_s: pct(itl, 50), itl_p95_s: pct(itl, 95), itl_max_s: itl.length ? Math.max(...itl) : NaN,
                  aggregate_tok_s: levelStats(recs).aggregate_tok_s, per_stream: recs };
      if (lr) {
        // Gaps of the 4 streams that overlap the long prompt's prefill (its start to its first token).
        const a = lr.start_s, b = lr.first_s;
        const during = recs.flatMap(x => x.chunk_s.slice(1).map((t, j) => [x.chunk_s[j], t]).filter(([u, t]) => t > a && u < b).map(([u, t]) => t - u));
        Object.assign(r, { long_prompt: lr, long_prompt_tokens: lr.prompt_tokens, long_ttft_s: lr.ttft_s,
                           itl_during_prefill_p95_s: pct(during, 95), itl_during_prefill_max_s: during.length ? Math.max(...during) : NaN,
                           streams_done_before_long_first_token: recs.filter(x => x.end_s < b).length });
        if (r.streams_done_before_long_first_token) log(`${tag}: warning: ${r.streams_done_before_long_first_token} of the 4 streams ended before the long prompt's first token (raise --max-tokens)`);
      }
      out[withLong ? 'with_long' : 'without'] = r;
      log(`${tag} ${withLong ? 'with' : 'without'} the long prompt: 4 streams' ITL p95 ${f3(r.itl_p95_s)} s, max ${f3(r.itl_max_s)} s` +
          (lr ? `; long prompt ${lr.prompt_tokens ?? '?'} tokens, TTFT ${f3(lr.ttft_s)} s, ITL p95 during its prefill ${f3(r.itl_during_prefill_p95_s)} s` : ''));
    }
  } catch (e) {
    stopRss();
    throw new Error(`${tag}: request failed: ${e?.message ?? e}\n--- server log tail (${s.logFile}) ---\n${logTail(s)}`);
  }
  out.peak_rss_mib = stopRss();
  await stopServer(s);
  itlRuns.push(out);
}

try {
  for (let rep = 0; rep < A.reps; rep++) {
    const order = systems.map((_, i) => systems[(i + rep) % systems.length]);
    for (const N of A.streams) for (const sys of order) await runLevel(rep, N, sys);
    if (A.longPromptTokens > 0) for (const sys of order) await runItl(rep, sys);
  }
} catch (e) { await fail(e); }

// ---- summary ----
const stat = v => { const w = v.filter(Number.isFinite); return { median: median(w), min: w.length ? Math.min(...w) : NaN, max: w.length ? Math.max(...w) : NaN, n: w.length }; };
const metrics = ['aggregate_tok_s', 'slowest_stream_tok_s', 'ttft_p50_s', 'ttft_p95_s', 'itl_p50_s', 'itl_p95_s', 'peak_rss_mib'];
const ratioMetrics = ['aggregate_tok_s', 'slowest_stream_tok_s', 'peak_rss_mib'];
const ratioPairs = [['mzcache', 'llama'], ['base', 'llama'], ['mzcache', 'base']].filter(([a, b]) => systems.includes(a) && systems.includes(b));
const summary = A.streams.map(N => {
  const lv = { streams: N, systems: {} };
  for (const sys of systems) {
    const r = runs.filter(x => x.streams === N && x.system === sys);
    lv.systems[sys] = Object.fromEntries(metrics.map(m => [m, stat(r.map(x => x[m]))]));
    lv.systems[sys].prompt_tokens_median = median(r.map(x => x.prompt_tokens_median));
    lv.systems[sys].stopped_early = r.reduce((x, y) => x + y.stopped_early, 0);
  }
  for (const [sa, sb] of ratioPairs) {
    const key = `ratio_${sa}_over_${sb}`;
    lv[key] = {};
    for (const m of ratioMetrics) {
      const per = [];
      for (let rep = 0; rep < A.reps; rep++) {
        const a = runs.find(x => x.rep === rep && x.streams === N && x.system === sa);
        const b = runs.find(x => x.rep === rep && x.streams === N && x.system === sb);
        if (a && b) per.push(a[m] / b[m]);
      }
      lv[key][m] = { ...stat(per), per_rep: per };
    }
  }
  return lv;
});
let itlSummary = null;
if (itlRuns.length) {
  itlSummary = {};
  for (const sys of systems) {
    const r = itlRuns.filter(x => x.system === sys);
    itlSummary[sys] = {
      without_itl_p95_s: stat(r.map(x => x.without.itl_p95_s)), with_itl_p95_s: stat(r.map(x => x.with_long.itl_p95_s)),
      without_itl_max_s: stat(r.map(x => x.without.itl_max_s)), with_itl_max_s: stat(r.map(x => x.with_long.itl_max_s)),
      with_over_without_p95: stat(r.map(x => x.with_long.itl_p95_s / x.without.itl_p95_s)),
      long_ttft_s: stat(r.map(x => x.with_long.long_ttft_s)), long_prompt_tokens: median(r.map(x => x.with_long.long_prompt_tokens).filter(x => x !== null)),
      peak_rss_mib: stat(r.map(x => x.peak_rss_mib)),
    };
  }
}

const out = { machine, versions, config: { ...A, history_words: historyWords, text_source: textSource }, runs, itl_runs: itlRuns, summary, itl_summary: itlSummary };
fs.writeFileSync(path.join(A.o, 'race.json'), JSON.stringify(out, null, 1));

const fmt = (st, d, scale = 1) => Number.isFinite(st.median)
  ? `${(st.median * scale).toFixed(d)} (${(st.min * scale).toFixed(d)}-${(st.max * scale).toFixed(d)})` : '-';
let md = `# mzcache serve vs llama-server: concurrent streams (${machine.cpu}, ${machine.cores} cores, ${A.threads} threads)\n\n`;
md += `${machine.date}. Model \`${path.basename(A.model)}\`, KV ${A.kv}, ~${A.historyTokens}-token user message per stream ` +
      `(${historyWords} words of ${textSource === 'pseudo-words' ? 'pseudo-English' : path.basename(textSource)}), ` +
      `max_tokens ${A.maxTokens}, temperature 0.8, ${A.reps} reps alternated, fresh server per level, ctx ${A.ctxPerSeq} per stream.\n`;
md += `API: ${API === 'native' ? 'mzcache /v1/completions through the `openai` client; llama-server its native streamed /completion (plain fetch, ' +
      'reply parser replaced by a grammar that never fails: see `--help`)' : `/v1/${API === 'chat' ? 'chat/completions' : 'completions'} through the \`openai\` client on both`}.\n`;
md += `Values: median (min-max) across reps. Aggregate = all completion tokens / (last end - first start); ` +
      `slowest stream = min over streams of (tokens - 1) / (end - first token); TTFT = first streamed content; ` +
      `ITL = gap between content chunks, all streams; RSS = peak VmRSS sampled every 100 ms. ` +
      `Ratios: per rep, then median.\n`;
md += `Versions: mzcache repo ${versions.repo ?? '-'}; llama-server ${versions.llama || '-'}.\n`;
for (const lv of summary) {
  md += `\n## ${lv.streams} stream${lv.streams > 1 ? 's' : ''}\n\n`;
  md += '| system | aggregate tok/s | slowest stream tok/s | TTFT p50 s | TTFT p95 s | ITL p95 s | peak RSS MiB |\n|---|---|---|---|---|---|---|\n';
  for (const sys of systems) {
    const s = lv.systems[sys];
    md += `| ${sys} | ${fmt(s.aggregate_tok_s, 1)} | ${fmt(s.slowest_stream_tok_s, 1)} | ${fmt(s.ttft_p50_s, 3)} | ${fmt(s.ttft_p95_s, 3)} | ` +
          `${fmt(s.itl_p95_s, 3)} | ${fmt(s.peak_rss_mib, 0)} |\n`;
  }
  for (const [sa, sb] of ratioPairs) {
    const r = lv[`ratio_${sa}_over_${sb}`];
    md += `| **${sa}/${sb}** | ${fmt(r.aggregate_tok_s, 2)} | ${fmt(r.slowest_stream_tok_s, 2)} | | | | ${fmt(r.peak_rss_mib, 2)} |\n`;
  }
  for (const sys of systems.filter(x => x !== 'llama')) {
    const rr = runs.filter(x => x.streams === lv.streams && x.system === sys && x.server_report);
    if (rr.length) md += `\n${sys} server's account per rep (steps, mean batch, prompt tokens, persists; replies' decode / sample / emit s summed over streams): ` +
      rr.map(x => { const r = x.server_report; return `${r.steps}, ${f3(r.mean_batch)}, ${r.prefill_tokens}, ${r.persists}; ` +
        `${f3(r.reply_decode_s)} / ${f3(r.reply_sample_s)} / ${f3(r.reply_emit_s)}`; }).join('; ') + '.\n';
  }
  const notes = systems.filter(s => lv.systems[s].stopped_early).map(s => `${s}: ${lv.systems[s].stopped_early} stream(s) stopped before max_tokens`);
  md += `\nPrompt tokens per stream (server's count): ${systems.map(s => `${s} ${lv.systems[s].prompt_tokens_median ?? '-'}`).join(', ')}.` +
        (notes.length ? ` ${notes.join('; ')}.` : '') + '\n';
}
if (itlSummary) {
  md += `\n## Inter-token latency of 4 decoding streams while a ~${A.longPromptTokens}-token prompt arrives\n\n`;
  md += `Own server per rep (llama -np 5, mzcache --parallel 8; ctx ${A.ctxItl} per sequence); same server and rep: first without, then with the long prompt (sent once the 4 streams have their first token, max_tokens 8).\n\n`;
  md += '| system | ITL p95 without s | ITL p95 with s | with/without | worst gap without s | worst gap with s | long prompt TTFT s | peak RSS MiB |\n|---|---|---|---|---|---|---|---|\n';
  for (const sys of systems) {
    const s = itlSummary[sys];
    md += `| ${sys} | ${fmt(s.without_itl_p95_s, 3)} | ${fmt(s.with_itl_p95_s, 3)} | ${fmt(s.with_over_without_p95, 2)} | ${fmt(s.without_itl_max_s, 3)} | ` +
          `${fmt(s.with_itl_max_s, 3)} | ${fmt(s.long_ttft_s, 3)} | ${fmt(s.peak_rss_mib, 0)} |\n`;
  }
  md += `\nLong prompt tokens (server's count): ${systems.map(s => `${s} ${itlSummary[s].long_prompt_tokens ?? '-'}`).join(', ')}.\n`;
}
fs.writeFileSync(path.join(A.o, 'race.md'), md);

// race.png: aggregate tokens/s (and slowest stream's) against streams, one line per system, min-max bars.
const dat = systems.map(sys => `# ${sys}: streams agg_median agg_min agg_max slow_median slow_min slow_max\n` +
  summary.map(lv => { const s = lv.systems[sys]; return [lv.streams, s.aggregate_tok_s.median, s.aggregate_tok_s.min, s.aggregate_tok_s.max,
    s.slowest_stream_tok_s.median, s.slowest_stream_tok_s.min, s.slowest_stream_tok_s.max].join(' '); }).join('\n')).join('\n\n\n');
const datFile = path.join(A.o, 'race.dat');
fs.writeFileSync(datFile, dat + '\n');
let gnuplot = true;
try { execFileSync('sh', ['-c', 'command -v gnuplot'], { stdio: 'ignore' }); } catch { gnuplot = false; }
if (!gnuplot) log('gnuplot not found: race.png skipped');
else {
  const xt = A.streams.map(n => `"${n}" ${n}`).join(', ');
  const plots = col => systems.map((sys, i) => `'${datFile}' index ${i} using 1:${col}:${col + 1}:${col + 2} with yerrorlines lw 2 pt 7 title '${sys}'`).join(', ');
  try {
    execFileSync('gnuplot', ['-e', `set terminal pngcairo size 1000,480 noenhanced; set output '${path.join(A.o, 'race.png')}';
set multiplot layout 1,2 title 'mzcache serve vs llama-server: concurrent streams (${machine.cpu.replace(/'/g, '')}, ${A.threads} threads, KV ${A.kv})';
set logscale x 2; set xtics (${xt}); set xrange [${Math.min(...A.streams) / 1.3}:${Math.max(...A.streams) * 1.3}]; set yrange [0:*];
set grid; set key below horizontal; set xlabel 'concurrent streams';
set ylabel 'tokens/s'; set title 'aggregate tokens/s (median, min-max)';
plot ${plots(2)};
set title 'slowest stream tokens/s (median, min-max)';
plot ${plots(5)};
unset multiplot`], { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (e) { log(`gnuplot failed: ${e.stderr ?? e.message}`); }
}
console.log(md);
log(`wrote ${['race.json', 'race.md', gnuplot ? 'race.png' : null].filter(Boolean).map(f => path.join(A.o, f)).join(', ')}`);
