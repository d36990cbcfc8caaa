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
