// Plain vs speculative decoding through the package in headless Chromium,
// side by side in one run (repetitions alternate, so drift hits both):
//   node www/test/bench.mjs MODEL [BACKEND=cpu] [DRAFTER=ngram] [N=64] [REPS=3] [PROMPTS.jsonl] [LIMIT=8]
// Prints the load time, the median decode tokens/s of each and their ratio.
// With PROMPTS (lines of {"prompt": ...}, e.g. the held-out prompts of
// training/prompts.py), each of the first LIMIT prompts is timed REPS times
// each way and the table gives each prompt's ratio of medians, then their
// median and minimum; without, one repetitive request where drafts can be
// right. Needs pkg/ (test/build.sh; PROFILE=release for the published build).
import { readFileSync } from 'node:fs';
import { startServer } from '../demo/serve.mjs';
import { launchChromium } from './chromium.mjs';

const [model, backend = 'cpu', drafter = 'ngram', nArg = '64', repsArg = '3', promptsFile, limitArg = '8']
  = process.argv.slice(2);
if (!model) {
  console.error('usage: node www/test/bench.mjs MODEL [BACKEND] [DRAFTER] [N] [REPS] [PROMPTS.jsonl] [LIMIT]');
  process.exit(2);
}
const prompts = promptsFile
  ? readFileSync(promptsFile, 'utf8').split('\n').filter((l) => l.trim()).slice(0, Number(limitArg))
    .map((l) => JSON.parse(l).prompt)
  : ['Repeat this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes, '
    + 'honeydew, kiwis, lemons, mangoes, nectarines, oranges, papayas, quinces, raspberries.'];
const files = { '/model.gguf': model };
if (drafter !== 'ngram') files['/drafter.gguf'] = drafter;
const server = await startServer({ files });
const { browser, close } = await launchChromium({ webgpu: backend !== 'cpu' });
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  page.setDefaultTimeout(3_600_000);
  await page.goto(`${server.origin}/test/blank.html`);
  const r = await page.evaluate(async ({ backend, drafter, n, reps, prompts }) => {
    const { createEngine } = await import('/index.js');
    const t0 = performance.now();
    const engine = await createEngine({
      model: '/model.gguf', drafter: drafter === 'ngram' ? 'ngram' : '/drafter.gguf', backend, cache: false,
    });
    const load_s = (performance.now() - t0) / 1000;
    const runs = [];
    for (const [prompt, content] of prompts.entries()) {
      for (let i = 0; i < reps; i++) {
        // Alternate which goes first, so a warming or throttling machine
        // weighs on both.
        for (const speculative of i % 2 ? [true, false] : [false, true]) {
          const out = await engine.chat.completions.create({
            messages: [{ role: 'user', content }], max_tokens: n, temperature: 0, speculative,
          });
          runs.push({ prompt, speculative, tps: out.usage.timings.decode_tokens_per_second,
            spec: out.usage.speculative, text: out.choices[0].message.content });
        }
      }
    }
    const info = engine.info;
    await engine.unload();
    return { load_s, runs, info };
  }, { backend, drafter, n: Number(nArg), reps: Number(repsArg), prompts });
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(`${r.info.device}; drafter ${r.info.drafter}; load ${r.load_s.toFixed(2)} s; `
    + `${prompts.length} prompt(s), ${nArg} tokens, ${repsArg} runs each way`);
  const ratios = [];
  for (const prompt of prompts.keys()) {
    const mine = r.runs.filter((x) => x.prompt === prompt);
    const plain = mine.filter((x) => !x.speculative);
    const spec = mine.filter((x) => x.speculative);
    const [p, s] = [median(plain.map((x) => x.tps)), median(spec.map((x) => x.tps))];
    ratios.push(s / p);
    const last = spec[spec.length - 1].spec;
    console.log(`prompt ${prompt}: plain ${plain.map((x) => x.tps.toFixed(2)).join(' ')} (median ${p.toFixed(2)}), `
      + `speculative ${spec.map((x) => x.tps.toFixed(2)).join(' ')} (median ${s.toFixed(2)}) tok/s: `
      + `${(s / p).toFixed(3)}x; ${last ? `${last.rounds} rounds, acceptance ${(100 * last.acceptance_rate).toFixed(0)} %, tau ${last.tau.toFixed(2)}` : 'no drafting'}; `
      + `same text: ${new Set(mine.map((x) => x.text)).size === 1}`);
  }
  console.log(`speedup median ${median(ratios).toFixed(3)}x, min ${Math.min(...ratios).toFixed(3)}x over ${ratios.length} prompt(s)`);
} finally {
  await close();
  await server.close();
}
