#!/usr/bin/env node
// Races `mzcache serve` against llama.cpp's `llama-server` (same pinned source, same GGUF, same
// threads) through the official `openai` client: many conversations with long histories, then the
// memory is asked back, then every user returns; then a kill -9 and a restart.
//
//   node bench/serve_race.mjs --mzcache build/mzcache --llama-server PATH -m MODEL.gguf
//        [--conversations 4] [--history-words 1200] [--reps 2] [--threads 2] [-o DIR]
//        [--openai DIR] [--text FILE] [--systems mzcache,llama,llama-nocache,llama-slots]
//        [--mzcache-as NAME=PATH ...] [--trim-level 80] [--return-gap-ms 0]
//
// Systems (alternated in every rep, A B C A B C ...):
//   mzcache     `mzcache serve`; memory asked back with POST /v1/mzcache/trim {"level":80} (what an
//               app's onTrimMemory(COMPLETE) or the pressure watch does): the pool gives back its
//               KV and weights, keeping every conversation on storage.
//   llama       `llama-server --parallel 1` with its defaults (the prompt cache keeps other
//               conversations in RAM, --cache-ram); it has no way to give memory back.
//   llama-nocache  `llama-server --cache-ram 0`: what a runtime pays that forgets (re-prefill).
//   llama-slots `llama-server --parallel N -c N*ctx --no-cache-idle-slots` (N = --conversations):
//               configured for returning users, one slot (and its KV) per conversation.
//   NAME        with --mzcache-as NAME=PATH (repeatable): `mzcache serve` from another binary, run
//               exactly as mzcache (an A/B of two builds in the same run: --systems mzcache,NAME).
// --trim-level: the onTrimMemory level mzcache is asked at (default 80; 0: not asked, every return
// then finds its conversation in memory: the floor of a return). --return-gap-ms: a pause before
// each return after the first (default 0: back to back, each return beside the write-behind of the
// turn before it).
// mzcache's returns also record the response's "mzcache" object (the restore's figures and
// phases_ms, where the time to the first token went) and "timings"; race.md tabulates the phases'
// medians, the first return (weights back too) apart from the later ones. The 1-minute load average
// is recorded at the start and the end.
// Per system and rep: the RSS after the histories were built and after the memory was asked back,
// TTFT (first streamed content) of each user's return, and TTFT of the first return after kill -9
// and restart (model load reported separately). Writes race.json, race.md and race.png
// (gnuplot) into DIR. Progress on stderr.
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

function args() {
  const a = { conversations: 4, historyWords: 1200, reps: 2, threads: 2, o: 'results/serve-race', ctx: 8192, alt: {}, trimLevel: 80, returnGapMs: 0 };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i++) {
    const k = v[i], next = () => v[++i];
    if (k === '--help' || k === '-h') {
      console.log(fs.readFileSync(new URL(import.meta.url)).toString().split('\n').filter(l => l.startsWith('//')).map(l => l.slice(3)).join('\n'));
      process.exit(0);
    } else if (k === '--mzcache') a.mzcache = next();
    else if (k === '--llama-server') a.llama = next();
    else if (k === '-m' || k === '--model') a.model = next();
    else if (k === '--conversations') a.conversations = +next();
    else if (k === '--history-words') a.historyWords = +next();
    else if (k === '--reps') a.reps = +next();
    else if (k === '--threads') a.threads = +next();
    else if (k === '-o') a.o = next();
    else if (k === '--openai') a.openai = next();
    else if (k === '--text') a.text = next();
    else if (k === '--systems') a.systems = next().split(',');
    else if (k === '--mzcache-as') {
      const [name, ...rest] = (next() ?? '').split('=');
      if (!name || !rest.length || ['mzcache', 'llama', 'llama-nocache', 'llama-slots'].includes(name)) {
        console.error('--mzcache-as needs NAME=PATH, NAME not a built-in system (--help)'); process.exit(2);
      }
      a.alt[name] = rest.join('=');
    } else if (k === '--trim-level') a.trimLevel = +next();
    else if (k === '--return-gap-ms') a.returnGapMs = +next();
    else { console.error(`unknown option ${k} (--help)`); process.exit(2); }
  }
  a.systems ??= ['mzcache', 'llama', 'llama-nocache'];
  if (!a.systems.some(x => x.startsWith('llama'))) a.llama ??= '-';
  for (const x of a.systems)
    if (!['mzcache', 'llama', 'llama-nocache', 'llama-slots'].includes(x) && !a.alt[x]) {
      console.error(`unknown system ${x} (--help)`); process.exit(2);
    }
  for (const k of ['mzcache', 'llama', 'model', 'openai']) if (!a[k]) { console.error(`--${k === 'llama' ? 'llama-server' : k} is required (--help)`); process.exit(2); }
  a.text ??= path.join(os.homedir(), '.cache/mzcache/text/kjv.txt');
  return a;
}
const A = args();
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [A.openai] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;
const log = (...m) => console.error('[race]', ...m);
const sleep = ms => new Promise(r => setTimeout(r, ms));
const median = xs => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : NaN; };
const isMz = sys => sys === 'mzcache' || A.alt[sys] !== undefined;
const load1m = () => { try { return +fs.readFileSync('/proc/loadavg', 'utf8').split(' ')[0]; } catch { return NaN; } };
const rssMiB = pid => { try { const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/); return m ? +m[1] / 1024 : NaN; } catch { return NaN; } };

