#!/usr/bin/env python3
"""Measure drafters on held-out prompts with blockdraft itself, side by side.

For every drafter and prompt (chat template, greedy):
  tau run   `--fixed-draft --draft-max B-1`: tokens per round when every
            round drafts a whole block (the drafter's own quality);
  speed run `--compare` with the default policy: speculative vs plain decode
            tok/s measured in the same process, and whether the output is
            token-identical (`--no-tau`: these runs only, and the tau and
            acceptance columns then describe the policy's own drafts).
Prints one table (tau, per-slot acceptance, speedup median / min, identical),
with the runs whose greedy output loops (a repeated 8-gram 3+ times) counted
apart, since a loop inflates tau without saying anything about the drafter.

  python3 training/evaluate.py --model M.gguf --prompts data/prompts/chat-heldout.jsonl \
      --drafter dflash=drafters/smollm2-dflash.gguf --drafter ngram [--limit 20] [-n 128] [-t 2]
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def loops(tokens, n=8, times=3):
    seen = {}
    for i in range(len(tokens) - n + 1):
        k = tuple(tokens[i:i + n])
        seen[k] = seen.get(k, 0) + 1
        if seen[k] >= times:
            return True
    return False


def run(bd, args, prompt, draft, extra):
    cmd = [bd, "run", "-m", str(args.model), "-p", prompt, "--chat", "--temp", "0",
           "-n", str(args.n), "-t", str(args.threads), "--json", "--draft", draft, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[:6])}...: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--drafter", action="append", required=True,
                    help="NAME=PATH (a drafter GGUF or a draft model), or `ngram`")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--no-speed", action="store_true", help="tau runs only")
    ap.add_argument("--no-tau", action="store_true", help="speed runs only (the policy's choices)")
    ap.add_argument("--compare-runs", type=int, default=3,
                    help="timings each way per speed run (medians; one short run is mostly noise)")
    ap.add_argument("--blockdraft", default=str(ROOT / "target/release/blockdraft"))
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    args = ap.parse_args()
    prompts = [json.loads(l)["prompt"] for l in args.prompts.read_text().splitlines() if l.strip()]
    prompts = prompts[:args.limit]
    rows, dump = [], {}
    for spec in args.drafter:
        name, _, path = spec.partition("=")
        path = path or name
        acc = {"rounds": 0, "produced": 0, "slot_n": None, "slot_ok": None, "loop_runs": 0,
               "tau_noloop": [], "speedups": [], "identical": 0, "runs": 0}
        per_run = []
        for p in prompts:
            if args.no_tau:
                t = run(args.blockdraft, args, p, path, ["--compare", "--compare-runs", str(args.compare_runs)])
            else:
                t = run(args.blockdraft, args, p, path,
                        ["--fixed-draft", "--draft-max", str(args.block - 1), "--draft-min", str(args.block - 1)])
            st = t["stats"]
            looped = loops(t["tokens"])
            acc["loop_runs"] += looped
            if not looped:
                acc["tau_noloop"].append((st["rounds"], st["accepted"] + st["rounds"]))
            acc["rounds"] += st["rounds"]
            acc["produced"] += st["accepted"] + st["rounds"]
            slots = st.get("per_slot_acceptance") or []
            rec = {"prompt": p[:60], "tau": st["tau"], "loop": looped, "slots": slots}
            if not args.no_speed:
                s = t if args.no_tau else run(args.blockdraft, args, p, path,
                                              ["--compare", "--compare-runs", str(args.compare_runs)])
                c = s["stats"]["compare"]
                acc["speedups"].append(c["speedup"])
                acc["identical"] += c["identical_output"]
                rec.update(speedup=c["speedup"], identical=c["identical_output"])
            acc["runs"] += 1
            per_run.append(rec)
            print(json.dumps({"drafter": name, **rec}), file=sys.stderr, flush=True)
        # Per-slot acceptance: the share of rounds whose slot k was accepted.
        n_slot = [0] * (args.block - 1)
        ok_slot = [0.0] * (args.block - 1)
        for r in per_run:
            for k, v in enumerate(r["slots"][:args.block - 1]):
                n_slot[k] += 1
                ok_slot[k] += v
        tau = acc["produced"] / max(1, acc["rounds"])
        nl = acc["tau_noloop"]
        tau_nl = sum(b for _, b in nl) / max(1, sum(a for a, _ in nl))
        row = {"drafter": name, "tau": round(tau, 3), "tau_without_loops": round(tau_nl, 3),
               "loop_runs": acc["loop_runs"], "runs": acc["runs"],
               "slot_acceptance": [round(o / max(1, n), 3) for o, n in zip(ok_slot, n_slot)]}
        if acc["speedups"]:
            row.update(speedup_median=round(statistics.median(acc["speedups"]), 3),
                       speedup_min=round(min(acc["speedups"]), 3),
                       identical=f"{acc['identical']}/{acc['runs']}")
        rows.append(row)
        dump[name] = per_run
    print(f"{args.model.name}, {len(prompts)} held-out prompts from {args.prompts.name}, "
          f"-n {args.n}, {args.threads} threads, block {args.block}")
    for r in rows:
        print(json.dumps(r))
    if args.json:
        args.json.write_text(json.dumps({"summary": rows, "runs": dump}, indent=1))


if __name__ == "__main__":
    main()
