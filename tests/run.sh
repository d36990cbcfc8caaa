#!/usr/bin/env bash
# The test suite: formatting, lints, and every test of the workspace,
# including the real-model tests (models are fetched into the cache first).
set -euo pipefail
cd "$(dirname "$0")/.."
# Where a run's time goes: the seconds since the start, before each stage.
mark() { echo "[tests/run.sh] at ${SECONDS} s: $*" >&2; }

tests/fetch_models.sh >/dev/null
# NVRTC (CUDA 13.0, from PyPI) for the CUDA kernels' compile check
# (crates/cuda/tests/compile.rs), which must run here rather than skip.
LD_LIBRARY_PATH="$(tests/fetch_nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH BLOCKDRAFT_REQUIRE_NVRTC=1
# Mesa's Vulkan drivers (the wgpu tests) want a runtime dir; any will do.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

mark formatting
cargo fmt --all -- --check
mark the trainer tests
# The drafter trainer (training/): masks, labels, loss and data checks.
if [ -n "${BLOCKDRAFT_TRAIN_PYTHON:-}" ]; then
    "$BLOCKDRAFT_TRAIN_PYTHON" -m unittest discover -s training -t training
else
    echo "SKIPPED: the trainer's tests (set BLOCKDRAFT_TRAIN_PYTHON to a python with training/requirements.txt; .ci/run does)"
fi
mark clippy
cargo clippy --workspace --all-targets -- -D warnings
mark the workspace tests
cargo test --workspace --no-fail-fast
mark the kernels with debug assertions
# The CPU kernels' and attention's own tests with debug assertions and
# overflow checks, which the test profile leaves out of blockdraft-cpu for
# speed (Cargo.toml): the standard library's checks of unsafe preconditions
# (pointer offsets, unchecked indexing) run in every SIMD loop. Then the
# AVX2 builds, which machines without AVX-512 (Zen 3) take, on this machine
# too; and below, the wasm32 and aarch64 builds, with the same checks.
checked=(--config 'profile.dev.package.blockdraft-cpu.debug-assertions=true'
    --config 'profile.dev.package.blockdraft-cpu.overflow-checks=true')
# (The first run is the AVX2 one on a machine with neither AVX-512 nor AVX-VNNI.)
if grep -qwE 'avx512f|avx_vnni' /proc/cpuinfo; then
    cargo test "${checked[@]}" -p blockdraft-cpu --lib -- kernels:: attention::
fi
mark the AVX2 kernels
BLOCKDRAFT_NO_AVX512=1 cargo test "${checked[@]}" -p blockdraft-cpu --lib -- kernels:: attention::
mark the OpenAI-client server test
# `blockdraft serve` under the official OpenAI client, with load and
# disconnecting clients (tests/serve_openai.py).
if [ -n "${BLOCKDRAFT_SERVE_PYTHON:-}" ]; then
    "$BLOCKDRAFT_SERVE_PYTHON" tests/serve_openai.py "${CARGO_TARGET_DIR:-$PWD/target}/debug/blockdraft" \
        "$(tests/fetch_models.sh smollm2)" drafters/smollm2-dflash.gguf
else
    echo "SKIPPED: the OpenAI-client server test (set BLOCKDRAFT_SERVE_PYTHON to a python with tests/serve-requirements.txt; .ci/run does)"
fi
mark the wasm32 simd128 kernels
# The wasm32 simd128 and aarch64 NEON kernels against the scalar ones (and
# glibc's expf, sinf and cosf bit for bit, and the portable attention),
# under Node's WASI and qemu-user.
simd_tests=(kernels::tests::simd kernels::tests::results_independent kernels::tests::float
    kernels::wasm kernels::neon libm::tests attention::)
CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $PWD/tests/wasi/run.mjs" \
    cargo test "${checked[@]}" -p blockdraft-cpu --lib --target wasm32-wasip1 -- "${simd_tests[@]}"
mark the aarch64 NEON kernels
# qemu's `max` CPU has sdot, so the NEON kernels take their dotprod build
# (checked) and are compared with the baseline build as well.
QEMU_CPU=max BLOCKDRAFT_EXPECT_DOTPROD=1 \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    cargo test "${checked[@]}" -p blockdraft-cpu --lib --target aarch64-unknown-linux-gnu -- "${simd_tests[@]}"
mark the wgpu backend in Chromium
# The browser (headless Chromium, WebGPU on SwiftShader): the wgpu backend
# under wasm-bindgen-test, then the npm package end to end with Playwright
# on the CPU fallback (SwiftShader is too slow for a real model on WebGPU).
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
WASM_BINDGEN_TEST_WEBDRIVER_JSON="$PWD/crates/wasm/webdriver.json" WASM_BINDGEN_TEST_TIMEOUT=900 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test -p blockdraft-wasm --target wasm32-unknown-unknown
mark the npm package in Chromium
PROFILE=dev CLI="${CARGO_TARGET_DIR:-$PWD/target}/debug/blockdraft" BACKENDS=cpu www/test/run.sh
mark done