const words = fs.readFileSync(A.text, 'utf8').split(/\s+/).filter(Boolean);
const system = 'You are a careful reader. Answer in one short sentence.';
const histories = Array.from({ length: A.conversations }, (_, c) => words.slice(c * A.historyWords, (c + 1) * A.historyWords).join(' '));

let port = 18700 + (process.pid % 500);
function startServer(sys, poolDir) {
  port++;
  const common = ['-m', A.model, '-t', String(A.threads), '--port', String(port), '--host', '127.0.0.1'];
  let cmd, argv;
  if (isMz(sys)) {
    cmd = A.alt[sys] ?? A.mzcache;
    argv = ['serve', ...common, '-c', String(A.ctx), '--pool-dir', poolDir, '--no-watch-pressure', '--max-tokens', '64'];
  } else if (sys === 'llama-slots') {
    // Configured for returning users: one slot per conversation, each with the whole context
    // (-c is split among the slots), so a returning user's prompt matches its own slot's KV; idle
    // slots are not moved to the prompt cache. It holds every conversation's KV for its whole
    // context from the start.
    cmd = A.llama;
    argv = [...common, '-c', String(A.ctx * A.conversations), '--parallel', String(A.conversations),
            '--no-cache-idle-slots', '--no-warmup'];
  } else {
    cmd = A.llama;
    argv = [...common, '-c', String(A.ctx), '--parallel', '1', '--no-warmup'];
    if (sys === 'llama-nocache') argv.push('--cache-ram', '0');
  }
  const t0 = performance.now();
  const p = spawn(cmd, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', d => { err = (err + d).slice(-4000); });
  return { p, t0, port, err: () => err };
}
async function waitReady(s) {
  for (let i = 0; i < 1200; i++) {
    if (s.p.exitCode !== null) throw new Error(`server exited: ${s.err()}`);
    try { const r = await fetch(`http://127.0.0.1:${s.port}/health`); if (r.ok) return (performance.now() - s.t0) / 1000; } catch {}
    await sleep(100);
  }
  throw new Error('server not ready in 120 s');
}
async function stopServer(s, signal = 'SIGTERM') {
  if (s.p.exitCode !== null) return;
  const done = new Promise(r => s.p.once('exit', r));
  s.p.kill(signal);
  await Promise.race([done, sleep(30000)]);
  if (s.p.exitCode === null) s.p.kill('SIGKILL');
}
async function turn(client, messages, maxTokens) {
  const t0 = performance.now();
  let ttft = NaN, text = '', usage = null, mz = null, timings = null;
  const stream = await client.chat.completions.create({
    model: 'm', messages, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  for await (const ch of stream) {
    const d = ch.choices?.[0]?.delta?.content;
    if (d !== undefined && d !== null && Number.isNaN(ttft)) ttft = (performance.now() - t0) / 1000;
    if (d) text += d;
    if (ch.usage) usage = ch.usage;
    if (ch.mzcache) mz = ch.mzcache;
    if (ch.timings) timings = ch.timings;
  }
  return { ttft, text, usage, mz, timings };
}

const systems = A.systems;
const runs = [];
fs.mkdirSync(A.o, { recursive: true });
const loadStart = load1m();
log(`1-minute load average at the start: ${loadStart}`);
for (let rep = 0; rep < A.reps; rep++) {
  const order = systems.map((_, i) => systems[(i + rep) % systems.length]);
  for (const sys of order) {
    const poolDir = fs.mkdtempSync(path.join(os.tmpdir(), 'mz-race-'));
    log(`rep ${rep + 1}/${A.reps}: ${sys}`);
    let s = startServer(sys, poolDir);
    const load1 = await waitReady(s);
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });
    const convs = [];
    const first = [];
    for (let c = 0; c < A.conversations; c++) {
      const messages = [{ role: 'system', content: system }, { role: 'user', content: `${histories[c]}\n\nWhat is this about?` }];
      const r = await turn(client, messages, 8);
      first.push(r.ttft);
      convs.push([...messages, { role: 'assistant', content: r.text }]);
      log(`  ${sys} conversation ${c + 1}: ${r.usage?.prompt_tokens} prompt tokens, TTFT ${r.ttft.toFixed(3)} s`);
    }
    await sleep(1500);  // write-behind of the last turn
    const rssBuilt = rssMiB(s.p.pid);
    let freed = 0;
    if (isMz(sys) && A.trimLevel > 0) {
      const r = await fetch(`http://127.0.0.1:${s.port}/v1/mzcache/trim`, { method: 'POST', body: JSON.stringify({ level: A.trimLevel }) });
      freed = (await r.json()).freed / 1048576;
    }
    await sleep(500);
    const rssAfter = rssMiB(s.p.pid);
    const back = [], backInfo = [];
    // A seeded order of returns (every conversation once; another order in every rep).
    const order2 = [...Array(A.conversations).keys()];
    let seed = 7 + rep;
    for (let i = order2.length - 1; i > 0; i--) { seed = (seed * 1103515245 + 12345) % 2147483648; const j = seed % (i + 1); [order2[i], order2[j]] = [order2[j], order2[i]]; }
    for (let k = 0; k < A.conversations; k++) {
      const c = order2[k];
      if (k > 0 && A.returnGapMs > 0) await sleep(A.returnGapMs);
      const r = await turn(client, [...convs[c], { role: 'user', content: 'Say more.' }], 4);
      back.push(r.ttft);
      backInfo.push({ mzcache: r.mz, timings: r.timings });
      const ph = r.mz?.phases_ms ? ' phases ms ' + r.mz.phases_ms.map(([k2, v]) => `${k2} ${v.toFixed(1)}`).join(', ') : '';
      log(`  ${sys} return ${k + 1} (conversation ${c + 1}): TTFT ${r.ttft.toFixed(3)} s, cached ${r.usage?.prompt_tokens_details?.cached_tokens ?? '-'}${ph}`);
    }
    // kill -9 and restart: the first return after it. mzcache: once the pool reports every
    // conversation stored (write-behind done), so the figure is of a restore, not of a lost turn.
    if (isMz(sys)) {
      for (let i = 0; i < 300; i++) {
        const p = await (await fetch(`http://127.0.0.1:${s.port}/v1/mzcache/pool`)).json();
        if (p.conversations.every(c => c.stored_tokens === c.tokens && !c.busy)) break;
        await sleep(100);
      }
    }
    await stopServer(s, 'SIGKILL');
    s = startServer(sys, poolDir);
    const load2 = await waitReady(s);
    const client2 = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });
    const c = rep % A.conversations;
    const rr = await turn(client2, [...convs[c], { role: 'user', content: 'Say more.' }], 4);
    log(`  ${sys} after kill -9 + restart (load ${load2.toFixed(2)} s): TTFT ${rr.ttft.toFixed(3)} s, cached ${rr.usage?.prompt_tokens_details?.cached_tokens ?? '-'} of ${rr.usage?.prompt_tokens}`);
    await stopServer(s);
    fs.rmSync(poolDir, { recursive: true, force: true });
    runs.push({ rep, system: sys, load_s: load1, restart_cached_tokens: rr.usage?.prompt_tokens_details?.cached_tokens ?? null, first_ttft_s: first, rss_built_mib: rssBuilt, freed_mib: freed,
                rss_after_trim_mib: rssAfter, return_ttft_s: back, return_info: backInfo, restart_load_s: load2, restart_ttft_s: rr.ttft,
                restart_info: { mzcache: rr.mz, timings: rr.timings } });
  }
}

