// Whether a text the browser generated greedily is what the native CLI
// would write, up to near ties. The browser's kernels sum in other orders
// than the native ones (wasm simd128 against AVX2), so where the two sit on
// a near tie their greedy texts part. A text the CLI did not write is held
// to what such a difference can explain: the CLI scores it (forced
// decoding after the same prompt tokens) and every generated token must be
// its argmax or within NEAR_TIE nats of it.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const NEAR_TIE = 0.25;

// cliJson: the CLI's `run --json` output (its prompt_tokens and text);
// kvType: the cache type it ran with; repeatPenalty: the one it sampled
// with (its margins are those of the penalized logits). Returns { ok, how }.
export function agreesWithCli({ model, cliJson, text, kvType = 'f16', repeatPenalty = 1 }) {
  const want = JSON.parse(cliJson);
  if (text === want.text) return { ok: true, how: 'identical' };
  const cli = process.env.CLI;
  if (!cli) return { ok: false, how: 'differs (set CLI to a blockdraft binary to score it)' };
  const run = (...args) => JSON.parse(execFileSync(cli, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }));
  const promptIds = want.prompt_tokens;
  const ids = promptIds.concat(run('tokenize', '--no-bos', '-m', model, text));
  const dir = mkdtempSync(join(tmpdir(), 'bd-score-'));
  try {
    writeFileSync(join(dir, 'ids.json'), JSON.stringify(ids));
    const { positions } = run('score', '-m', model, '--kv-type', kvType,
      '--repeat-penalty', String(repeatPenalty), '--tokens', join(dir, 'ids.json'));
    // positions[i] predicts ids[i + 1]: the generated ones from the prompt's last.
    const margins = positions.slice(promptIds.length - 1).map((p) => p.argmax_logprob - p.logprob);
    const worst = Math.max(...margins);
    return { ok: worst <= NEAR_TIE, how: `differs; worst margin under the CLI's argmax ${worst.toFixed(3)} nats, near tie ≤ ${NEAR_TIE}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
