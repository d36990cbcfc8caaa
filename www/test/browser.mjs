// Drives headless Chromium (playwright-core, system Chromium) through the
// package: usage: node browser.mjs MODEL PROMPT N EXPECTED_JSON BACKEND...
// EXPECTED_JSON is the native CLI's `run --json` output for PROMPT.
// Serves www/ plus the model at /model.gguf (demo/serve.mjs), and with
// SPLIT_DIR (the model as a split set, `blockdraft split`) its parts under
// /models/.
import { readdirSync } from 'node:fs';
import { agreesWithCli } from './agreement.mjs';
import { launchChromium } from './chromium.mjs';
import { startServer } from '../demo/serve.mjs';

const [model, prompt, nArg, expectedJson, ...backends] = process.argv.slice(2);
const n = Number(nArg);
const expected = JSON.parse(expectedJson).text;
const splitDir = process.env.SPLIT_DIR;
const splitFirst = splitDir && readdirSync(splitDir).filter((f) => f.endsWith('.gguf')).sort()[0];
const server = await startServer({ files: { '/model.gguf': model }, models: splitDir ?? null });
const { origin } = server;

// Runs in the page: one engine (n-gram drafter) per backend, three requests.
async function scenario({ backend, prompt, n }) {
  const { createEngine, BlockdraftError, modelCache } = await import('/index.js');
  const out = { backend };
  let t = performance.now();
  // cache: false: the download path itself (demo.mjs tests the model cache).
  const engine = await createEngine({ model: '/model.gguf', drafter: 'ngram', backend, cache: false });
  out.load_ms = performance.now() - t;
  out.cached_after = await modelCache.has('/model.gguf');
  out.info = engine.info;

  const collect = async (params) => {
    const start = performance.now();
    let text = '';
    let last = null;
    for await (const chunk of await engine.completions.create({ ...params, stream: true })) {
      text += chunk.choices[0].text;
      last = chunk;
    }
    return { text, usage: last?.usage, finish_reason: last?.choices[0].finish_reason, ms: performance.now() - start };
  };
  out.plain = await collect({ prompt, max_tokens: n, temperature: 0, speculative: false });
  out.ngram = await collect({ prompt, max_tokens: n, temperature: 0, speculative: true });

  // Abort after the third chunk of a long stream: the loop must end at once.
  const ac = new AbortController();
  let chunks = 0;
  let abortedAt = 0;
  for await (const chunk of await engine.completions.create({ prompt, max_tokens: 200, temperature: 0, stream: true, signal: ac.signal, speculative: false })) {
    chunks += 1;
    if (chunk.usage) break;
    if (chunks === 3) { abortedAt = performance.now(); ac.abort(); }
  }
  out.abort = { chunks, ended_ms_after_abort: performance.now() - abortedAt };
  // The engine serves the next request after an abort.
  t = performance.now();
  const next = await engine.completions.create({ prompt, max_tokens: 2, temperature: 0 });
  out.after_abort = { text: next.choices[0].text, ms: performance.now() - t };

  // Typed errors for bad calls.
  try {
    await engine.completions.create({ prompt, max_tokens: 0 });
    out.bad_request = 'no error';
  } catch (e) {
    out.bad_request = e instanceof BlockdraftError ? e.code : `untyped: ${e}`;
  }
  await engine.unload();
  return out;
}

// Runs in the page: the split set by its first part's URL (in the worker),
// then as an array of Blobs (in the page), on the CPU.
async function splitScenario({ first, prompt, n }) {
  const { createEngine } = await import('/index.js');
  const generate = async (options) => {
    const parts = new Set();
    const engine = await createEngine({ ...options, backend: 'cpu', cache: false, onProgress: (p) => parts.add(`${p.part}/${p.parts}`) });
    const r = await engine.completions.create({ prompt, max_tokens: n, temperature: 0 });
    await engine.unload();
    return { text: r.choices[0].text, parts: [...parts].sort() };
  };
  const byUrl = await generate({ model: first });
  const urls = [1, 2, 3].map((i) => first.replace('-00001-of-', `-0000${i}-of-`));
  const blobs = await Promise.all(urls.map(async (u) => (await fetch(u)).blob()));
  const byBlobs = await generate({ model: blobs, worker: false });
  return { byUrl, byBlobs };
}

// Runs in the page: the f32 KV cache on request (through the worker), and a
// cache type that does not exist.
async function kvTypeScenario({ prompt, n }) {
  const { createEngine, BlockdraftError } = await import('/index.js');
  const engine = await createEngine({ model: '/model.gguf', backend: 'cpu', cache: false, kvType: 'f32' });
  const r = await engine.completions.create({ prompt, max_tokens: n, temperature: 0 });
  const out = { kv_type: engine.info.kv_type, text: r.choices[0].text };
  await engine.unload();
  try {
    await createEngine({ model: '/model.gguf', backend: 'cpu', cache: false, kvType: 'q8_0' });
    out.bad = 'no error';
  } catch (e) {
    out.bad = e instanceof BlockdraftError ? `${e.code}: ${e.message}` : `untyped: ${e}`;
  }
  return out;
}

