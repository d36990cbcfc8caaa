#!/usr/bin/env bash
# The draft policy's promise, measured: for every drafter kind on each real
# target, speculative vs plain decoding per held-out prompt (`run --compare`,
# medians of alternating timings in one process), at each thread count.
# Prints one summary line per (target, drafter, threads) with the median and
# the worst prompt's speedup; the goal is >= 0.95x median and >= 0.85x on
# every prompt (a drafter that loses must cost almost nothing).
#
# Usage: examples/policy_table.sh [OUT_DIR]
# Environment: PROMPTS (a dir with chat-heldout.jsonl and code-heldout.jsonl,
#              from training/prompts.py; default data/prompts), LIMIT (prompts
#              per run, default 6), N (tokens, default 128), RUNS (timings each
#              way, default 3), THREADS (default "1 2"), TARGETS (default
#              "smollm2 qwen05 qwen15"), BLOCKDRAFT (the binary, default the
#              release build, made here), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

PROMPTS="${PROMPTS:-data/prompts}"
LIMIT="${LIMIT:-6}" N="${N:-128}" RUNS="${RUNS:-3}" THREADS="${THREADS:-1 2}"
PYTHON="${PYTHON:-python3}" TARGETS="${TARGETS:-smollm2 qwen05 qwen15}"
OUT="${1:-policy-table}"
mkdir -p "$OUT"
[ -f "$PROMPTS/chat-heldout.jsonl" ] || {
    echo "no $PROMPTS/chat-heldout.jsonl: run training/prompts.py --out $PROMPTS first" >&2
    exit 1
}
if [ -z "${BLOCKDRAFT:-}" ]; then
    cargo build --release -q -p blockdraft-cli
    BLOCKDRAFT=target/release/blockdraft
fi
smol=$(tests/fetch_models.sh smollm2)
q05=$(tests/fetch_models.sh qwen05)
q15=$(tests/fetch_models.sh qwen15)

measure() { # name model prompts drafter...
    local name=$1 model=$2 prompts=$3 t
    shift 3
    for t in $THREADS; do
        "$PYTHON" training/evaluate.py --model "$model" --prompts "$PROMPTS/$prompts" \
            --limit "$LIMIT" -n "$N" -t "$t" --no-tau --compare-runs "$RUNS" \
            --blockdraft "$BLOCKDRAFT" --json "$OUT/$name-t$t.json" "$@" 2>/dev/null | tail -n +2 |
            sed "s/^/$name t=$t /"
    done
}
# Every drafter kind on every target. Where no drafter of a kind is made
# for a target, one that loses stands in (the promise is about those too):
# SmolLM2 drafting for itself (always right, as dear as the target),
# Qwen2.5-Coder-1.5B drafting for 0.5B (slower than its target), a DFlash
# drafter with random weights (never right) for 1.5B.
for target in $TARGETS; do
    case $target in
    smollm2) measure smollm2 "$smol" chat-heldout.jsonl --drafter dflash=drafters/smollm2-dflash.gguf \
        --drafter ngram --drafter draft-model-self="$smol" ;;
    qwen05) measure qwen05 "$q05" code-heldout.jsonl --drafter dflash=drafters/qwen05-dflash.gguf \
        --drafter ngram --drafter draft-model-1.5b="$q15" ;;
    qwen15) measure qwen15 "$q15" code-heldout.jsonl --drafter draft-model="$q05" --drafter ngram \
        --drafter dflash-random ;;
    *) echo "unknown target $target (smollm2, qwen05, qwen15)" >&2; exit 1 ;;
    esac
done
