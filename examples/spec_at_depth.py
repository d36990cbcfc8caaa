#!/usr/bin/env python3
"""Speculative decoding at depth: each drafter against plain decoding after
a long real context, side by side in one process (`run --compare`).

The contexts are Python standard-library modules (offline and the same on
every machine with the same Python), cut to about DEPTH tokens, each followed
by a request about it, in the model's chat template, greedy. For every
drafter and prompt it prints plain and speculative tok/s (medians of
alternating runs), the speedup, tau (tokens per speculative round) and
whether the output is token-identical; then each drafter's median speedup.

  python3 examples/spec_at_depth.py --model M.gguf --depth 4096 \\
      --drafter dflash=drafters/qwen05-dflash.gguf --drafter ngram [-t 2] [-n 128]

`bench --depth` gives the plain decode and verify costs at depth; this gives
what each drafter makes of them on text.
"""
import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (module file, request): code to read, then something to write about it.
CONTEXTS = [
    ("textwrap.py", "Write a function `wrap_paragraphs(text, width)` that uses this module "
                    "to wrap every paragraph of `text` separately, with a docstring and tests."),
    ("heapq.py", "Explain how `merge` works, then write a function `top_k_frequent(words, k)` "
                 "that uses this module."),
    ("shlex.py", "Write a function `quote_command(args)` that uses this module to build a shell "
                 "command line, and explain when `split` and `quote` disagree."),
]


def context(path: Path, chars: int) -> str:
    """The module's first `chars` characters, cut at a line end."""
    text = path.read_text()
    if len(text) > chars:
        text = text[: text.rfind("\n", 0, chars) + 1]
    return text


def run(args, prompt: str, drafter: str) -> dict:
    cmd = [args.blockdraft, "run", "-m", str(args.model), "-p", prompt, "--chat", "--temp", "0",
           "-n", str(args.n), "-t", str(args.threads), "--json", "--draft", drafter,
           "--compare", "--compare-runs", str(args.compare_runs)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {drafter}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--drafter", action="append", required=True,
                    help="NAME=PATH (a drafter GGUF or a draft model), or `ngram`")
    ap.add_argument("--depth", type=int, default=4096, help="tokens of context, about")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--compare-runs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=len(CONTEXTS))
    ap.add_argument("--blockdraft", default=str(ROOT / "target/release/blockdraft"))
    ap.add_argument("--json", type=Path, help="write every run's statistics here")
    args = ap.parse_args()

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # Python source is about 4.2 characters a token for these tokenizers.
    chars = int(args.depth * 4.2)
    prompts = [f"```python\n{context(stdlib / name, chars)}```\n\n{request}"
               for name, request in CONTEXTS[: args.limit]]
    rows, speedups = [], {}
    print(f"{'drafter':<12} {'module':<12} {'context':>7} {'plain':>8} {'spec':>8} "
          f"{'speedup':>7} {'tau':>5}  identical")
    for spec in args.drafter:
        name, _, path = spec.partition("=")
        drafter = path or name
        for (module, _), prompt in zip(CONTEXTS, prompts):
            stats = run(args, prompt, drafter)
            s, c = stats["stats"], stats["stats"]["compare"]
            rows.append({"drafter": name, "module": module, **s})
            speedups.setdefault(name, []).append(c["speedup"])
            print(f"{name:<12} {module:<12} {s['prompt_tokens']:>7} "
                  f"{c['plain_decode_tokens_per_second']:>8.2f} "
                  f"{c['speculative_decode_tokens_per_second']:>8.2f} {c['speedup']:>6.3f}x "
                  f"{s['tau']:>5.2f}  {c['identical_output']}", flush=True)
    for name, xs in speedups.items():
        print(f"{name}: median speedup {statistics.median(xs):.3f}x, worst {min(xs):.3f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
