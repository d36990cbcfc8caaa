// The demo page and the model cache in headless Chromium (CPU backend),
// failed downloads included:
//   node demo.mjs MODEL PROMPT N EXPECTED_JSON
// EXPECTED_JSON is the native CLI's `run --chat --temp 0 --repeat-penalty 1.1
// --json` output (the demo's default penalty) for
// PROMPT and N tokens. One browser profile throughout, so the service worker
// and the model cache persist across the reload that runs offline.
import { closeSync, createReadStream, mkdirSync, openSync, readSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from '../demo/serve.mjs';
import { agreesWithCli } from './agreement.mjs';
import { launchChromium } from './chromium.mjs';

const [model, prompt, nArg, expectedJson] = process.argv.slice(2);
const n = Number(nArg);
const cliRun = JSON.parse(expectedJson);
const expected = cliRun.text;
// The CLI stops at an end-of-generation token ('eog') or after N tokens.
const expectedFinish = cliRun.stats.stop_reason === 'eog' ? 'stop' : 'length';
const modelBytes = statSync(model).size;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const artifacts = process.env.ARTIFACTS_DIR ?? path.resolve(HERE, '../../target/browser-artifacts');

let failures = 0;
const check = (ok, what) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); if (!ok) failures += 1; };
const secs = (ms) => `${(ms / 1000).toFixed(2)} s`;

function watch(page, tag) {
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`  [${tag} ${m.type()}] ${m.text().slice(0, 400)}`); });
  page.on('pageerror', (e) => console.log(`  [${tag} pageerror] ${e.message}`));
  page.on('worker', (w) => w.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`  [${tag} worker] ${m.text().slice(0, 400)}`); }));
  page.setDefaultTimeout(300_000);
}

// Loads a model through the demo's form; resolves to the load's wall time.
// `drafter`: 'ngram', or 'default' for the page's own choice (SmolLM2's
// shipped DFlash drafter).
async function loadInUi(page, { url, file, drafter = 'ngram' }) {
  await page.check(`input[name=model-kind][value=${file ? 'file' : 'url'}]`);
  if (file) await page.setInputFiles('#model-file', file);
  else await page.fill('#model-url', url);
  if (drafter !== 'default') await page.selectOption('#drafter-kind', drafter);
  await page.selectOption('#backend', 'cpu');
  const loads = Number(await page.getAttribute('body', 'data-loads') ?? 0);
  const t = Date.now();
  await page.click('#load');
  await page.waitForFunction((k) => Number(document.body.dataset.loads ?? 0) > k, loads);
  const ms = Date.now() - t;
  const status = await page.textContent('#load-status');
  if (await page.getAttribute('body', 'data-state') !== 'ready') throw new Error(`the model did not load: ${status}`);
  return { ms, status, source: await page.getAttribute('#load-status', 'data-source') };
}

// Sends PROMPT in a new chat; resolves to the reply text and the stats shown.
async function chatInUi(page) {
  await page.click('#new-chat');
  await page.fill('#max-tokens', String(n));
  await page.fill('#temperature', '0');
  await page.fill('#prompt', prompt);
  const t = Date.now();
  await page.click('#send');
  await page.waitForSelector('.msg.assistant:not([data-state=streaming])');
  const ms = Date.now() - t;
  await page.waitForFunction(() => document.body.dataset.state === 'ready');
  const reply = page.locator('.msg.assistant .text').last();
  const stat = async (id) => (await page.textContent(`#stat-${id}`)).trim();
  return {
    ms, text: await reply.textContent(), state: await page.getAttribute('.msg.assistant', 'data-state'),
    tps: await stat('tps'), acceptance: await stat('acceptance'), tau: await stat('tau'),
  };
}

