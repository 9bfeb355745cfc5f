// `mzcache serve` through the official `openai` npm client, as an app would use it.
// Usage: node serve_openai.mjs BASE_URL API_KEY OPENAI_PACKAGE_DIR
//   BASE_URL e.g. http://127.0.0.1:PORT/v1; the server must require API_KEY.
// Exits 0 when every check passed, 1 (with the failed check on stderr) otherwise.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const [baseURL, apiKey, pkgDir] = process.argv.slice(2);
if (!baseURL || !apiKey || !pkgDir) {
  console.error('usage: node serve_openai.mjs BASE_URL API_KEY OPENAI_PACKAGE_DIR');
  process.exit(2);
}
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [pkgDir] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;

let failed = 0;
function check(ok, what) {
  if (ok) {
    console.log(`ok: ${what}`);
  } else {
    console.error(`FAILED: ${what}`);
    failed++;
  }
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check(ids.length === 1, `models.list gives the one model (${ids.join(',')})`);
const model = ids[0];

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Say something.' },
];
const r1 = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0 });
check(r1.object === 'chat.completion', 'non-streamed: object chat.completion');
check(typeof r1.choices[0].message.content === 'string', 'non-streamed: a message');
check(['stop', 'length'].includes(r1.choices[0].finish_reason), `finish_reason ${r1.choices[0].finish_reason}`);
check(r1.usage.prompt_tokens > 0 && r1.usage.completion_tokens > 0, 'usage counted');

// The next turn resends the history: the server continues the same conversation.
const turn2 = [...messages, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'More.' }];
const stream = await client.chat.completions.create({
  model, messages: turn2, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = '', finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices.length > 0) {
    text += chunk.choices[0].delta?.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
check(chunks >= 3, `streamed: ${chunks} chunks`);
check(finish === 'stop' || finish === 'length', `streamed: finish_reason ${finish}`);
check(usage && usage.prompt_tokens > r1.usage.prompt_tokens, 'streamed: usage chunk');
check(usage && usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1,
  `the resent history was not computed again (cached_tokens ${usage?.prompt_tokens_details?.cached_tokens}, turn 1 prompt ${r1.usage.prompt_tokens})`);

// logprobs, non-streamed and streamed: one entry per sampled token, the same figures both ways
// (greedy: the sampled token is the most likely one).
const lpReq = { model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 };
const lp1 = await client.chat.completions.create(lpReq);
const content = lp1.choices[0].logprobs?.content ?? [];
check(content.length === lp1.usage.completion_tokens, `logprobs: ${content.length} entries for ${lp1.usage.completion_tokens} tokens`);
check(content.every((e) => e.logprob <= 0 && e.top_logprobs.length === 3 && Array.isArray(e.bytes) &&
  Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6 && e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob),
  'logprobs: <= 0, 3 alternatives, greedy picks the first');
const lpStream = await client.chat.completions.create({ ...lpReq, stream: true });
const streamed = [];
for await (const chunk of lpStream) for (const e of chunk.choices[0]?.logprobs?.content ?? []) streamed.push(e);
check(streamed.length === content.length && streamed.every((e, i) => e.token === content[i].token &&
  Math.abs(e.logprob - content[i].logprob) < 1e-4), `streamed logprobs equal the non-streamed (${streamed.length})`);
try {
  await client.chat.completions.create({ model, messages, max_tokens: 2, top_logprobs: 2 });
  check(false, 'top_logprobs without logprobs refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, `top_logprobs without logprobs: BadRequestError (${e.status})`);
}

const completion = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 });
check(completion.object === 'text_completion' && typeof completion.choices[0].text === 'string', 'completions.create');
const clp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0, logprobs: 2 });
check(clp.choices[0].logprobs?.token_logprobs?.length === clp.usage.completion_tokens &&
  clp.choices[0].logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1), 'completions logprobs (legacy form)');
// Streamed legacy logprobs: text_offset continues across chunks (each is the byte offset of its
// token in the whole completion), equal to the non-streamed body's.
const clpStream = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0,
  logprobs: 2, stream: true });
const offsets = [], toks = [];
for await (const chunk of clpStream) {
  const l = chunk.choices[0]?.logprobs;
  if (l) { offsets.push(...l.text_offset); toks.push(...l.tokens); }
}
const want = clp.choices[0].logprobs;
check(JSON.stringify(offsets) === JSON.stringify(want.text_offset) && JSON.stringify(toks) === JSON.stringify(want.tokens),
  `streamed completions text_offset continues across chunks (${JSON.stringify(offsets)} vs ${JSON.stringify(want.text_offset)})`);
check(want.text_offset.every((o, i) => i === 0 || o > want.text_offset[i - 1]) || want.tokens.some((t) => t === ''),
  `text_offset increases (${JSON.stringify(want.text_offset)})`);

// Errors arrive as the client's typed errors.
try {
  await client.chat.completions.create({ model, messages: [], max_tokens: 4 });
  check(false, 'empty messages refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, `empty messages: BadRequestError (${e.status})`);
}
const wrong = new OpenAI({ baseURL, apiKey: 'not-the-key', maxRetries: 0 });
try {
  await wrong.models.list();
  check(false, 'a wrong key is refused');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: AuthenticationError (${e.status})`);
}
console.log(`openai client: ${failed === 0 ? 'all checks passed' : failed + ' failed'}`);
process.exit(failed === 0 ? 0 : 1);
