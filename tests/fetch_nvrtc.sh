#!/usr/bin/env bash
# Fetches NVRTC (CUDA 13.0, the line the GPU machine's driver 580 runs) from
# PyPI into ~/.cache/blockdraft/cuda-13.0, once, so that the CUDA kernels'
# compile check (crates/cuda/tests/compile.rs) runs without a GPU or a CUDA
# install. Prints the library folder for LD_LIBRARY_PATH; idempotent.
set -euo pipefail
D="${BLOCKDRAFT_NVRTC_DIR:-$HOME/.cache/blockdraft/cuda-13.0}"
LIB="$D/nvidia/cu13/lib"
if [ ! -e "$LIB/libnvrtc.so.13" ]; then
    mkdir -p "$D/whl"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$D/whl" \
        nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 >&2
    for w in "$D"/whl/*.whl; do python3 -m zipfile -e "$w" "$D"; done
fi
echo "$LIB"
