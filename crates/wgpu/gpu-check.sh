#!/usr/bin/env bash
# The wgpu backend on a real GPU through Vulkan: the op suite and generation
# tests against the CPU backend, the matmul kernels' times, and `bench` on
# full-size models of the real shapes (prefill, decode, T(k)/T(1), commands
# and per-kernel GPU time per token).
# Runs on the GPU machine (no Rust toolchain, no network) from the repo
# root, on what crates/wgpu/gpu-pack.sh put in .gpu/, with the Vulkan loader
# packages in .gl/ (see the device notes). Appends to $OUT/wgpu-check.log.
# Every step has a time limit and a failing step does not stop the rest.
# A `blockdraft-base` binary in .gpu/ (an earlier build, packed by hand) is
# benchmarked beside the new one, alternating, for a before/after table.
#
#   crates/wgpu/gpu-check.sh [PHASE...]   (default: setup bench tests more)
#     setup  Vulkan loader, unpack, inflate the model skeletons
#     bench  Qwen2.5-Coder-0.5B: base and new binary, then a kernel profile
#     tests  the GPU test binaries (real-model tests skipped: no models)
#     more   the other models' benches and profiles, kernel_bench
# Phases after `setup` may run in a later call (another check in between).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/wgpu-check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/wgpu-check.log") 2>&1
W=/tmp/blockdraft-gpu
failed=()
step() { # step NAME SECONDS CMD...
    local name=$1 secs=$2
    shift 2
    echo "== $name ($(date +%T))"
    timeout "$secs" "$@" || { echo "!! $name failed (exit $?)"; failed+=("$name"); }
}

for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
    /etc/vulkan/icd.d/nvidia_icd.json; do
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd && break
done
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# The real-model tests need models this machine does not have.
export BLOCKDRAFT_SKIP_MODEL_TESTS=1

setup() {
    echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-none found}"
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    mkdir -p "$W"
    for f in .gpu/*.xz; do
        xz -T0 -dc "$f" >"$W/$(basename "$f" .xz)"
    done
    chmod +x "$W"/blockdraft* "$W"/skeleton "$W"/kernel_bench "$W"/wgpu-test-* 2>/dev/null
    for s in "$W"/*.skeleton.gguf; do
        "$W/skeleton" inflate "$s" "${s%.skeleton.gguf}.gguf" || failed+=("inflate $s")
    done
}

bins() {
    [ -x "$W/blockdraft-base" ] && echo "$W/blockdraft-base"
    echo "$W/blockdraft"
}

bench_model() { # bench_model NAME
    local m=$W/$1.gguf
    [ -f "$m" ] || return
    for bin in $(bins); do
        step "bench wgpu $1 with $(basename "$bin")" 60 \
            "$bin" bench --backend wgpu -m "$m" -p 128 -n 128 -r 3 --verify-max 8
    done
    step "kernel profile $1" 60 env BLOCKDRAFT_WGPU_PROFILE=1 \
        "$W/blockdraft" bench --backend wgpu -m "$m" -p 0 -n 32 -r 1 --verify-max 0
}

for phase in "${@:-setup bench tests more}"; do
    for p in $phase; do
        case $p in
        setup) setup ;;
        bench) bench_model qwen05 ;;
        tests)
            # One test at a time: with 8 at once (8 devices created in one
            # process) the op suite hung on the H200's Vulkan driver (580),
            # not on lavapipe; the second step keeps probing that.
            for t in "$W"/wgpu-test-*; do
                step "$(basename "$t")" 90 "$t" --test-threads 1
            done
            step "op suite, 8 tests at once" 30 "$W/wgpu-test-conformance" --test-threads 8
            ;;
        more)
            bench_model qwen15
            bench_model smollm2
            step "kernel_bench (decode and verify shapes)" 40 "$W/kernel_bench" F16,Q8_0,Q4_K,Q6_K 1,8 4096x4096
            ;;
        *) echo "unknown phase $p" ;;
        esac
    done
done
echo "== wgpu phases done ($(date +%T)); failed steps: ${failed[*]:-none}"
