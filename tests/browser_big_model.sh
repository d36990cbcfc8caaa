#!/usr/bin/env bash
# A check too heavy for CI (about 5 GB of disk and of memory, minutes): a
# model larger than wasm32's 4 GiB loads in headless Chromium on WebGPU
# (SwiftShader) through the npm package, streamed tensor by tensor, and
# generates the native CLI's greedy tokens. The model is SmolLM2-135M with
# its blocks repeated 66 times (1980 layers, 4.4 GB), written as a split set
# of 4 parts (crates/gguf/examples/repeat_layers.rs).
# Needs what www/test/run.sh needs. Env: OUT (a scratch dir, default a
# temporary one), PROFILE (of the wasm, default dev).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=$(tests/fetch_models.sh smollm2)
OUT=${OUT:-$(mktemp -d)}
trap 'rm -rf "$OUT"' EXIT
cargo build -q --release -p blockdraft-cli
cargo run -q --release -p blockdraft-gguf --example repeat_layers -- "$MODEL" 66 4 "$OUT/big" >/dev/null
FIRST="$OUT/big-00001-of-00004.gguf"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
EXPECTED=$("$TARGET_DIR/release/blockdraft" run -m "$FIRST" -p "The capital of France is" -n 2 --temp 0 --json)
PROFILE=${PROFILE:-dev} www/test/build.sh
[ -d www/node_modules/playwright-core ] || (cd www && npm ci --no-audit --no-fund)
node www/test/big.mjs "$FIRST" "The capital of France is" 2 "$EXPECTED"
