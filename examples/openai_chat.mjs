// openai_chat.mjs: `mzcache serve` through the official `openai` npm client, as docs/server.md
// shows it (ctest serve_e2e runs this file as written).
//
//   npm install openai            # in the folder you run it from (tested with 6.49.0)
//   node openai_chat.mjs [BASE_URL]   # default http://127.0.0.1:8080/v1
//
// The key is $OPENAI_API_KEY (the client's own variable): the server's --api-key, or any text when
// the server has none. Two turns of one conversation: the first plain, the second streamed; the
// second resends the history, so the server continues the same conversation and reports the
// history's tokens as cached. Prints each reply and its usage; exits 1 with the error otherwise.
// max_tokens is set: the synthesized default model has random weights and never ends a reply itself
// (without it a turn runs to the server's --max-tokens, 1024 tokens).
import OpenAI from 'openai';

const baseURL = process.argv[2] ?? 'http://127.0.0.1:8080/v1';
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY ?? 'none' });

try {
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  const model = models[0];
  console.log(`models: ${models.join(', ')}`);

  const messages = [{ role: 'user', content: 'Hi! What is a KV cache?' }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 16 });
  console.log(`reply: ${JSON.stringify(r.choices[0].message.content)}`);
  console.log(`usage: ${r.usage.prompt_tokens} prompt, ${r.usage.completion_tokens} completion tokens`);

  messages.push(r.choices[0].message, { role: 'user', content: 'Tell me more.' });
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  console.log(`streamed reply: ${JSON.stringify(text)}`);
  console.log(`second turn: ${usage.prompt_tokens_details.cached_tokens} of ${usage.prompt_tokens} prompt tokens cached`);
} catch (e) {
  console.error(`openai_chat: ${e.message}`);
  process.exit(1);
}
