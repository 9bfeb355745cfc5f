// Tool calling through the official `openai` npm client, as an agent uses it: a request with tools
// gets tool_calls, the tool's result goes back as a role "tool" message, the final answer follows;
// non-streamed and streamed (tool_calls deltas). The server runs with scripted replies
// (--test-scripted-replies, tests/check_serve_tools.sh), in this order:
//   1 a call (non-streamed), 2 the answer, 3 content and two calls (streamed), 4 the answer
//   (streamed), 5 a malformed call (content, verbatim), 6 call text with tool_choice "none" (content).
// Usage: node serve_tools.mjs BASE_URL OPENAI_PACKAGE_DIR. Exits 0 when every check passed.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const [baseURL, pkgDir, mode] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [pkgDir] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;

let failed = 0;
function check(ok, what) {
  if (ok) console.log(`ok: ${what}`);
  else { console.error(`FAILED: ${what}`); failed++; }
}

const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const model = 'm';
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', description: 'The local time', parameters: { type: 'object', properties: {} } } },
];
const weather = (args) => JSON.stringify({ city: JSON.parse(args).city, temperature: 21 });

// --- mode "required" (random weights, no script): tool_choice "required" and a named function
// constrain the reply to one call whose arguments are JSON with the schema's required keys.
if (mode === 'required') {
  const checkCall = (c, name, what) => {
    const names = tools.map((t) => t.function.name);
    check(c && c.type === 'function' && /^call_/.test(c.id) && (name ? c.function.name === name : names.includes(c.function.name)),
      `${what}: a call of an offered tool (${JSON.stringify(c)})`);
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch (e) { /* checked below */ }
    check(args !== null && typeof args === 'object' && !Array.isArray(args), `${what}: arguments are a JSON object (${c?.function?.arguments})`);
    if (c.function.name === 'get_weather') check(typeof args?.city === 'string', `${what}: the required key city is a string`);
  };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather?' }], tools,
      tool_choice: 'required', seed });
    const c = r.choices[0];
    check(c.finish_reason === 'tool_calls' && c.message.tool_calls?.length === 1 && c.message.content === null,
      `required (seed ${seed}): finish_reason tool_calls, one call, no content (${JSON.stringify(c.message)})`);
    checkCall(c.message.tool_calls?.[0], null, `required (seed ${seed})`);
  }
  const named = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 0 });
  check(named.choices[0].finish_reason === 'tool_calls', `named: finish_reason tool_calls (${named.choices[0].finish_reason})`);
  checkCall(named.choices[0].message.tool_calls?.[0], 'get_weather', 'named get_weather, greedy');
  const s = await streamed([{ role: 'user', content: 'Time?' }], { tool_choice: { type: 'function', function: { name: 'get_time' } } });
  check(s.finish === 'tool_calls' && s.calls.length === 1 && s.content === '', `streamed named: one call (${JSON.stringify(s)})`);
  checkCall(s.calls[0], 'get_time', 'streamed named get_time');
  const s2 = await streamed([{ role: 'user', content: 'Anything.' }], { tool_choice: 'required', seed: 7 });
  check(s2.finish === 'tool_calls' && s2.calls.length === 1, `streamed required: one call (${JSON.stringify(s2)})`);
  checkCall(s2.calls[0], null, 'streamed required');
  if (failed) { console.error(`${failed} check(s) failed`); process.exit(1); }
  console.log('all required-tool checks passed');
  process.exit(0);
}

