#!/usr/bin/env bash
# The test suite: formatting, lints, and every test of the workspace,
# including the real-model tests (models are fetched into the cache first).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/fetch_models.sh >/dev/null

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --no-fail-fast
