#!/usr/bin/env bash
# Builds what crates/cuda/gpu-check.sh runs on the GPU machine (which has no
# Rust toolchain) into .gpu/ at the repository root: the CUDA test binaries
# (compile, conformance, generation) and the release `blockdraft` CLI,
# stripped and compressed with xz -9 (the transfer limit is tight). Run it
# from anywhere; prints the sizes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu
mkdir -p "$out"
# Only this script's files: crates/wgpu/gpu-pack.sh packs beside them.
rm -f "$out"/{compile,conformance,generation,blockdraft}{,.xz}

# The test binaries' paths, from cargo's own report of what it built.
cargo test --no-run --release -p blockdraft-cuda --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []):
        if t["name"] in ("compile", "conformance", "generation"):
            print(t["name"], m["executable"])
' >"$out/tests.txt"
test "$(wc -l <"$out/tests.txt")" -eq 3 || { echo "expected 3 CUDA test binaries:"; cat "$out/tests.txt"; exit 1; }
while read -r name exe; do
    cp "$exe" "$out/$name"
done <"$out/tests.txt"
rm "$out/tests.txt"

cargo build --release -p blockdraft-cli
cp "${CARGO_TARGET_DIR:-target}/release/blockdraft" "$out/blockdraft"

for f in "$out"/{compile,conformance,generation,blockdraft}; do
    strip "$f"
    xz -9 -T1 "$f"
done
ls -l "$out"
du -sh "$out"
