#!/usr/bin/env python3
"""Offline sanity check of tests/fixtures/llamacpp/*.json (no llama.cpp needed).

Checks the schema written by make_llamacpp_fixtures.py, token-id ranges, that
greedy tokens equal the top-1 of the raw distribution (except where EOG was
banned by ignore_eos), that top log-probs are sorted and <= 0, and file sizes.
Usage: python3 tests/reference/check_llamacpp_fixtures.py [FIXTURE_DIR]
"""
import glob
import json
import os
import sys

HEADER = ["model", "sha256", "llama_cpp_commit", "llama_cpp_version", "server_command", "n_vocab", "add_bos"]


def check_tokenize(doc, errs):
    n = doc["n_vocab"]
    combos = {}
    for c in doc["cases"]:
        for k in ("text", "add_special", "parse_special", "ids"):
            if k not in c:
                errs.append(f"case missing {k}")
        if not all(isinstance(i, int) and 0 <= i < n for i in c["ids"]):
            errs.append(f"id out of range in {c['text'][:30]!r}")
        combos.setdefault(c["text"], set()).add((c["add_special"], c["parse_special"]))
    if len(combos) < 30:
        errs.append(f"only {len(combos)} texts")
    for t, s in combos.items():
        if len(s) != 4:
            errs.append(f"text {t[:30]!r} lacks some add_special/parse_special combos")


def check_greedy(doc, errs):
    n = doc["n_vocab"]
    npred = doc["request"]["n_predict"]
    nprobs = doc["request"]["n_probs"]
    if len(doc["prompts"]) < 4:
        errs.append("fewer than 4 prompts")
    for p in doc["prompts"]:
        name = p["name"]
        for k in ("prompt_tokens", "tokens", "logprobs", "top_logprobs", "ignore_eos"):
            if k not in p:
                errs.append(f"{name}: missing {k}")
        if len(p["tokens"]) != npred or len(p["top_logprobs"]) != npred or len(p["logprobs"]) != npred:
            errs.append(f"{name}: wrong lengths")
        for i in p["prompt_tokens"] + p["tokens"]:
            if not 0 <= i < n:
                errs.append(f"{name}: id {i} out of range")
        for pos, (t, lp, top) in enumerate(zip(p["tokens"], p["logprobs"], p["top_logprobs"])):
            if len(top) != nprobs:
                errs.append(f"{name}@{pos}: {len(top)} top entries")
            lps = [e[1] for e in top]
            if any(a < b - 1e-6 for a, b in zip(lps, lps[1:])) or any(x > 1e-6 for x in lps):
                errs.append(f"{name}@{pos}: top log-probs not sorted / positive")
            if top[0][0] != t and not p["ignore_eos"]:
                errs.append(f"{name}@{pos}: greedy token {t} != top-1 {top[0][0]}")
            if top[0][0] == t and abs(top[0][1] - lp) > 1e-4:
                errs.append(f"{name}@{pos}: logprob mismatch")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "..", "fixtures", "llamacpp")
    files = sorted(glob.glob(os.path.join(d, "*.json")))
    if not files:
        sys.exit(f"no fixtures in {d}")
    bad = 0
    for f in files:
        errs = []
        doc = json.load(open(f, encoding="utf-8"))
        for k in HEADER:
            if k not in doc:
                errs.append(f"missing header field {k}")
        if os.path.getsize(f) > 300_000:
            errs.append("file over 300 KB")
        base = os.path.basename(f)
        if base.startswith("tokenize-"):
            check_tokenize(doc, errs)
        elif base.startswith("greedy-"):
            check_greedy(doc, errs)
        print(f"{base}: {'ok' if not errs else 'FAIL'}")
        for e in errs[:20]:
            print("   ", e)
        bad += bool(errs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