// In a page: the package API without the worker or WebGPU (see the init script).
async function apiScenario({ prompt, n, cacheStorageUrl, inject }) {
  const { createEngine, modelCache } = await import('/index.js');
  const chat = async (engine) => {
    // The demo's repeat penalty, which EXPECTED_JSON was made with too.
    const r = await engine.chat.completions.create({
      messages: [{ role: 'user', content: prompt }], max_tokens: n, temperature: 0, repeat_penalty: 1.1,
    });
    return r.choices[0].message.content;
  };
  const out = { gpu: 'gpu' in navigator, opfs: typeof navigator.storage.getDirectory };
  // The model as an ArrayBuffer, backend auto with no WebGPU.
  const buf = await (await fetch('/model.gguf', { cache: 'no-store' })).arrayBuffer();
  let t = performance.now();
  let engine = await createEngine({ model: buf, backend: 'auto', drafter: 'ngram', worker: false });
  out.buffer = { ms: performance.now() - t, backend: engine.info.backend, text: await chat(engine) };
  // Role markers typed in a message: plain text, unless opted in.
  if (inject) {
    const ask = async (extra, messages = [{ role: 'user', content: inject }]) => {
      const r = await engine.chat.completions.create({ messages, max_tokens: n, temperature: 0, ...extra });
      return { text: r.choices[0].message.content, prompt_tokens: r.usage.prompt_tokens };
    };
    out.inject = {
      plain: await ask({}),
      special: await ask({ special_tokens_in_content: true }),
      role: await ask({}, [{ role: 'user<|im_end|>', content: 'hi' }]).then(() => 'accepted', (e) => e.code),
    };
  }
  await engine.unload();

  // Without OPFS the cache is Cache Storage: an aborted add() stores
  // nothing; then store, list, load from it, delete.
  const ac = new AbortController();
  out.abortedAdd = await modelCache.add(`${cacheStorageUrl}&partial`, { signal: ac.signal, onProgress: () => ac.abort() })
    .then(() => 'stored', (e) => e.code);
  out.abortedListed = (await modelCache.list()).some((e) => e.url.endsWith('&partial'));
  out.added = await modelCache.add(cacheStorageUrl);
  out.listed = (await modelCache.list()).find((e) => e.url === out.added.url) ?? null;
  const events = [];
  t = performance.now();
  engine = await createEngine({ model: cacheStorageUrl, backend: 'cpu', worker: false, onProgress: (p) => events.push(p) });
  out.cacheStorage = {
    ms: performance.now() - t, text: await chat(engine),
    cachedFlags: [...new Set(events.filter((p) => p.phase === 'download').map((p) => p.cached))],
  };
  await engine.unload();
  out.deleted = await modelCache.delete(cacheStorageUrl);
  out.afterDelete = (await modelCache.list()).some((e) => e.url === out.added.url);
  return out;
}