let cpu = 'unknown';
try { cpu = execFileSync('sh', ['-c', "lscpu | sed -n 's/^Model name: *//p'"]).toString().trim(); } catch {}
const summary = systems.map(sys => {
  const r = runs.filter(x => x.system === sys);
  const all = r.flatMap(x => x.return_ttft_s), rst = r.map(x => x.restart_ttft_s), first = r.flatMap(x => x.first_ttft_s);
  const stat = v => ({ median: median(v), min: Math.min(...v), max: Math.max(...v), n: v.length });
  return { system: sys, first_ttft_s: stat(first), return_ttft_s: stat(all), restart_ttft_s: stat(rst),
           rss_built_mib: median(r.map(x => x.rss_built_mib)), rss_after_trim_mib: median(r.map(x => x.rss_after_trim_mib)),
           restart_load_s: median(r.map(x => x.restart_load_s)) };
});
const loadEnd = load1m();
log(`1-minute load average at the end: ${loadEnd}`);
const out = { machine: { cpu, cores: os.cpus().length }, params: A, load1_start: loadStart, load1_end: loadEnd, runs, summary };
fs.writeFileSync(path.join(A.o, 'race.json'), JSON.stringify(out, null, 1));
const f = x => x.toFixed(3);
let md = `# mzcache serve vs llama-server (${cpu}, ${os.cpus().length} cores, ${A.threads} threads)\n\n`;
md += `${A.conversations} conversations of ~${A.historyWords} words each, ${A.reps} reps alternated; TTFT = first streamed content (openai client); memory asked back at onTrimMemory level ${A.trimLevel || 'none'}; ${A.returnGapMs ? `${A.returnGapMs} ms between returns` : 'returns back to back'}; 1-minute load average ${loadStart} at the start, ${loadEnd} at the end.\n\n`;
md += '| system | RSS after histories (MiB) | RSS after memory asked back (MiB) | TTFT turn 1 median (min-max) s | TTFT on return median (min-max) s | after kill -9: load s | after kill -9: TTFT s |\n|---|---|---|---|---|---|---|\n';
for (const s of summary)
  md += `| ${s.system} | ${s.rss_built_mib.toFixed(0)} | ${s.rss_after_trim_mib.toFixed(0)} | ${f(s.first_ttft_s.median)} (${f(s.first_ttft_s.min)}-${f(s.first_ttft_s.max)}) | ${f(s.return_ttft_s.median)} (${f(s.return_ttft_s.min)}-${f(s.return_ttft_s.max)}) | ${s.restart_load_s.toFixed(2)} | ${f(s.restart_ttft_s.median)} (${f(s.restart_ttft_s.min)}-${f(s.restart_ttft_s.max)}) |\n`;
