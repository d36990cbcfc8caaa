#!/usr/bin/env bash
# Packs what crates/wgpu/gpu-check.sh runs on a GPU machine that has no Rust
# toolchain and no network: the release CLI, the wgpu backend's GPU test
# binaries (op suite, generation, sampling, limits), the matmul kernel bench
# and the `skeleton` tool,
# stripped and xz-compressed into .gpu/, plus skeletons of the real models
# (their metadata, tokenizer and tensor shapes, 16 rows of data per tensor;
# the check inflates them to full size there). Usage, from the repo root:
#   crates/wgpu/gpu-pack.sh [MODEL...]     (default: smollm2 qwen05 qwen15)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu
T=${CARGO_TARGET_DIR:-$PWD/target}

cargo build --release -p blockdraft-cli
cargo build --release -p blockdraft-gguf --example skeleton
cargo build --release -p blockdraft-wgpu --example kernel_bench
pack() { strip -o ".gpu/$2" "$1" && xz -9 -T1 -f ".gpu/$2" && echo "packed .gpu/$2.xz"; }
pack "$T/release/blockdraft" blockdraft
pack "$T/release/examples/skeleton" skeleton
pack "$T/release/examples/kernel_bench" kernel_bench

# The integration tests of the wgpu crate that need no real model.
for exe in $(cargo test --release -p blockdraft-wgpu --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4); do
    name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
    case "$name" in conformance | generation | sampling | limits | quant_parts)
        pack "$exe" "wgpu-test-$name" ;;
    esac
done

for m in "${@:-smollm2 qwen05 qwen15}"; do
    for one in $m; do
        src=$(tests/fetch_models.sh "$one")
        "$T/release/examples/skeleton" strip "$src" ".gpu/$one.skeleton.gguf"
        xz -6 -T1 -f ".gpu/$one.skeleton.gguf" && echo "packed .gpu/$one.skeleton.gguf.xz"
    done
done
du -ch .gpu/* | tail -1