// --- mode "schema" (random weights, no script): an agent's schema (optional keys, nested objects,
// arrays of strings and of objects, numbers, integers, booleans, null, enums of strings, a nullable
// string) under tool_choice "required" and named, streamed and not: every call's arguments must be
// valid for it (validate() below: this test's own reading of docs/server.md's rules); then the call
// and a tool result go back and the conversation continues.
if (mode === 'schema') {
  const edit = { type: 'function', function: { name: 'edit_file', description: 'Edit a file',
    parameters: { type: 'object', properties: {
      path: { type: 'string', minLength: 1, maxLength: 24 },
      scale: { type: 'number' },
      mode: { type: 'string', enum: ['append', 'overwrite'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 },
      edits: { type: 'array', minItems: 1, maxItems: 2, items: { type: 'object', properties: {
        line: { type: 'integer' }, text: { type: ['string', 'null'], maxLength: 16 }, done: { type: 'boolean' } },
        required: ['line'] } },
      opts: { type: 'object', properties: { dry: { type: 'boolean' }, level: { type: 'null' } } } },
      required: ['path', 'edits'] } } };
  const schemaTools = [edit, tools[0]];
  const validate = (v, s, at) => {
    if (s.enum) { if (!s.enum.includes(v)) throw new Error(`${at}: ${JSON.stringify(v)} not in enum`); return; }
    if (Array.isArray(s.type)) {
      const errs = [];
      for (const t of s.type) { try { validate(v, { ...s, type: t }, at); return; } catch (e) { errs.push(e.message); } }
      throw new Error(errs.join('; '));
    }
    const type = s.type ?? 'string';
    const ok = {
      string: () => typeof v === 'string' && [...v].length <= (s.maxLength ?? 128) && [...v].length >= (s.minLength ?? 0) && !v.includes('<'),
      integer: () => Number.isInteger(v), number: () => typeof v === 'number', boolean: () => typeof v === 'boolean',
      null: () => v === null,
      array: () => Array.isArray(v) && v.length <= (s.maxItems ?? 8) && v.length >= (s.minItems ?? 0),
      object: () => v !== null && typeof v === 'object' && !Array.isArray(v),
    }[type];
    if (!ok || !ok()) throw new Error(`${at}: ${JSON.stringify(v)} is not a valid ${type}`);
    if (type === 'array') v.forEach((x, i) => validate(x, s.items, `${at}[${i}]`));
    if (type === 'object') {
      for (const k of s.required ?? []) if (!(k in v)) throw new Error(`${at}: required key ${k} missing`);
      for (const [k, x] of Object.entries(v)) {
        if (!(s.properties ?? {})[k]) throw new Error(`${at}: key ${k} not in the schema`);
        validate(x, s.properties[k], `${at}.${k}`);
      }
    }
  };
  const checkValid = (c, what) => {
    const t = schemaTools.find((x) => x.function.name === c?.function?.name);
    let err = t ? null : 'not an offered tool';
    if (t) { try { validate(JSON.parse(c.function.arguments), t.function.parameters, 'arguments'); } catch (e) { err = e.message; } }
    check(err === null, `${what}: ${c?.function?.name}(${c?.function?.arguments}) valid for its schema${err ? ': ' + err : ''}`);
  };
  const seen = new Set();
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const stream = seed % 2 === 0;
    const tool_choice = seed <= 4 ? { type: 'function', function: { name: 'edit_file' } } : 'required';
    const msgs = [{ role: 'user', content: 'Fix the file.' }];
    let call;
    if (stream) {
      const s = await streamed(msgs, { tools: schemaTools, tool_choice, seed, temperature: 1 });
      check(s.finish === 'tool_calls' && s.calls.length === 1, `schema seed ${seed} streamed: one call (${s.finish})`);
      call = s.calls[0];
    } else {
      const r = await client.chat.completions.create({ model, messages: msgs, tools: schemaTools, tool_choice, seed, temperature: 1 });
      check(r.choices[0].finish_reason === 'tool_calls' && r.choices[0].message.tool_calls?.length === 1,
        `schema seed ${seed}: one call (${r.choices[0].finish_reason})`);
      call = r.choices[0].message.tool_calls?.[0];
    }
    checkValid(call, `schema seed ${seed}${stream ? ' streamed' : ''}`);
    if (call?.function?.name === 'edit_file') for (const k of Object.keys(JSON.parse(call.function.arguments))) seen.add(k);
    if (seed === 1) {  // the agent loop goes on: the call and its result back, then an answer
      msgs.push({ role: 'assistant', content: null, tool_calls: [call] });
      msgs.push({ role: 'tool', tool_call_id: call.id, content: '{"ok": true}' });
      const r2 = await client.chat.completions.create({ model, messages: msgs, tools: schemaTools, max_tokens: 4 });
      check(r2.usage.prompt_tokens_details.cached_tokens > 0,
        `after the constrained call the conversation continues (${r2.usage.prompt_tokens_details.cached_tokens} cached)`);
    }
  }
  check(seen.has('path') && seen.has('edits'), `the required keys appear (${[...seen]})`);
  if (failed) { console.error(`${failed} check(s) failed`); process.exit(1); }
  console.log('all schema-constrained tool checks passed');
  process.exit(0);
}

