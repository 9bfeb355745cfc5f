// One turn of a conversation through the official `openai` npm client, as an app behind a fleet's
// load balancer sends it (tests/check_fleet.sh): the whole history, plus the X-Mz-Conversation
// header that routes it (nginx hashes it) and names the conversation to continue.
// Usage: node fleet_openai.mjs BASE_URL OPENAI_PACKAGE_DIR CONVERSATION_ID MESSAGES_JSON_FILE [MAX_TOKENS]
//   CONVERSATION_ID '-': no X-Mz-Conversation header (a client that sends only the history: the
//   server finds its prefix by chain hash).
//   Greedy (temperature 0), at most MAX_TOKENS (default 8) tokens. Prints one JSON line: {text,
//   cached_tokens, prompt_tokens, conversation, upstream, wall_s, ttft_s, reload_s,
//   bytes_from_storage} (upstream: nginx's X-Mz-Upstream, the server that answered; wall_s: the
//   request's time here; ttft_s, reload_s, bytes_from_storage: the server's own figures, -1 when
//   absent; bench/fleet_bench.sh reads them too). Exits 1 with the error on stderr when the request
//   fails.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [baseURL, pkgDir, id, file, maxTokensArg] = process.argv.slice(2);
const maxTokens = Number(maxTokensArg ?? 8);
if (!baseURL || !pkgDir || !id || !file) {
  console.error('usage: node fleet_openai.mjs BASE_URL OPENAI_PACKAGE_DIR CONVERSATION_ID MESSAGES_JSON_FILE [MAX_TOKENS]');
  process.exit(2);
}
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [pkgDir] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const messages = JSON.parse(readFileSync(file, 'utf8'));
try {
  const t0 = performance.now();
  const { data, response } = await client.chat.completions
    .create({ model: 'any', messages, max_tokens: maxTokens, temperature: 0 },
            id === '-' ? {} : { headers: { 'X-Mz-Conversation': id } })
    .withResponse();
  console.log(JSON.stringify({
    text: data.choices[0].message.content,
    cached_tokens: data.usage?.prompt_tokens_details?.cached_tokens ?? -1,
    prompt_tokens: data.usage?.prompt_tokens ?? -1,
    conversation: response.headers.get('x-mz-conversation'),
    upstream: response.headers.get('x-mz-upstream') ?? '',
    wall_s: (performance.now() - t0) / 1000,
    ttft_s: data.mzcache?.ttft_s ?? -1,
    reload_s: data.mzcache?.reload_s ?? -1,
    bytes_from_storage: data.mzcache?.bytes_from_storage ?? -1,
  }));
} catch (e) {
  console.error(`request failed: ${e?.status ?? ''} ${e?.message ?? e}`);
  process.exit(1);
}
