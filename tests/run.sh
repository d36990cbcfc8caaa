#!/usr/bin/env bash
# The test suite: formatting, lints, and every test of the workspace,
# including the real-model tests (models are fetched into the cache first).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/fetch_models.sh >/dev/null
# Mesa's Vulkan drivers (the wgpu tests) want a runtime dir; any will do.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --no-fail-fast
# The wasm32 simd128 kernels against the scalar ones, under Node's WASI.
CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $PWD/tests/wasi/run.mjs" \
    cargo test -p blockdraft-cpu --lib --target wasm32-wasip1 -- \
    kernels::tests::simd kernels::tests::results_independent