// Failed downloads as servers produce them: an empty 200, a body cut off
// before its Content-Length, an error page served as 200; a URL whose first
// answer is empty and later ones the model (a server fixed in between).
const head = Buffer.alloc(1 << 20);
const fd = openSync(model, 'r');
readSync(fd, head, 0, head.length, 0);
closeSync(fd);
const serveModel = (res) => {
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': modelBytes });
  createReadStream(model).pipe(res);
};
let flakyRequests = 0;
const routes = {
  '/broken/empty.gguf': (req, res) => res.writeHead(200, { 'content-length': 0 }).end(),
  '/broken/short.gguf': (req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': modelBytes });
    res.write(head, () => res.destroy());
  },
  '/broken/html.gguf': (req, res) => res.writeHead(200, { 'content-type': 'text/html' })
    .end('<!doctype html><title>Not Found</title><p>The requested model was not found.</p>'),
  '/flaky.gguf': (req, res) => {
    flakyRequests += 1;
    if (flakyRequests === 1) res.writeHead(200, { 'content-length': 0 }).end();
    else serveModel(res);
  },
  '/poisoned.gguf': (req, res) => serveModel(res),
};
const server = await startServer({ files: { '/model.gguf': model }, drafters: path.resolve(HERE, '../../drafters'), routes });
// The page's default drafter is SmolLM2's; another model loads with n-gram.
const shippedDrafter = path.basename(model).startsWith('smollm2') ? 'default' : 'ngram';
const { origin } = server;
const modelUrl = `${origin}/model.gguf`;
// No WebGPU: these tests run on the CPU backend.
const { browser, close } = await launchChromium({ webgpu: false, context: { viewport: { width: 1000, height: 1400 } } });
let serverUp = true;
try {
  console.log(`expected (native CLI, --chat): ${JSON.stringify(expected)}`);
  const page = browser.pages()[0] ?? await browser.newPage();
  watch(page, 'demo');

  // 1. Online: the demo loads the model by URL (into the cache) and chats.
  await page.goto(`${origin}/demo/`);
  await page.waitForSelector('#offline[data-ready=true]');
  check(await page.evaluate(() => !!navigator.serviceWorker.controller), 'demo: the service worker controls the page');
  const first = await loadInUi(page, { url: '/model.gguf', drafter: shippedDrafter });
  console.log(`  load (network): ${secs(first.ms)}: ${first.status}`);
  if (shippedDrafter === 'default') {
    check(/drafter dflash/.test(first.status), `demo: loads SmolLM2's DFlash drafter by default (${first.status})`);
  }
  check(first.source === 'network', `demo: first load downloads the model (${first.source})`);
  const reply = await chatInUi(page);
  console.log(`  reply in ${secs(reply.ms)}: tok/s ${reply.tps}, acceptance ${reply.acceptance}, τ ${reply.tau}`);
  // The CLI's text up to near ties (wasm simd128 sums in other orders than
  // AVX2 or AVX-512); every later reply in the browser runs the same wasm
  // kernels and must be this one exactly.
  const agree = agreesWithCli({ model, cliJson: expectedJson, text: reply.text, repeatPenalty: 1.1 });
  check(agree.ok, `demo: streamed chat reply is the CLI's up to near ties (${agree.how}: ${JSON.stringify(reply.text)})`);
  const browserText = reply.text;
  check(reply.state === expectedFinish, `demo: finish reason ${reply.state}, the CLI's is ${cliRun.stats.stop_reason}`);
  // Under the demo's penalty the policy may make no draft in so short a
  // reply; then the panel must say so rather than show 0 % and τ 0.
  const drafted = /%/.test(reply.acceptance) && Number(reply.tau) >= 1;
  const none = reply.acceptance === 'no drafts' && reply.tau === '–';
  check(Number(reply.tps) > 0 && (drafted || none),
    `demo: shows tokens/s, the drafter's acceptance and τ, or that nothing was drafted (${reply.tps}, ${reply.acceptance}, ${reply.tau})`);

  await page.click('#compare');
  await page.waitForSelector('#compare-result:not([data-state=running])');
  const cmp = await page.evaluate(() => {
    const s = document.getElementById('compare-summary');
    return s && { text: s.textContent, speedup: Number(s.dataset.speedup), same: s.dataset.same,
      plain: document.querySelector('#compare-result pre')?.textContent };
  });
  console.log(`  compare: ${cmp?.text ?? await page.textContent('#compare-result')}`);
  check(cmp?.same === 'true' && cmp.plain === `Plain: ${browserText}` && cmp.speedup > 0,
    'demo: compare runs plain and speculative, same text, reports a speedup');

  mkdirSync(artifacts, { recursive: true });
  const shot = path.join(artifacts, 'demo.png');
  await page.screenshot({ path: shot, fullPage: true });
  check(statSync(shot).size > 10_000, `demo: screenshot saved: ${shot}`);

  // Stop: a long reply ends at once, the page is ready again.
  await page.click('#new-chat');
  await page.fill('#max-tokens', '400');
  await page.fill('#prompt', prompt);
  await page.click('#send');
  await page.waitForFunction(() => document.querySelector('.msg.assistant .text')?.textContent.length > 0);
  const stopAt = Date.now();
  await page.click('#stop');
  await page.waitForFunction(() => document.body.dataset.state === 'ready');
  const stopMs = Date.now() - stopAt;
  const stopped = await page.getAttribute('.msg.assistant', 'data-state');
  check(stopped === 'abort' && stopMs < 2000 && (await page.textContent('#transcript')).includes('Stopped.'),
    `demo: stop ends the reply at once (${stopped}, ${stopMs} ms)`);

  const api = await page.evaluate(async (url) => {
    const { modelCache } = await import('/index.js');
    return { list: await modelCache.list(), size: await modelCache.size(), has: await modelCache.has(url) };
  }, modelUrl);
  const entry = api.list.find((e) => e.url === modelUrl);
  check(entry?.bytes === modelBytes && api.has, `cache: list() has ${modelUrl} with its ${modelBytes} bytes`);
  check(api.size === api.list.reduce((s, e) => s + e.bytes, 0) && api.size >= modelBytes, `cache: size() is the sum (${api.size})`);
  check(await page.getAttribute(`#cache-table tr[data-url="${modelUrl}"]`, 'data-bytes') === String(modelBytes),
    'demo: the cache table lists the model');

  // The engine's worker ends mid-download (a load aborted by its signal).
  const partial = await page.evaluate(async (url) => {
    const { createEngine, modelCache } = await import('/index.js');
    const ac = new AbortController();
    let code = 'loaded';
    try {
      await createEngine({ model: url, backend: 'cpu', signal: ac.signal, onProgress: () => ac.abort() });
    } catch (e) {
      code = e.code;
    }
    return { code, has: await modelCache.has(url), listed: (await modelCache.list()).some((e) => e.url === url) };
  }, `${modelUrl}?partial`);
  check(partial.code === 'aborted' && !partial.has && !partial.listed,
    `cache: a load aborted mid-download leaves no entry (${JSON.stringify(partial)})`);

  // Failed downloads never become entries (createEngine and add()); a URL
  // whose first answer was empty loads once the server is fixed.
  const broken = await page.evaluate(async ({ base, prompt, n }) => {
    const { createEngine, modelCache } = await import('/index.js');
    const out = {};
    const has = async (url) => (await modelCache.has(url)) || (await modelCache.list()).some((e) => e.url === url);
    for (const name of ['empty', 'short', 'html']) {
      const url = `${base}/broken/${name}.gguf`;
      const load = await createEngine({ model: url, backend: 'cpu' })
        .then(async (e) => { await e.unload(); return 'loaded'; }, (e) => e.code);
      const afterLoad = await has(url);
      const add = await modelCache.add(url).then(() => 'stored', (e) => e.code);
      out[name] = { load, afterLoad, add, afterAdd: await has(url) };
    }
    const url = `${base}/flaky.gguf`;
    const first = await createEngine({ model: url, backend: 'cpu' }).then(() => 'loaded', (e) => e.code);
    const firstCached = await has(url);
    const engine = await createEngine({ model: url, backend: 'cpu' });
    const r = await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], max_tokens: n, temperature: 0, repeat_penalty: 1.1 });
    await engine.unload();
    out.flaky = { first, firstCached, text: r.choices[0].message.content, cached: await has(url) };
    await modelCache.delete(url);
    return out;
  }, { base: origin, prompt, n });
  for (const [name, r] of Object.entries({ empty: broken.empty, short: broken.short, html: broken.html })) {
    const codes = name === 'short' ? ['network', 'bad_gguf'] : ['bad_gguf'];
    check(codes.includes(r.load) && !r.afterLoad, `cache: a load of a ${name} download fails (${r.load}) and caches nothing`);
    check(codes.includes(r.add) && !r.afterAdd, `cache: add() of a ${name} download fails (${r.add}) and caches nothing`);
  }
  check(broken.flaky.first === 'bad_gguf' && !broken.flaky.firstCached && broken.flaky.text === browserText && broken.flaky.cached,
    `cache: an empty first answer is not cached; once the server is fixed the model loads and is cached (${JSON.stringify(broken.flaky)})`);

  // A cached copy that cannot load (a failed download an older version
  // stored: 0 bytes): the error says so, names it in cachedUrls (through the
  // worker), and the demo offers to delete it and load again.
  const poisonedUrl = `${origin}/poisoned.gguf`;
  const poisoned = await page.evaluate(async (url) => {
    const { createEngine } = await import('/index.js');
    const { opfs } = await import('/src/stores.js');
    const w = await opfs.writer(url);
    await w.commit(0);
    return createEngine({ model: url, backend: 'cpu' }).then(() => null, (e) => ({ code: e.code, message: e.message, cachedUrls: e.cachedUrls }));
  }, poisonedUrl);
  check(poisoned?.code === 'bad_gguf' && poisoned.cachedUrls?.join() === poisonedUrl && /model cache/.test(poisoned.message),
    `cache: a load failing on a cached copy says so and lists it in cachedUrls (${JSON.stringify(poisoned)})`);
  await page.check('input[name=model-kind][value=url]');
  await page.fill('#model-url', '/poisoned.gguf');
  await page.selectOption('#drafter-kind', 'ngram'); // where the model alone comes from is checked
  let loads = Number(await page.getAttribute('body', 'data-loads') ?? 0);
  await page.click('#load');
  await page.waitForFunction((k) => Number(document.body.dataset.loads ?? 0) > k, loads);
  const dropOffered = await page.isVisible('#load-status.error #drop-cached');
  check(dropOffered && /model cache/.test(await page.textContent('#load-status')),
    'demo: a load failing on a cached copy offers to delete it');
  loads = Number(await page.getAttribute('body', 'data-loads'));
  if (dropOffered) {
    await page.click('#drop-cached');
    await page.waitForFunction((k) => Number(document.body.dataset.loads ?? 0) > k, loads);
  }
  const reloaded = { state: await page.getAttribute('body', 'data-state'), source: await page.getAttribute('#load-status', 'data-source') };
  const recached = await page.evaluate(async (url) => {
    const { modelCache } = await import('/index.js');
    const entry = (await modelCache.list()).find((e) => e.url === url);
    await modelCache.delete(url);
    return entry?.bytes ?? null;
  }, poisonedUrl);
  check(reloaded.state === 'ready' && reloaded.source === 'network' && recached === modelBytes,
    `demo: after deleting it the model downloads, loads and is cached whole (${JSON.stringify(reloaded)}, ${recached} bytes)`);

  // 2. The package API in a page with neither WebGPU nor OPFS: ArrayBuffer
  //    source with backend auto, then the Cache Storage fallback.
  const bare = await browser.newPage();
  watch(bare, 'bare');
  await bare.addInitScript(() => {
    delete Navigator.prototype.gpu;
    delete StorageManager.prototype.getDirectory;
  });
  await bare.goto(`${origin}/test/blank.html`);
  const r = await bare.evaluate(apiScenario, { prompt, n, cacheStorageUrl: `${modelUrl}?store=cache-storage`, inject: process.env.INJECT });
  await bare.close();
  console.log(`  load: ArrayBuffer ${secs(r.buffer.ms)}, from Cache Storage ${secs(r.cacheStorage.ms)}`);
  check(!r.gpu && r.opfs === 'undefined', 'bare page: no navigator.gpu, no OPFS');
  check(r.buffer.backend === 'cpu', `backend auto without WebGPU ends on ${r.buffer.backend}`);
  check(r.buffer.text === browserText, `ArrayBuffer model, auto→cpu, in-page engine: the demo's text (${JSON.stringify(r.buffer.text)})`);
  if (process.env.INJECT) {
    // The CLI's --chat (and --chat-special) on the same message: the same
    // prompt tokens, and its text up to near ties (agreement.mjs).
    const same = (got, json) => {
      const agree = agreesWithCli({ model, cliJson: json, text: got.text });
      const v = JSON.parse(json);
      return { ok: got.prompt_tokens === v.prompt_tokens.length && agree.ok, cli: { text: v.text, prompt_tokens: v.prompt_tokens.length }, how: agree.how };
    };
    const plain = same(r.inject.plain, process.env.EXPECTED_INJECT);
    const special = same(r.inject.special, process.env.EXPECTED_INJECT_SPECIAL);
    check(plain.ok,
      `chat: role markers in a message stay text, as the CLI's --chat (${JSON.stringify(r.inject.plain)}, CLI ${JSON.stringify(plain.cli)}: ${plain.how})`);
    check(special.ok && special.cli.prompt_tokens < plain.cli.prompt_tokens,
      `chat: special_tokens_in_content parses them, as the CLI's --chat-special (${JSON.stringify(r.inject.special)}, CLI ${JSON.stringify(special.cli)}: ${special.how})`);
    check(r.inject.role === 'invalid_argument', `chat: a role holding a special token is refused (${r.inject.role})`);
  } else {
    console.log('  (INJECT not set: the role-marker checks are skipped; www/test/run.sh sets it)');
  }
  check(r.abortedAdd === 'aborted' && !r.abortedListed, `Cache Storage fallback: an aborted add() leaves no entry (${r.abortedAdd})`);
  check(r.added.cached === false && r.listed?.bytes === modelBytes, 'Cache Storage fallback: add() stores the model, list() shows its bytes');
  check(r.cacheStorage.text === browserText && r.cacheStorage.cachedFlags.join() === 'true',
    `Cache Storage fallback: the model loads from it (progress cached: ${r.cacheStorage.cachedFlags}) with the same text`);
  check(r.deleted === true && r.afterDelete === false, 'Cache Storage fallback: delete() removes the entry');

  // 3. Offline: the server is gone; the service worker serves the page, the
  //    model cache the model.
  await server.close();
  serverUp = false;
  await page.reload();
  await page.waitForSelector('#offline[data-ready=true]');
  const again = await loadInUi(page, { url: '/model.gguf' });
  console.log(`  load (offline, from the cache): ${secs(again.ms)}: ${again.status}`);
  check(again.source === 'cache' && /model cache/.test(again.status), `offline reload: the model comes from the model cache (${again.source})`);
  const offline = await chatInUi(page);
  check(offline.text === browserText, `offline reload: the demo's text (${JSON.stringify(offline.text)})`);

  const fromFile = await loadInUi(page, { file: model });
  const fileReply = await chatInUi(page);
  console.log(`  load (File): ${secs(fromFile.ms)}`);
  check(fileReply.text === browserText, `File (Blob) model through the demo's file input: the demo's text (${JSON.stringify(fileReply.text)})`);

  // Delete from the demo's cache table; then the URL cannot load offline.
  await page.click(`#cache-table tr[data-url="${modelUrl}"] button`);
  await page.waitForSelector(`#cache-table tr[data-url="${modelUrl}"]`, { state: 'detached' });
  const after = await page.evaluate(async () => {
    const { modelCache } = await import('/index.js');
    return { list: await modelCache.list(), size: await modelCache.size() };
  });
  check(!after.list.some((e) => e.url === modelUrl) && after.size === api.size - modelBytes,
    `cache: delete removes the entry (size ${api.size} → ${after.size})`);
  await page.check('input[name=model-kind][value=url]');
  await page.click('#load');
  await page.waitForSelector('#load-status.error');
  const err = await page.textContent('#load-status');
  check(/\(network\)$/.test(err), `offline, deleted from the cache: a typed network error (${err})`);
} catch (e) {
  check(false, `demo test: ${e.message.split('\n')[0]}`);
} finally {
  await close();
  if (serverUp) await server.close();
}
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
