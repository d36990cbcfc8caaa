#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU and no Rust
# toolchain (issue 23). Run from the repository root after
# crates/cuda/gpu-pack.sh has filled .gpu/ (carried over with the tree):
#
#   OUT=/some/dir MODELS="a.gguf b.gguf" crates/cuda/gpu-check.sh
#
# Prints the GPU, driver and compute capability; finds libnvrtc.so.13;
# runs the kernels' compile check, the op conformance suite and the
# generation tests with BLOCKDRAFT_REQUIRE_CUDA=1 (no silent skips); then
# `blockdraft bench --backend cuda` on each model in $MODELS. Every step has
# a timeout and the script goes on after a failing one; the whole run stays
# under 4 minutes. Everything is written to $OUT/cuda-check.log too.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/cuda-check.log"

BUDGET=225 # seconds for the whole script, leaving slack under 4 minutes
failed=()
say() { printf '\n=== %s\n' "$*"; }

# step NAME SECONDS COMMAND...: runs COMMAND under a timeout capped by what
# is left of the budget; records a failure (or a timeout) and goes on.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 10 ]; then
        say "$name: NOT RUN (time budget spent)"
        failed+=("$name (not run: no time left)")
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "$name (timeout ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=5 "$limit" "$@"
    local rc=$?
    if [ $rc -eq 0 ]; then
        echo "--- $name: ok in $((SECONDS - t0)) s"
    else
        [ $rc -eq 124 ] && echo "--- $name: TIMED OUT after ${limit}s" || echo "--- $name: FAILED (exit $rc)"
        failed+=("$name (exit $rc)")
    fi
}

main() {
say "machine"
date -u
uname -a
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.memory --format=csv ||
    failed+=("nvidia-smi")
nvidia-smi | head -15

say "unpacking .gpu/"
BIN="$PWD/.gpu/bin"
mkdir -p "$BIN"
for f in .gpu/*.xz; do
    [ -e "$f" ] || { echo "no .gpu/*.xz: run crates/cuda/gpu-pack.sh first"; failed+=("unpack"); break; }
    name=$(basename "$f" .xz)
    if command -v xz >/dev/null; then
        xz -dc "$f" >"$BIN/$name"
    else
        python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" >"$BIN/$name"
    fi
    chmod +x "$BIN/$name"
done
ls -l "$BIN"

say "libnvrtc.so.13"
candidates=(/usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
while read -r d; do candidates+=("$d"/*/lib "$d"/*/*/lib); done < <(
    python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
NVRTC_DIR=""
for d in "${candidates[@]}"; do
    if [ -e "$d/libnvrtc.so.13" ]; then
        NVRTC_DIR=$d
        break
    fi
done
if [ -n "$NVRTC_DIR" ]; then
    echo "found in $NVRTC_DIR"
    export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    echo "libnvrtc.so.13 not found in: ${candidates[*]}"
    failed+=("libnvrtc.so.13 not found")
fi

# Kernels compile once into this cache; the first test pays for it.
export XDG_CACHE_HOME="$PWD/.gpu/cache"
export BLOCKDRAFT_REQUIRE_CUDA=1 BLOCKDRAFT_REQUIRE_NVRTC=1 BLOCKDRAFT_CUDA_LOG_ERRORS=1
export RUST_BACKTRACE=0

step "kernel compile check (NVRTC, sm_80/sm_90)" 40 "$BIN/compile" --nocapture
step "op conformance vs the CPU backend" 100 "$BIN/conformance" --test-threads=4
step "generation: CUDA vs CPU, speculative == plain" 70 "$BIN/generation" --test-threads=3

for m in ${MODELS:-}; do
    step "bench $(basename "$m")" 60 "$BIN/blockdraft" bench --backend cuda -m "$m" -p 128 -n 64 -r 3
done
[ -z "${MODELS:-}" ] && echo "(no \$MODELS given: bench skipped)"

say "summary ($SECONDS s)"
if [ ${#failed[@]} -eq 0 ]; then
    echo "ALL STEPS PASSED"
else
    printf 'FAILED: %s\n' "${failed[@]}"
    return 1
fi
}

# Everything goes to the log too; the script's status is main's.
main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