/* Where mzcache's returns spent their time (the response's phases_ms): medians over the reps, the
   first return of each rep (its weights come back too) apart from the later ones. */
for (const sys of systems.filter(isMz)) {
  const r = runs.filter(x => x.system === sys);
  const groups = [['first return', r.map(x => x.return_info[0])], ['later returns', r.flatMap(x => x.return_info.slice(1))],
                  ['after kill -9', r.map(x => x.restart_info)]];
  const phase = (i, n) => (i?.mzcache?.phases_ms ?? []).find(([k]) => k === n)?.[1];
  const names = [...new Set(groups.flatMap(([, g]) => g.flatMap(i => (i?.mzcache?.phases_ms ?? []).map(([k]) => k))))];
  if (!names.length) continue;
  md += `\n${sys}: where the time to the first token went (server side, ms, medians; TTFT is the client's)\n\n| phase | ${groups.map(([n]) => n).join(' | ')} |\n|---|${groups.map(() => '---').join('|')}|\n`;
  const cell = (g, f) => { const v = g.map(f).filter(x => Number.isFinite(x)); return v.length ? median(v).toFixed(1) : '-'; };
  for (const n of names) md += `| ${n} | ${groups.map(([, g]) => cell(g, i => phase(i, n))).join(' | ')} |\n`;
  md += `| sum of the phases | ${groups.map(([, g]) => cell(g, i => (i?.mzcache?.phases_ms ?? []).reduce((a, [, v]) => a + v, 0) || NaN)).join(' | ')} |\n`;
  md += `| TTFT at the client | ${groups.map(([, g], k) => cell(k === 0 ? r.map(x => x.return_ttft_s[0]) : k === 1 ? r.flatMap(x => x.return_ttft_s.slice(1)) : r.map(x => x.restart_ttft_s), v => 1e3 * v)).join(' | ')} |\n`;
  md += `| restore: reload | ${groups.map(([, g]) => cell(g, i => 1e3 * i?.mzcache?.reload_s)).join(' | ')} |\n`;
  md += `| restore: compute waited | ${groups.map(([, g]) => cell(g, i => 1e3 * i?.mzcache?.wait_s)).join(' | ')} |\n`;
  md += `| restore: MiB from storage | ${groups.map(([, g]) => cell(g, i => i?.mzcache?.bytes_from_storage / 1048576)).join(' | ')} |\n`;
}
fs.writeFileSync(path.join(A.o, 'race.md'), md);
const dat = summary.map((s, i) => `${i} "${s.system}" ${s.return_ttft_s.median} ${s.restart_ttft_s.median} ${s.rss_after_trim_mib}`).join('\n');
fs.writeFileSync(path.join(A.o, 'race.dat'), dat + '\n');
try {
  execFileSync('gnuplot', ['-e', `set terminal pngcairo size 900,420; set output '${path.join(A.o, 'race.png')}';
set multiplot layout 1,2 title 'mzcache serve vs llama-server (${cpu.replace(/'/g, '')})';
set style data histograms; set style fill solid 0.8; set boxwidth 0.8; set yrange [0:*]; set key top left;
set ylabel 'seconds'; set title 'TTFT (median)';
plot '${path.join(A.o, 'race.dat')}' using 3:xtic(2) title 'on return', '' using 4 title 'after kill -9';
set ylabel 'MiB'; set title 'RSS after memory asked back';
plot '${path.join(A.o, 'race.dat')}' using 5:xtic(2) title 'RSS' lc rgb '#888888';
unset multiplot`]);
} catch (e) { log(`gnuplot failed: ${e.message}`); }
console.log(md);
