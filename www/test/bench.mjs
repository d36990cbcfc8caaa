// Plain vs speculative decoding through the package in headless Chromium,
// side by side in one run (repetitions alternate, so drift hits both):
//   node www/test/bench.mjs MODEL [BACKEND=cpu] [DRAFTER=ngram] [N=64] [REPS=3]
// Prints the load time, the median decode tokens/s of each and their ratio.
// Needs pkg/ (test/build.sh; PROFILE=release for the published build).
import { startServer } from '../demo/serve.mjs';
import { launchChromium } from './chromium.mjs';

const [model, backend = 'cpu', drafter = 'ngram', nArg = '64', repsArg = '3'] = process.argv.slice(2);
if (!model) {
  console.error('usage: node www/test/bench.mjs MODEL [BACKEND] [DRAFTER] [N] [REPS]');
  process.exit(2);
}
const files = { '/model.gguf': model };
if (drafter !== 'ngram') files['/drafter.gguf'] = drafter;
const server = await startServer({ files });
const { browser, close } = await launchChromium({ webgpu: backend !== 'cpu' });
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  page.setDefaultTimeout(3_600_000);
  await page.goto(`${server.origin}/test/blank.html`);
  const r = await page.evaluate(async ({ backend, drafter, n, reps }) => {
    const { createEngine } = await import('/index.js');
    const t0 = performance.now();
    const engine = await createEngine({
      model: '/model.gguf', drafter: drafter === 'ngram' ? 'ngram' : '/drafter.gguf', backend, cache: false,
    });
    const load_s = (performance.now() - t0) / 1000;
    // Repetitive output, where drafts can be right.
    const content = 'Repeat this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes, '
      + 'honeydew, kiwis, lemons, mangoes, nectarines, oranges, papayas, quinces, raspberries.';
    const runs = [];
    for (let i = 0; i < reps; i++) {
      for (const speculative of [false, true]) {
        const out = await engine.chat.completions.create({
          messages: [{ role: 'user', content }], max_tokens: n, temperature: 0, speculative,
        });
        runs.push({ speculative, tps: out.usage.timings.decode_tokens_per_second, spec: out.usage.speculative,
          text: out.choices[0].message.content });
      }
    }
    const info = engine.info;
    await engine.unload();
    return { load_s, runs, info };
  }, { backend, drafter, n: Number(nArg), reps: Number(repsArg) });
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const plain = r.runs.filter((x) => !x.speculative);
  const spec = r.runs.filter((x) => x.speculative);
  const [p, s] = [median(plain.map((x) => x.tps)), median(spec.map((x) => x.tps))];
  const last = spec[spec.length - 1].spec;
  console.log(`${r.info.device}; drafter ${r.info.drafter}; load ${r.load_s.toFixed(2)} s`);
  console.log(`plain       ${plain.map((x) => x.tps.toFixed(2)).join(' ')}  median ${p.toFixed(2)} tok/s`);
  console.log(`speculative ${spec.map((x) => x.tps.toFixed(2)).join(' ')}  median ${s.toFixed(2)} tok/s`);
  console.log(`ratio ${(s / p).toFixed(2)}x; last run: ${last ? `${last.rounds} rounds, acceptance ${(100 * last.acceptance_rate).toFixed(0)} %, tau ${last.tau.toFixed(2)}` : 'no drafting'}; `
    + `same text: ${new Set(r.runs.map((x) => x.text)).size === 1}`);
} finally {
  await close();
  await server.close();
}
