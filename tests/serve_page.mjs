// The web page of `mzcache serve` (GET /) in a real browser: Debian's chromium driven by
// puppeteer-core (tests/check_serve_page.sh starts the server and installs both).
// Usage: node serve_page.mjs BASE_URL API_KEY PUPPETEER_PACKAGE_DIR CHROMIUM [--screenshot PATH]
//   BASE_URL e.g. http://127.0.0.1:PORT; the server must require API_KEY.
// What a user does, each step checked on the DOM: the page asks for the key (the API answered 401)
// and takes it; a message typed is answered with text that appears while it streams (several
// updates before the end); the conversation shows in the pool with bytes in memory; "give memory
// back" at level 80 moves its bars to storage (the row's figures: nothing resident, bytes on
// storage) and lists the trim among the events; a second message continues the conversation
// (cached tokens, units restored, TTFT shown in the chat and in the returns table); "forget"
// removes it. Throughout: no uncaught exception; after the key was given, no console error and no
// failed request (before it, only the API's 401s and their console lines). The page's own headers
// (Content-Type, Content-Security-Policy) are checked too.
// Exits 0 when every check passed, 1 (with the failed check on stderr) otherwise.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const args = process.argv.slice(2);
let shot = null;
const si = args.indexOf('--screenshot');
if (si >= 0) { shot = args[si + 1]; args.splice(si, 2); }
const [base, apiKey, pkgDir, chromium] = args;
if (!base || !apiKey || !pkgDir || !chromium || (si >= 0 && !shot)) {
  console.error('usage: node serve_page.mjs BASE_URL API_KEY PUPPETEER_PACKAGE_DIR CHROMIUM [--screenshot PATH]');
  process.exit(2);
}
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('puppeteer-core', { paths: [pkgDir] })).href);
const puppeteer = mod.default ?? mod;

