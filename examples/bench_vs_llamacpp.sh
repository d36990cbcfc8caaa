#!/usr/bin/env bash
# blockdraft's CPU backend and llama.cpp's llama-bench side by side, on the same
# GGUF files and thread counts, in one run (each shape measured by both
# runtimes back to back, so both see the same machine load):
#   decode   tg64: tokens/s generating 64 tokens
#   prefill  pp128: tokens/s over a 128-token prompt
#   verify   T(k)/T(1) for k = 1, 2, 4, 8, 16 rows after a 64-token context
#            (llama-bench -p k -n 0 -d 64). blockdraft computes logits for all
#            k rows, as a verify needs; llama-bench only for the last one.
#   paired   tg64 again in PAIRED rounds that alternate the two runtimes
#            (3 repetitions each, the order swapped every round): the median
#            of the per-round ratios, which the machine's drift between the
#            blocks of measurements above does not move (on a shared VM the
#            tg64 ratio of the blocks swung by 0.15 between runs)
#   depth    tg64 after D tokens of context, for each D of DEPTHS
#            (llama-bench -n 64 -d D; blockdraft bench --depth D), and
#            blockdraft's T(8)/T(1) there (llama-bench would refill the
#            context for every k).
#   parallel aggregate tg64 of N sequences decoded together after 16-token
#            prompts, for each N of PARALLEL (llama-batched-bench -npp 16
#            -ntg 64 -npl N, its S_TG; blockdraft bench --parallel N).
# Prints one table with medians and blockdraft/llama.cpp ratios, and the decode's
# weight bytes per second against this machine's memory read bandwidth measured
# beside it by `blockdraft bench`.
#
# Usage: examples/bench_vs_llamacpp.sh [MODEL...]   (smollm2 qwen05 qwen15 gemma;
#        default: smollm2 qwen05 qwen15)
# Environment: LLAMA_BENCH (default: ../llama.cpp/build/bin/llama-bench beside
#              the project; llama-batched-bench is looked for beside it),
#              THREADS (default: "1 2"), REPS (default: 3),
#              PAIRED (default: 4; 0 skips the paired rounds),
#              DEPTHS (default: "4096"; "" skips them, e.g. "4096 16384";
#              each must fit every model's context: SmolLM2 has 8192),
#              PARALLEL (default: "1 2 4 8"; "" skips them).
# On a VM whose CPU lists AMX without enabling it, a GGML_NATIVE build of
# llama.cpp dies with SIGILL in prompt passes: configure it with
# -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
# -DGGML_AVX512_VNNI=ON (and the other AVX-512 flags the CPU has) instead.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_BENCH="${LLAMA_BENCH:-../llama.cpp/build/bin/llama-bench}"
THREADS="${THREADS:-1 2}"
REPS="${REPS:-3}"
PAIRED="${PAIRED:-4}"
DEPTHS="${DEPTHS-4096}"
PARALLEL="${PARALLEL-1 2 4 8}"
LLAMA_BATCHED="$(dirname "$LLAMA_BENCH")/llama-batched-bench"
KS="1,2,4,8,16"
[ -x "$LLAMA_BENCH" ] || {
    echo "llama-bench not found at $LLAMA_BENCH (build llama.cpp beside the project or set LLAMA_BENCH)" >&2
    exit 1
}
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(smollm2 qwen05 qwen15)

cargo build --release -q -p blockdraft-cli
bd=target/release/blockdraft
out=$(mktemp -d)
# Kept when a step fails, so that what was measured is not lost.
trap 'if [ $? -eq 0 ]; then rm -rf "$out"; else echo "measurements so far: $out" >&2; fi' EXIT

# tg64 of each runtime for one paired round (JSON to $3): 3 repetitions, the
# median taken below (a single llama-bench repetition, right after its
# one-token warm-up, read about 10 % slow).
paired_ours() {
    "$bd" bench -m "$1" -t "$2" -p 0 -n 64 -r 3 --verify-max 0 --json >"$3" 2>/dev/null
}
paired_llama() {
    "$LLAMA_BENCH" -m "$1" -t "$2" -p 0 -n 64 -r 3 -o json >"$3" 2>/dev/null
}

for key in "${models[@]}"; do
    m=$(tests/fetch_models.sh "$key")
    for t in $THREADS; do
        echo "measuring $key, $t thread(s)..." >&2
        "$bd" bench -m "$m" -t "$t" -p 128 -n 64 -r "$REPS" --verify-max 16 --verify-ctx 64 --json \
            >"$out/$key.$t.bd.json"
        "$LLAMA_BENCH" -m "$m" -t "$t" -p 128 -n 64 -r "$REPS" -o json \
            >"$out/$key.$t.ll.json" 2>/dev/null
        "$LLAMA_BENCH" -m "$m" -t "$t" -p "$KS" -n 0 -d 64 -r "$REPS" -o json \
            >"$out/$key.$t.llv.json" 2>/dev/null
        for round in $(seq "$PAIRED"); do
            ours=(paired_ours "$m" "$t" "$out/$key.$t.pair$round.bd.json")
            theirs=(paired_llama "$m" "$t" "$out/$key.$t.pair$round.ll.json")
            if [ $((round % 2)) -eq 1 ]; then
                "${ours[@]}" && "${theirs[@]}"
            else
                "${theirs[@]}" && "${ours[@]}"
            fi
        done
        if [ -n "$DEPTHS" ]; then
            "$bd" bench -m "$m" -t "$t" -p 0 -n 64 -r "$REPS" --depth "${DEPTHS// /,}" --json \
                >"$out/$key.$t.bdd.json"
            "$LLAMA_BENCH" -m "$m" -t "$t" -p 0 -n 64 -d "${DEPTHS// /,}" -r "$REPS" -o json \
                >"$out/$key.$t.lld.json" 2>/dev/null
        fi
        if [ -n "$PARALLEL" ]; then
            "$bd" bench -m "$m" -t "$t" -p 0 -n 64 -r "$REPS" --verify-max 0 --parallel "${PARALLEL// /,}" \
                --json >"$out/$key.$t.bdp.json"
            # llama-batched-bench has no repetitions: REPS runs, medians taken below.
            for _ in $(seq "$REPS"); do
                "$LLAMA_BATCHED" -m "$m" -t "$t" -c 4096 -b 512 -ub 512 -npp 16 -ntg 64 \
                    -npl "${PARALLEL// /,}" --output-format jsonl 2>/dev/null | grep '^{'
            done >"$out/$key.$t.llp.jsonl"
        fi
    done