let failures = 0;
// The CPU backend's greedy text in the page: the split sets must give it.
let cpuText = null;
const check = (ok, what) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); if (!ok) failures += 1; };
const { browser, close } = await launchChromium();
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`  [browser ${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => console.log(`  [pageerror] ${e.message}`));
  page.on('worker', (w) => w.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`  [worker ${m.type()}] ${m.text().slice(0, 400)}`); }));
  page.setDefaultTimeout(600_000);
  await page.goto(`${origin}/test/blank.html`);
  console.log(`expected (native CLI): ${JSON.stringify(expected)}`);
  for (const backend of backends) {
    let r;
    try {
      r = await page.evaluate(scenario, { backend, prompt, n });
    } catch (e) {
      check(false, `${backend}: ${e.message.split('\n')[0]}`);
      continue;
    }
    const tps = (u) => u?.timings.decode_tokens_per_second.toFixed(2);
    console.log(`${backend}: ${r.info.device}`);
    console.log(`  load ${(r.load_ms / 1000).toFixed(2)} s; plain ${(r.plain.ms / 1000).toFixed(2)} s, ${tps(r.plain.usage)} tok/s decode, `
      + `prefill ${r.plain.usage?.timings.prefill_tokens_per_second.toFixed(1)} tok/s; `
      + `ngram ${(r.ngram.ms / 1000).toFixed(2)} s, ${tps(r.ngram.usage)} tok/s, spec ${JSON.stringify(r.ngram.usage?.speculative)}`);
    check(r.info.backend === backend, `${backend}: engine runs on ${r.info.backend}`);
    check(r.info.kv_type === 'f16', `${backend}: f16 KV cache by default, as the CLI's (${r.info.kv_type})`);
    check(r.cached_after === false, `${backend}: cache: false leaves the model out of the model cache`);
    if (backend === 'cpu') cpuText = r.plain.text;
    const agree = agreesWithCli({ model, cliJson: expectedJson, text: r.plain.text });
    check(agree.ok, `${backend}: greedy text is the CLI's up to near ties (${agree.how}: ${JSON.stringify(r.plain.text)})`);
    check(r.plain.usage?.completion_tokens === n && r.plain.finish_reason === 'length', `${backend}: ${n} tokens, finish_reason length`);
    check(r.ngram.text === r.plain.text, `${backend}: n-gram speculative text equals plain decoding's (${JSON.stringify(r.ngram.text)})`);
    check(r.ngram.usage?.speculative?.drafter === 'ngram', `${backend}: n-gram stats reported`);
    check(r.abort.chunks === 3 && r.abort.ended_ms_after_abort < 100,
      `${backend}: abort ends the stream at once (${r.abort.chunks} chunks, ${r.abort.ended_ms_after_abort.toFixed(1)} ms)`);
    check(r.plain.text.startsWith(r.after_abort.text) && r.after_abort.text.length > 0,
      `${backend}: next request after the abort works (${(r.after_abort.ms / 1000).toFixed(2)} s)`);
    check(r.bad_request === 'invalid_argument', `${backend}: max_tokens 0 is a typed invalid_argument error (${r.bad_request})`);
  }
  if (process.env.EXPECTED_F32) {
    const r = await page.evaluate(kvTypeScenario, { prompt, n });
    check(r.kv_type === 'f32' && agreesWithCli({ model, cliJson: process.env.EXPECTED_F32, text: r.text, kvType: 'f32' }).ok,
      `kvType f32: the CLI's --kv-type f32 text up to near ties (${r.kv_type}, ${JSON.stringify(r.text)})`);
    check(r.bad.startsWith('invalid_argument') && r.bad.includes('q8_0'), `kvType q8_0 is a typed error naming it (${r.bad})`);
  }
  if (splitFirst) {
    const first = `/models/${splitFirst}`;
    const r = await page.evaluate(splitScenario, { first, prompt, n });
    const parts = ['1/3', '2/3', '3/3'];
    const same = (text) => (cpuText === null ? agreesWithCli({ model, cliJson: expectedJson, text }).ok : text === cpuText);
    check(same(r.byUrl.text) && JSON.stringify(r.byUrl.parts) === JSON.stringify(parts),
      `split set by its first URL (${first}): the whole file's text, progress over parts ${r.byUrl.parts}`);
    check(same(r.byBlobs.text) && JSON.stringify(r.byBlobs.parts) === JSON.stringify(parts),
      'split set as an array of Blobs, in the page: the whole file\'s text');
  }
} finally {
  await close();
  await server.close();
}
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
