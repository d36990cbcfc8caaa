// A model larger than wasm32's 4 GiB address space loads on WebGPU
// (SwiftShader) through the package and generates the native CLI's greedy
// tokens: usage: node big.mjs FIRST_PART PROMPT N EXPECTED_JSON
// (see tests/browser_big_model.sh, which makes the model).
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { startServer } from '../demo/serve.mjs';
import { launchChromium } from './chromium.mjs';

const [first, prompt, nArg, expectedJson] = process.argv.slice(2);
const n = Number(nArg);
const expected = JSON.parse(expectedJson).text;
const dir = path.dirname(first);
const bytes = readdirSync(dir).filter((f) => f.endsWith('.gguf')).reduce((s, f) => s + statSync(path.join(dir, f)).size, 0);
const server = await startServer({ models: dir });
const { browser, close } = await launchChromium();
let ok = false;
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  page.setDefaultTimeout(1_800_000);
  page.on('console', (m) => { if (m.type() === 'error') console.log(`  [browser] ${m.text()}`); });
  await page.goto(`${server.origin}/test/blank.html`);
  const r = await page.evaluate(async ({ url, prompt, n }) => {
    const { createEngine } = await import('/index.js');
    const t0 = performance.now();
    const engine = await createEngine({ model: url, backend: 'webgpu', cache: false });
    const load_ms = performance.now() - t0;
    const out = await engine.completions.create({ prompt, max_tokens: n, temperature: 0 });
    const info = engine.info;
    await engine.unload();
    return { load_ms, text: out.choices[0].text, usage: out.usage, info };
  }, { url: `/models/${path.basename(first)}`, prompt, n });
  console.log(`${(bytes / 2 ** 30).toFixed(2)} GiB model on ${r.info.device}`);
  console.log(`load ${(r.load_ms / 1000).toFixed(1)} s (${(bytes / 2 ** 20 / (r.load_ms / 1000)).toFixed(0)} MiB/s); `
    + `text ${JSON.stringify(r.text)}; expected ${JSON.stringify(expected)}`);
  ok = r.info.backend === 'webgpu' && bytes > 2 ** 32 && r.text === expected;
} finally {
  await close();
  await server.close();
}
console.log(ok ? 'ok: a model over 4 GiB loaded in wasm32 and generated the CLI\'s text' : 'FAIL');
process.exit(ok ? 0 : 1);