done

python3 - "$out" "$KS" "$DEPTHS" "$PARALLEL" "$PAIRED" "${models[@]}" <<'EOF'
import json, statistics, sys
out, ks, models = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], sys.argv[6:]
paired_rounds = int(sys.argv[5])
depths = [int(d) for d in sys.argv[3].split()]
parallel = [int(n) for n in sys.argv[4].split()]
threads = sorted({int(f.split(".")[1]) for f in __import__("os").listdir(out)})

def llama_tps(rows, n_prompt, n_gen, depth=0):
    for r in rows:
        if (r["n_prompt"], r["n_gen"], r.get("n_depth", 0)) == (n_prompt, n_gen, depth):
            return statistics.median(r["samples_ts"])
    raise SystemExit(f"llama-bench gave no row for pp{n_prompt} tg{n_gen} d{depth}")

print(f"{'model':8} {'thr':>3} {'metric':10} {'blockdraft':>11} {'llama.cpp':>10} {'ratio':>6}")
for key in models:
    for t in threads:
        bd = json.load(open(f"{out}/{key}.{t}.bd.json"))
        ll = json.load(open(f"{out}/{key}.{t}.ll.json"))
        llv = json.load(open(f"{out}/{key}.{t}.llv.json"))
        rows = [
            ("tg64 t/s", bd["decode_tokens_per_second"], llama_tps(ll, 0, 64)),
            ("pp128 t/s", bd["prefill_tokens_per_second"], llama_tps(ll, 128, 0)),
        ]
        # T(k)/T(1): seconds per pass relative to one row (blockdraft's the
        # median of its sweeps' ratios; llama-bench measures k by k).
        bd_r = {v["k"]: v["ratio"] for v in bd["verify"]}
        ll_t = {k: k / llama_tps(llv, k, 0, 64) for k in ks}
        for k in ks[1:]:
            rows.append((f"T({k})/T(1)", bd_r[k], ll_t[k] / ll_t[1]))
        if depths:
            bdd = {e["depth"]: e for e in json.load(open(f"{out}/{key}.{t}.bdd.json"))["depth"]}
            lld = json.load(open(f"{out}/{key}.{t}.lld.json"))
            for d in depths:
                rows.append((f"tg64 @{d}", bdd[d]["decode_tokens_per_second"], llama_tps(lld, 0, 64, d)))
        rows_own = []
        if depths:
            # The verify curve at depth, blockdraft's alone (llama-bench would
            # refill the context for every k): against T(8)/T(1) at 64 above.
            for d in depths:
                ratio = {v["k"]: v["ratio"] for v in bdd[d]["verify"]}
                if 8 in ratio:
                    rows_own.append((f"T(8)/T(1) @{d}", ratio[8]))
        if parallel:
            bdp = {e["sequences"]: e for e in json.load(open(f"{out}/{key}.{t}.bdp.json"))["parallel"]}
            llp = [json.loads(line) for line in open(f"{out}/{key}.{t}.llp.jsonl")]
            for n in parallel:
                ll_n = statistics.median(r["speed_tg"] for r in llp if r["pl"] == n)
                rows.append((f"par {n} t/s", bdp[n]["decode_tokens_per_second"], ll_n))
        for name, a, b in rows:
            print(f"{key:8} {t:>3} {name:10} {a:11.2f} {b:10.2f} {a / b:6.2f}")
        pairs = [
            (
                json.load(open(f"{out}/{key}.{t}.pair{r}.bd.json"))["decode_tokens_per_second"],
                llama_tps(json.load(open(f"{out}/{key}.{t}.pair{r}.ll.json")), 0, 64),
            )
            for r in range(1, paired_rounds + 1)
        ]
        if pairs:
            ratios = sorted(a / b for a, b in pairs)
            print(
                f"{key:8} {t:>3} {'tg64 pair':10} {statistics.median(a for a, _ in pairs):11.2f} "
                f"{statistics.median(b for _, b in pairs):10.2f} {statistics.median(ratios):6.2f}"
                f"   median of {len(pairs)} alternating rounds' ratios (range {ratios[0]:.2f}-{ratios[-1]:.2f})"
            )
        gbs, read = bd["decode_gb_per_second"], bd["memory_read_gb_per_second"]
        print(f"{key:8} {t:>3} {'GB/s dec':10} {gbs:11.2f} {'':>10} {'':>6}   peak RSS {bd['peak_rss_bytes'] / 1e6:.0f} MB")
        print(f"{key:8} {t:>3} {'GB/s read':10} {read:11.2f} {'':>10} {'':>6}   decode at {100 * gbs / read:.0f} % of it")
EOF
