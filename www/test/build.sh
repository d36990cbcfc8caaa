#!/usr/bin/env bash
# Builds the wasm module into www/pkg/ (the package's pkg/ is generated,
# never committed). Needs the wasm32-unknown-unknown target and the
# wasm-bindgen CLI at exactly the crate's wasm-bindgen version.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# From the root, so .cargo/config.toml (simd128 for wasm) applies.
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
want=$(sed -n 's/^wasm-bindgen = "=\(.*\)"$/\1/p' "$ROOT/crates/wasm/Cargo.toml")
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}') || true
if [ "$have" != "$want" ]; then
    echo "build.sh: wasm-bindgen CLI $want is needed (found: ${have:-none});" \
         "run: cargo install wasm-bindgen-cli --version $want" >&2
    exit 1
fi
# PROFILE=dev shares the build with the wasm-bindgen tests (tests/run.sh).
PROFILE=${PROFILE:-release}
cargo build --profile "$PROFILE" --locked -p blockdraft-wasm --target wasm32-unknown-unknown \
    --manifest-path "$ROOT/Cargo.toml"
[ "$PROFILE" = dev ] && out=debug || out=$PROFILE
# A release module leaves out the function-name section (13 % of its bytes,
# only read by stack traces: a panic's message still names the file and
# line); a dev module keeps it for debugging the tests.
strip=()
[ "$PROFILE" = release ] && strip=(--remove-name-section)
wasm-bindgen --target web "${strip[@]}" --out-dir "$ROOT/www/pkg" \
    "$TARGET_DIR/wasm32-unknown-unknown/$out/blockdraft_wasm.wasm"
