// The web page of `mzcache serve` with two models (issue 45), in a real browser: the model picker
// and a weights bar per model appear; a message sent with the second model picked is answered by
// it (its conversation listed with that model in the pool report); selecting a conversation sets
// the picker to its model. A pool report asked for before the turn ended and answered after it
// (held here by request interception) does not make the page forget the new conversation. No
// console error, no uncaught exception.
// Usage: node serve_page_models.mjs BASE_URL PUPPETEER_PACKAGE_DIR CHROMIUM (the server needs no key)
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const [base, pkgDir, chromium] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('puppeteer-core', { paths: [pkgDir] })).href);
const puppeteer = mod.default || mod;
const fail = (what) => { console.error(`FAILED: ${what}`); process.exitCode = 1; throw new Error(what); };
const browser = await puppeteer.launch({ executablePath: chromium, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check'],
  defaultViewport: { width: 1280, height: 860 }, timeout: 60000 });
try {
  const page = await browser.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));
  await page.goto(base, { waitUntil: 'domcontentloaded' });
  await page.waitForFunction(() => document.querySelectorAll('#model-weights .conv').length === 2, { timeout: 20000 })
    .catch(() => fail('no weights bar per model'));
  if (await page.$eval('#model-pick', (e) => e.hidden)) fail('the model picker is hidden with two models');
  const models = await page.$$eval('#model-pick option', (o) => o.map((x) => x.value));
  if (models.length !== 2) fail(`picker options: ${models}`);
  console.log(`ok: a model picker (${models.join(', ')}) and a weights bar per model`);
  await page.select('#model-pick', models[1]);
  // The race of a slow report: the next pool poll is answered with the report from before the
  // message, and only after the turn ended; the chat request waits until that poll was asked.
  const before = await (await fetch(`${base}/v1/mzcache/pool`)).text();
  let release, asked;
  const released = new Promise((r) => { release = r; });
  const polled = new Promise((r) => { asked = r; });
  let held = false;
  await page.setRequestInterception(true);
  page.on('request', (req) => {
    const url = req.url();
    if (!held && req.method() === 'GET' && url.endsWith('/v1/mzcache/pool')) {
      held = true;
      asked();
      released.then(() => req.respond({ status: 200, contentType: 'application/json', body: before }));
    } else if (req.method() === 'POST' && url.endsWith('/v1/chat/completions')) {
      polled.then(() => req.continue());
    } else {
      req.continue();
    }
  });
  await page.type('#msg', 'hello');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant.done', { timeout: 60000 });
  release();
  await new Promise((r) => setTimeout(r, 300));
  if (await page.$('.msg.assistant.error')) fail(`the turn failed: ${await page.$eval('.msg.assistant.error', (e) => e.textContent)}`);
  const conv = await page.$eval('.msg.assistant.done', (e) => e.dataset.conversation);
  const pool = await (await fetch(`${base}/v1/mzcache/pool`)).json();
  const owner = (pool.conversations.find((c) => c.id === conv) || {}).model;
  if (owner !== models[1]) fail(`the message went to ${owner}, not the picked ${models[1]}`);
  console.log(`ok: a message with ${models[1]} picked is answered by it (${conv})`);
  if (!held) fail('no pool report was held during the turn');
  console.log('ok: a pool report asked for before the turn and answered after it kept the conversation');
  // The picker follows the selected conversation's model.
  await page.select('#model-pick', models[0]);
  await page.waitForFunction((id) => [...document.querySelectorAll('#conv option')].some((o) => o.value === id && !o.disabled),
    { timeout: 20000 }, conv);
  await page.select('#conv', '');
  await page.select('#conv', conv);
  const picked = await page.$eval('#model-pick', (e) => e.value);
  if (picked !== models[1]) fail(`selecting ${conv} left the picker on ${picked}`);
  console.log('ok: selecting a conversation picks its model');
  if (problems.length) fail(`console errors: ${problems.join(' | ')}`);
} catch (e) {
  if (!process.exitCode) { console.error(`FAILED: ${e.message}`); process.exitCode = 1; }
} finally {
  await browser.close();
}