// --- non-streamed flow
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const r1 = await client.chat.completions.create({ model, messages, tools });
const m1 = r1.choices[0].message;
check(r1.choices[0].finish_reason === 'tool_calls', `finish_reason tool_calls (${r1.choices[0].finish_reason})`);
check(m1.content === null, `no content beside the call (${JSON.stringify(m1.content)})`);
check(m1.tool_calls?.length === 1 && m1.tool_calls[0].type === 'function' && m1.tool_calls[0].function.name === 'get_weather',
  `one get_weather call (${JSON.stringify(m1.tool_calls)})`);
check(/^call_[0-9a-f]{16}$/.test(m1.tool_calls?.[0]?.id ?? ''), 'the call has an id');
check(JSON.parse(m1.tool_calls[0].function.arguments).city === 'Paris', 'arguments are JSON text with city Paris');
messages.push(m1);
messages.push({ role: 'tool', tool_call_id: m1.tool_calls[0].id, content: weather(m1.tool_calls[0].function.arguments) });
const r2 = await client.chat.completions.create({ model, messages, tools });
check(r2.choices[0].finish_reason === 'stop' && r2.choices[0].message.content === 'It is 21 degrees in Paris.',
  `the final answer after the tool result (${JSON.stringify(r2.choices[0].message)})`);
check(!r2.choices[0].message.tool_calls, 'no tool_calls in a plain answer');
check(r2.usage.prompt_tokens_details.cached_tokens > 0, `the conversation continues (${r2.usage.prompt_tokens_details.cached_tokens} cached)`);

// --- streamed flow
async function streamed(msgs, extra = {}) {
  const stream = await client.chat.completions.create({ model, messages: msgs, tools, stream: true, ...extra });
  let content = '', finish = null, chunks = 0;
  const calls = [];
  for await (const chunk of stream) {
    chunks++;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta?.content) content += c.delta.content;
    for (const d of c.delta?.tool_calls ?? []) {
      if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, function: { name: d.function?.name ?? '', arguments: '' } };
      calls[d.index].function.arguments += d.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, calls, finish, chunks };
}
const smsgs = [{ role: 'user', content: 'Weather and time in Paris?' }];
const s1 = await streamed(smsgs);
check(s1.finish === 'tool_calls', `streamed: finish_reason tool_calls (${s1.finish})`);
check(s1.content === 'Checking.', `streamed: the content before the calls (${JSON.stringify(s1.content)})`);
check(s1.calls.length === 2 && s1.calls[0].function.name === 'get_weather' && s1.calls[1].function.name === 'get_time',
  `streamed: two calls by index (${JSON.stringify(s1.calls)})`);
check(s1.calls.every((c) => c.type === 'function' && /^call_/.test(c.id)), 'streamed: ids and type');
check(JSON.parse(s1.calls[0].function.arguments).city === 'Paris' && s1.calls[1].function.arguments === '{}',
  'streamed: arguments');
smsgs.push({ role: 'assistant', content: s1.content, tool_calls: s1.calls });
smsgs.push({ role: 'tool', tool_call_id: s1.calls[0].id, content: weather(s1.calls[0].function.arguments) });
smsgs.push({ role: 'tool', tool_call_id: s1.calls[1].id, content: '12:00' });
const s2 = await streamed(smsgs);
check(s2.finish === 'stop' && s2.content === 'Done: 21 degrees at 12:00.' && s2.calls.length === 0,
  `streamed: the final answer (${JSON.stringify(s2)})`);

// --- malformed call text is content, never dropped
const r5 = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], tools });
check(r5.choices[0].finish_reason === 'stop' && r5.choices[0].message.content === '<tool_call>\nnot json\n</tool_call>' &&
  !r5.choices[0].message.tool_calls, `a malformed call is content (${JSON.stringify(r5.choices[0].message)})`);
// --- tool_choice "none": the reply is not read for calls
const r6 = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'y' }], tools, tool_choice: 'none' });
check(r6.choices[0].finish_reason === 'stop' && r6.choices[0].message.content.includes('<tool_call>') &&
  !r6.choices[0].message.tool_calls, 'tool_choice none: call text stays content');

// --- a bad tools field is a typed 400 naming it
try {
  await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'z' }], tools: [{ type: 'function', function: { name: 'a b' } }] });
  check(false, 'bad tool name refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'tools[0].function.name', `bad tool name: 400 (${e.param})`);
}

if (failed) { console.error(`${failed} check(s) failed`); process.exit(1); }
console.log('all tool checks passed');