const t0 = Date.now();
const log = (what) => console.log(`ok: ${what} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
class Failed extends Error {}
function check(ok, what) {
  if (!ok) throw new Failed(what);
  log(what);
}

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  // As root (CI), chromium refuses to start with its sandbox; the page is our own.
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check'],
  defaultViewport: { width: 1280, height: 860 },
  timeout: 60000,
});
let keyed = false;  // the key was given: from now on nothing may fail
const before = { failures: [], consoles: [] };
const problems = [];
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(shot ? 300000 : 30000);  // the screenshot may run on a real-sized model
  page.on('pageerror', (e) => problems.push(`uncaught exception: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error' && m.type() !== 'assert') return;
    const text = `console ${m.type()}: ${m.text()} (${m.location()?.url ?? ''})`;
    (keyed ? problems : before.consoles).push(text);
  });
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.method()} ${r.url()}: ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() < 400) return;
    const text = `HTTP ${r.status()}: ${r.request().method()} ${r.url()}`;
    (keyed ? problems : before.failures).push({ text, status: r.status(), url: r.url() });
  });
  const stopOnProblem = () => { if (problems.length) throw new Failed(problems.join('\n')); };
  // page.waitForFunction, failing with what was waited for.
  const waitFor = async (what, fn, ...args) => {
    try {
      await page.waitForFunction(fn, {}, ...args);
    } catch (e) {
      throw new Failed(`${what}: ${e.message}`);
    }
  };

  // 1. The page, its headers, and the key.
  const res = await page.goto(`${base}/`, { waitUntil: 'domcontentloaded' });
  const h = res.headers();
  check(res.status() === 200 && /^text\/html/.test(h['content-type'] ?? ''), `GET / is HTML (${h['content-type']})`);
  const csp = h['content-security-policy'] ?? '';
  check(/default-src 'none'/.test(csp) && /script-src 'self'/.test(csp) && !/unsafe/.test(csp), `a strict CSP: ${csp}`);
  await page.waitForSelector('#key-form:not([hidden])');
  check(before.failures.length > 0 && before.failures.every((f) => f.status === 401 && new URL(f.url).pathname.startsWith('/v1/')),
    `without a key the page asks for it (the API answered 401: ${before.failures.length} requests)`);
  check(before.consoles.every((c) => /401/.test(c)), `before the key only the 401s in the console (${before.consoles.length})`);
  keyed = true;
  await page.type('#key', apiKey);
  await page.click('#key-save');
  await waitFor('the pool shown after the key', () => document.getElementById('t-rss').textContent !== '-' &&
    document.getElementById('status').textContent === 'live');
  const rss = await page.$eval('#t-rss', (e) => e.textContent);
  check(/iB/.test(rss), `the pool is shown live after the key (RSS ${rss})`);
  check(await page.$eval('#key-form', (e) => e.hidden), 'the key form is gone');

  // Counts the streamed text's updates: several before the reply ends.
  await page.evaluate(() => {
    window.__updates = [];
    new MutationObserver((ms) => {
      for (const m of ms) {
        const t = m.target.closest && m.target.closest('.msg.assistant .text');
        const bubble = m.target.closest && m.target.closest('.msg.assistant');
        if (t && bubble) window.__updates.push({ streaming: bubble.classList.contains('streaming'), len: t.textContent.length });
      }
    }).observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
  });
  const say = async (text) => {
    const n = await page.$$eval('.msg.assistant.done', (es) => es.length);
    await page.click('#msg');
    await page.type('#msg', text);
    await page.keyboard.press('Enter');
    await waitFor(`a reply to ${JSON.stringify(text)}`, (n) => document.querySelectorAll('.msg.assistant.done').length > n, n);
    return page.$$eval('.msg.assistant.done', (es) => {
      const e = es[es.length - 1];
      return { text: e.querySelector('.text').textContent, error: e.classList.contains('error'),
        info: e.querySelector('.info')?.textContent, conv: e.dataset.conversation, ttft: Number(e.dataset.ttft),
        cached: Number(e.dataset.cached), units: Number(e.dataset.unitsRestored), fromStorage: Number(e.dataset.bytesFromStorage) };
    });
  };
  const row = (id) => page.$eval(`#convs .conv[data-id="${id}"]`, (e) => ({
    resident: Number(e.dataset.resident), compressed: Number(e.dataset.compressed), storage: Number(e.dataset.storage),
    tokens: Number(e.dataset.tokens),
    widths: [...e.querySelectorAll('.seg')].map((s) => parseFloat(s.style.width)) }));

  // 2. A message, streamed.
  await page.$eval('#max-tokens', (e) => { e.value = '16'; });
  if (shot) {  // a second conversation, so that the screenshot shows more than one bar
    const other = await say('What does a pool of conversations keep?');
    check(!other.error, `a first conversation ${other.conv}`);
    await page.select('#conv', '');
    await page.evaluate(() => { window.__updates = []; });
  }
  const a1 = await say('Hello! What is memory pressure?');
  check(!a1.error && a1.text.length > 0 && a1.conv && /^c-/.test(a1.conv), `answered in ${a1.conv}: ${JSON.stringify(a1.text)} (${a1.info})`);
  const ups = await page.evaluate(() => window.__updates);
  check(ups.filter((u) => u.streaming && u.len > 0).length >= 2, `the text appeared while it streamed (${ups.length} updates)`);
  check(a1.ttft > 0 && /TTFT/.test(a1.info), `the turn's TTFT shown (${a1.ttft} s)`);
  check(await page.$eval('#conv', (e) => e.value) === a1.conv, 'the conversation is selected');
  await waitFor('the conversation in memory in the pool', (id) => {
    const r = document.querySelector(`#convs .conv[data-id="${id}"]`);
    return r && Number(r.dataset.resident) > 0;
  }, a1.conv);
  const r1 = await row(a1.conv);
  check(r1.resident > 0 && r1.widths[0] > 0, `its bar: ${r1.resident} bytes in memory (${r1.tokens} tokens)`);
  stopOnProblem();

  // 3. Give memory back: level 80 (COMPLETE).
  await page.select('#trim-level', '80');
  await page.click('#trim');
  await waitFor('trim 80: the bar moved to storage', (id) => {
    const r = document.querySelector(`#convs .conv[data-id="${id}"]`);
    return r && Number(r.dataset.resident) === 0 && Number(r.dataset.storage) > 0;
  }, a1.conv);
  const r2 = await row(a1.conv);
  check(r2.resident === 0 && r2.compressed === 0 && r2.storage > 0 && r2.widths[0] === 0 && r2.widths[2] > 0,
    `trim 80: the bar moved to storage (${r2.storage} bytes on storage, widths ${r2.widths.map((w) => w.toFixed(0)).join('/')})`);
  const wts = await page.$eval('#weights', (e) => ({ resident: Number(e.dataset.resident), storage: Number(e.dataset.storage) }));
  check(wts.resident < wts.storage, `and the weights' bar: ${wts.resident} bytes resident, ${wts.storage} left in the model file`);
  await page.waitForSelector('#events li[data-kind="trim"]');
  const ev = await page.$eval('#events li[data-kind="trim"]', (e) => ({ bytes: Number(e.dataset.bytes), text: e.textContent }));
  check(ev.bytes > 0, `the trim is listed among the events: ${ev.text}`);
  check(/trim 80 \(COMPLETE\)/.test(await page.$eval('#status', (e) => e.textContent)), 'the status names the level');
  stopOnProblem();

  // 4. The return: the conversation comes back from storage.
  const a2 = await say('And what do you do about it?');
  check(!a2.error && a2.conv === a1.conv, `the return continued ${a2.conv}: ${JSON.stringify(a2.text)} (${a2.info})`);
  check(a2.cached > 0 && a2.units > 0 && a2.ttft > 0, `the return's figures: ${a2.cached} tokens cached, ${a2.units} units restored, TTFT ${a2.ttft} s`);
  check(/cached/.test(a2.info) && /restored/.test(a2.info), 'shown in the chat');
  await page.waitForSelector(`#turns tr.return[data-cached]`);
  const tr = await page.$eval('#turns tr.return', (e) => ({ cached: Number(e.dataset.cached), ttft: Number(e.dataset.ttft), text: e.textContent }));
  check(tr.cached === a2.cached && Math.abs(tr.ttft - a2.ttft) < 1e-6, `and in the returns table: ${tr.text}`);
  await waitFor('the conversation back in memory after the return', (id) => {
    const r = document.querySelector(`#convs .conv[data-id="${id}"]`);
    return r && Number(r.dataset.resident) > 0;
  }, a1.conv);
  check(true, 'its bar is back in memory');
  stopOnProblem();
  if (shot) {
    await new Promise((r) => setTimeout(r, 700));  // one more poll: the figures settle
    await page.screenshot({ path: shot, fullPage: true });
    log(`screenshot ${shot}`);
  }

  // 5. Forget.
  await page.click(`#convs .conv[data-id="${a1.conv}"] .forget`);
  await waitFor('forget: the row gone', (id) => !document.querySelector(`#convs .conv[data-id="${id}"]`), a1.conv);
  const opts = await page.$$eval('#conv option', (os) => os.map((o) => o.value));
  check(!opts.includes(a1.conv) && await page.$eval('#conv', (e) => e.value) === '', 'forget: the conversation is gone from the pool and the chat');
  const pool = await page.evaluate(async (key) => (await fetch('/v1/mzcache/pool', { headers: { Authorization: `Bearer ${key}` } })).json(), apiKey);
  check(!pool.conversations.some((c) => c.id === a1.conv), 'and from the server');
  await new Promise((r) => setTimeout(r, 1200));  // two more polls: nothing fails after
  stopOnProblem();
  check(true, 'no console error, no failed request, no exception');
} catch (e) {
  console.error(`FAILED: ${e instanceof Failed ? e.message : e.stack}`);
  if (problems.length) console.error(problems.join('\n'));
  process.exitCode = 1;
} finally {
  await browser.close();
}
