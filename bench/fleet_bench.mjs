// The client side of bench/fleet_bench.sh (issue 47, docs/fleet.md "bench fleet"): conversations sent
// through a fleet's load balancer with the official `openai` npm client, one JSON line per request.
//
// Usage:
//   node fleet_bench.mjs many BASE_URL OPENAI_PKG_DIR SYSTEM_FILE N CONCURRENCY OUT.jsonl
//     N conversations (ids shared-1..N, each its X-Mz-Conversation), each one turn: the system prompt
//     in SYSTEM_FILE (text) and a short question of its own, greedy, 4 tokens; CONCURRENCY at once.
//   node fleet_bench.mjs load BASE_URL OPENAI_PKG_DIR FLEET_DIR CLIENTS DURATION_S KILL_AT_S SYSTEM_FILE OUT.jsonl
//     CLIENTS clients, each holding a conversation (system prompt + turns of 16 greedy tokens; a new
//     conversation after 8 turns) for DURATION_S seconds. At KILL_AT_S the fleet server that answered
//     the most requests so far (FLEET_DIR/server-I.port, .pid from scripts/fleet.sh) is killed with
//     SIGKILL; its index, pid and time go in a {"event":"kill"} line.
// Each request line: {t0, t1 (s since start), ok, error, conversation, turn, upstream, prompt_tokens,
// cached_tokens, ttft_s}. The client never retries (maxRetries 0): a failure counted is one nginx's own
// retry did not save. Progress on stderr every 10 requests (many) or 5 s (load). --help prints this.
import { createRequire } from 'node:module';
import { readFileSync, writeFileSync, appendFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const args = process.argv.slice(2);
const usage = () => readFileSync(new URL(import.meta.url), 'utf8').split('\n').slice(0, 17).map((l) => l.replace(/^\/\/ ?/, '')).join('\n');
if (args.length === 0 || args[0] === '--help' || args[0] === '-h') {
  console.log(usage());
  process.exit(args.length === 0 ? 2 : 0);
}
const [mode, baseURL, pkgDir] = args;
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [pkgDir] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 600000 });
const start = performance.now();
const now = () => (performance.now() - start) / 1000;

// One turn: its record (never throws).
async function turn(id, messages, maxTokens, turnIndex) {
  const t0 = now();
  try {
    const { data, response } = await client.chat.completions
      .create({ model: 'any', messages, max_tokens: maxTokens, temperature: 0 }, { headers: { 'X-Mz-Conversation': id } })
      .withResponse();
    return {
      t0, t1: now(), ok: true, conversation: id, turn: turnIndex,
      upstream: response.headers.get('x-mz-upstream') ?? '',
      prompt_tokens: data.usage?.prompt_tokens ?? -1,
      cached_tokens: data.usage?.prompt_tokens_details?.cached_tokens ?? -1,
      ttft_s: data.mzcache?.ttft_s ?? -1,
      text: data.choices[0].message.content ?? '',
    };
  } catch (e) {
    return { t0, t1: now(), ok: false, error: `${e?.status ?? ''} ${e?.message ?? e}`.trim(), conversation: id, turn: turnIndex };
  }
}

if (mode === 'many') {
  const [, , , systemFile, nArg, concArg, out] = args;
  const system = readFileSync(systemFile, 'utf8');
  const n = Number(nArg), conc = Number(concArg);
  writeFileSync(out, '');
  let next = 1, done = 0, failed = 0;
  async function worker() {
    while (next <= n) {
      const i = next++;
      const r = await turn(`shared-${i}`, [{ role: 'system', content: system },
        { role: 'user', content: `Question ${i}: name one thing about the number ${i * 7}.` }], 4, 1);
      delete r.text;
      appendFileSync(out, JSON.stringify(r) + '\n');
      done++;
      if (!r.ok) failed++;
      if (done % 10 === 0 || done === n) console.error(`[bench fleet] shared prompt: ${done}/${n} conversations, ${failed} failed, ${now().toFixed(1)} s`);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  process.exit(failed ? 1 : 0);
} else if (mode === 'load') {
  const [, , , fleetDir, clientsArg, durArg, killArg, systemFile, out] = args;
  const system = readFileSync(systemFile, 'utf8');
  const clients = Number(clientsArg), duration = Number(durArg), killAt = Number(killArg);
  writeFileSync(out, '');
  const servedBy = new Map();  // upstream "127.0.0.1:PORT" -> requests answered
  let requests = 0, failed = 0, killed = false;
  const log = (r) => appendFileSync(out, JSON.stringify(r) + '\n');
  function killBusiest() {
    let best = '', most = -1;
    for (const [up, c] of servedBy) if (c > most) { best = up; most = c; }
    const port = best.split(':').pop();
    for (let i = 1; i <= 64; i++) {
      let p;
      try { p = readFileSync(`${fleetDir}/server-${i}.port`, 'utf8').trim(); } catch { break; }
      if (p !== port) continue;
      const pid = Number(readFileSync(`${fleetDir}/server-${i}.pid`, 'utf8').trim());
      process.kill(pid, 'SIGKILL');
      log({ event: 'kill', t: now(), server: i, pid, upstream: best, served_before: most });
      console.error(`[bench fleet] kill -9 server ${i} (pid ${pid}, ${best}, ${most} requests so far) at ${now().toFixed(1)} s`);
      return;
    }
    console.error(`[bench fleet] error: no server listens on ${best}`);
    process.exit(1);
  }
  async function clientLoop(c) {
    let conv = 0;
    while (now() < duration) {
      conv++;
      const id = `load-${c}-${conv}`;
      const messages = [{ role: 'system', content: system }];
      for (let t = 1; t <= 8 && now() < duration; t++) {
        messages.push({ role: 'user', content: `Client ${c}, conversation ${conv}, turn ${t}: continue the list with item ${t * 3 + c}.` });
        const r = await turn(id, messages, 16, t);
        r.client = c;
        requests++;
        if (r.ok) servedBy.set(r.upstream, (servedBy.get(r.upstream) ?? 0) + 1); else failed++;
        const text = r.text ?? '';
        delete r.text;
        log(r);
        if (!r.ok) break;  // a failed turn: this conversation ends, the client starts another
        messages.push({ role: 'assistant', content: text });
      }
    }
  }
  const killer = (async () => {
    while (now() < killAt) await new Promise((res) => setTimeout(res, 100));
    killBusiest();
    killed = true;
  })();
  const progress = setInterval(() => console.error(`[bench fleet] load: ${now().toFixed(0)}/${duration} s, ${requests} requests, ${failed} failed${killed ? ', after the kill' : ''}`), 5000);
  await Promise.all(Array.from({ length: clients }, (_, c) => clientLoop(c + 1)));
  clearInterval(progress);
  await killer;
  process.exit(0);
} else {
  console.error(`unknown mode '${mode}'\n${usage()}`);
  process.exit(2);
}
