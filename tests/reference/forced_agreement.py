#!/usr/bin/env python3
"""Top-1 agreement with llama.cpp on any GGUF file, without committed traces:
greedy continuations from an already-built `llama-server` (the prompts and
requests of make_llamacpp_fixtures.py), then `blockdraft score` forced decoding
of each prompt + continuation in one pass, counting the positions where
blockdraft's argmax is llama.cpp's token (llama.cpp's top-2 within 0.05:
excluded as near ties). For files the fixtures do not cover, e.g. a model
requantized by `llama-quantize` to a type no registry model has:

  llama-quantize --allow-requantize qwen2.5-coder-1.5b-instruct-q4_k_m.gguf q.gguf IQ4_XS
  python3 tests/reference/forced_agreement.py BIN_DIR q.gguf target/release/blockdraft \
      [--config default|precise] [-- SCORE_FLAGS...]

One pass over each whole sequence is not llama-server's schedule (prompt, then
a token per pass), so where batch shape changes llama.cpp's float sequence the
figure sits a little under the committed-trace tests' (run it on a registry
model beside for the baseline). Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llamacpp_fixtures as mk  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir", help="llama.cpp build's bin dir (holding llama-server)")
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("blockdraft", help="blockdraft binary")
    ap.add_argument("--config", default="default", choices=sorted(mk.CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("score_flags", nargs="*", help="extra flags for `blockdraft score` (after --)")
    args = ap.parse_args()
    kv = "f32" if args.config == "precise" else "f16"
    key = "forced"
    mk.MODELS[key] = (os.path.basename(args.model), "", True)
    log = os.path.join(tempfile.gettempdir(), "forced-agreement-server.log")
    srv = mk.Server(os.path.join(args.bin_dir, "llama-server"), args.model, args.threads, 4096, log,
                    args.config)
    try:
        srv.wait_ready()
        _, n_vocab = mk.model_meta(srv)
        traces = mk.make_greedy(key, srv, {"n_vocab": n_vocab}, args.n_predict, 2)
    finally:
        srv.stop()
    agree = total = ties = 0
    for t in traces:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(t["prompt_tokens"] + t["tokens"], f)
        cmd = [args.blockdraft, "score", "-m", args.model, "-t", str(args.threads), "--kv-type", kv,
               "--tokens", f.name] + args.score_flags
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        os.unlink(f.name)
        argmax = [p["argmax"] for p in json.loads(out)["positions"]]
        first = len(t["prompt_tokens"]) - 1
        for i, tok in enumerate(t["tokens"]):
            top = t["top_logprobs"][i]
            if top[0][1] - top[1][1] < 0.05:
                ties += 1
                continue
            total += 1
            agree += argmax[first + i] == tok
    print(f"{os.path.basename(args.model)} ({args.config}, score {' '.join(args.score_flags)}): "
          f"{agree}/{total} = {100 * agree / total:.2f} % ({ties} near ties excluded)")


if __name__ == "__main__":
    main()
