#!/usr/bin/env bash
# Real-browser test of the npm package in headless Chromium (Playwright with
# the system Chromium): builds the wasm module, serves www/ and SmolLM2-135M,
# and checks on the CPU backend and on WebGPU (SwiftShader) that 16 greedy
# tokens equal the native CLI's, that an n-gram speculative run gives the
# same text, and that an abort ends a stream at once.
#
# Needs (see www/README.md): chromium, node + npm, the wasm32-unknown-unknown
# target, wasm-bindgen-cli 0.2.130, and the model (tests/fetch_models.sh).
# Env: MODEL (default: tests/fetch_models.sh smollm2), BACKENDS ("cpu webgpu"),
#      CLI (a blockdraft binary for the reference run) or CLI_PROFILE (cargo
#      profile to build one with, default release), PROFILE (of the wasm).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WWW=$(dirname "$HERE")
ROOT=$(dirname "$WWW")
MODEL=${MODEL:-$("$ROOT/tests/fetch_models.sh" smollm2)}
PROMPT="The capital of France is"
N=16

"$HERE/build.sh"
[ -d "$WWW/node_modules/playwright-core" ] || (cd "$WWW" && npm ci --no-audit --no-fund)
# CLI: a built blockdraft binary (tests/run.sh passes the one its tests
# built); otherwise cargo builds one.
cli() {
    if [ -n "${CLI:-}" ]; then
        "$CLI" "$@"
    else
        cargo run -q --locked --profile "${CLI_PROFILE:-release}" -p blockdraft-cli \
            --manifest-path "$ROOT/Cargo.toml" -- "$@"
    fi
}
EXPECTED=$(cli run -m "$MODEL" -p "$PROMPT" -n "$N" --temp 0 --json)
node "$HERE/browser.mjs" "$MODEL" "$PROMPT" "$N" "$EXPECTED" ${BACKENDS:-cpu webgpu}
