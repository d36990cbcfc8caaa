#!/usr/bin/env python3
"""A shipped drafter in llama.cpp's `draft-dflash` beside blockdraft: the same
GGUF, the same prompts (chat template applied), greedy, whole blocks of
B − 1 = 7 drafted tokens every round; τ (tokens per round) from each runtime.

The file follows the schema if llama.cpp loads it and drafts as well with it
as blockdraft does: a misread tap, norm or mask would leave llama.cpp's τ
near 1. The two runtimes' greedy texts need not be the same (llama.cpp
verifies in batches of 8 rows, whose rounding differs from its own
single-token decode, and SmolLM2 at Q4_1 has many near ties), so τ is
compared over a prompt set, not per prompt.

  python3 tests/reference/draft_dflash_tau.py --model SMOLLM2.gguf \\
      --drafter drafters/smollm2-dflash.gguf --prompts data/prompts/chat-heldout.jsonl \\
      [--limit 12] [-n 128] [-t 2] [--llama-bin ~/.cache/blockdraft/llama.cpp/build/bin]

llama.cpp reads a vocabulary from every model file: a drafter converted
with `--no-tokenizer` is first written again with the target's (`blockdraft
convert DRAFTER --target MODEL`); one that has it runs as it is in both.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 8


def blockdraft(bd, *args):
    out = subprocess.run([bd, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: blockdraft {' '.join(args[:3])}...: {out.stderr.strip()}")
    return out.stdout


def chat_text(bd, model, prompt, system):
    """The prompt as the chat template renders it (ChatML with the model's
    default system message), checked against blockdraft's own rendering."""
    text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            "<|im_start|>assistant\n")
    want = json.loads(blockdraft(bd, "run", "-m", model, "-p", prompt, "--chat", "-n", "1",
                                 "--temp", "0", "--json"))["prompt_tokens"]
    got = json.loads(blockdraft(bd, "run", "-m", model, "-p", text, "-n", "1",
                                "--temp", "0", "--json"))["prompt_tokens"]
    if got != want:
        sys.exit(f"error: the ChatML rendering with system {system!r} is not the model's template "
                 f"({len(got)} tokens against {len(want)}); pass --system")
    return text


def llamacpp_round(bin_dir, model, drafter, text, n, threads):
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", model, "-md", drafter,
           "--spec-type", "draft-dflash", "--spec-draft-n-max", str(BLOCK - 1),
           "--spec-draft-p-min", "0", "-p", text, "-n", str(n), "--temp", "0", "--top-k", "1",
           "-t", str(threads), "-c", "4096"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: llama-speculative-simple: {out.stderr.strip()[-2000:]}")
    stat = {k: int(re.search(rf"{k}\s*=\s*(\d+)", out.stderr).group(1))
            for k in ("n_predict", "n_drafted", "n_accept")}
    # Every round drafts a whole block but the last, cut to the tokens left.
    rounds = -(-stat["n_drafted"] // (BLOCK - 1))
    return rounds, stat["n_accept"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--system", help="default: SmolLM2's or Qwen2.5's own default system message")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache/blockdraft/llama.cpp/build/bin")
    ap.add_argument("--blockdraft", default=str(ROOT / "target/release/blockdraft"))
    args = ap.parse_args()
    system = args.system or ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                             if "qwen" in Path(args.model).name.lower() else
                             "You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    prompts = [json.loads(l)["prompt"] for l in args.prompts.read_text().splitlines() if l.strip()]
    prompts = prompts[:args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        with_vocab = args.drafter
        if "tokenizer.ggml.model" not in blockdraft(args.blockdraft, "inspect", args.drafter):
            with_vocab = str(Path(tmp) / "drafter.gguf")
            blockdraft(args.blockdraft, "convert", args.drafter, "--target", args.model, "-o", with_vocab)
            print(f"{args.drafter} has no tokenizer: llama.cpp runs a copy with the target's", flush=True)
        totals = {"blockdraft": [0, 0], "llama.cpp": [0, 0]}
        for i, p in enumerate(prompts):
            text = chat_text(args.blockdraft, args.model, p, system)
            st = json.loads(blockdraft(
                args.blockdraft, "run", "-m", args.model, "-p", text, "--temp", "0", "-n", str(args.n),
                "-t", str(args.threads), "--json", "--draft", args.drafter, "--fixed-draft",
                "--draft-max", str(BLOCK - 1), "--draft-min", str(BLOCK - 1)))["stats"]
            ours = (st["rounds"], st["accepted"])
            theirs = llamacpp_round(args.llama_bin, args.model, with_vocab, text, args.n, args.threads)
            for name, (rounds, accepted) in (("blockdraft", ours), ("llama.cpp", theirs)):
                totals[name][0] += rounds
                totals[name][1] += accepted
            tau = lambda r, a: (r + a) / max(1, r)  # noqa: E731
            print(json.dumps({"prompt": i, "blockdraft_tau": round(tau(*ours), 3),
                              "llamacpp_tau": round(tau(*theirs), 3)}), flush=True)
        summary = {name: {"rounds": r, "accepted": a, "tau": round((r + a) / max(1, r), 3)}
                   for name, (r, a) in totals.items()}
        print(json.dumps({"model": Path(args.model).name, "drafter": Path(args.drafter).name,
                          "prompts": len(prompts), "n": args.n, **summary}))


if __name__ == "__main__":
    main()
