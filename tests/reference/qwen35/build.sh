#!/usr/bin/env bash
# Build dump_logits against the CPU build of llama.cpp 34af94cd (never inside the project).
#
# usage: tests/reference/qwen35/build.sh [OUT_DIR]      (default /tmp/qwen35-dump)
# env:   LLAMA_CPP_DIR (default ~/.cache/blockdraft/llama.cpp), CXX (default g++)
#
# Pin: the llama.cpp tree must be commit 34af94cd. A git checkout is checked with
# `git rev-parse HEAD`; a `git archive` export (no .git, as in ~/.cache/blockdraft/llama.cpp,
# see /work/shared/notes/references.md) is checked by the sha256 of the sources whose
# behaviour the fixtures depend on, recorded below from that export.
set -euo pipefail

PIN=34af94cd9ab277632e27caeec2d41de2fd091b31
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-$HOME/.cache/blockdraft/llama.cpp}
OUT_DIR=${1:-/tmp/qwen35-dump}
CXX=${CXX:-g++}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

LLAMA_CPP_DIR=$(cd "$LLAMA_CPP_DIR" && pwd -P)

top=$(git -C "$LLAMA_CPP_DIR" rev-parse --show-toplevel 2>/dev/null || true)
if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$LLAMA_CPP_DIR" ]; then
    head=$(git -C "$LLAMA_CPP_DIR" rev-parse HEAD)
    if [ "$head" != "$PIN" ]; then
        echo "build.sh: $LLAMA_CPP_DIR is at $head, not ${PIN:0:8}; refusing to build" >&2
        exit 1
    fi
    if ! git -C "$LLAMA_CPP_DIR" diff --quiet HEAD -- include src ggml; then
        echo "build.sh: $LLAMA_CPP_DIR has local changes under include/ src/ ggml/; refusing to build" >&2
        exit 1
    fi
    echo "build.sh: llama.cpp checkout at ${PIN:0:8}" >&2
else
    echo "build.sh: $LLAMA_CPP_DIR is not a git checkout; checking it as an export of ${PIN:0:8}" >&2
    (cd "$LLAMA_CPP_DIR" && sha256sum --quiet -c - >&2) <<'EOF' || {
1fbcba4003cfc089fa9681973acb3d9e24e465f32c3506ceb0ec7fa29952bdae  include/llama.h
b61c5813fc80c54269d45cbbdbbc34b090500e8017dc190483605b37249d007c  src/models/qwen35.cpp
5e3b318953f854b3825dd7cfe4b483ca7935cd5f6680438a3ece4be9b4d5428f  src/models/delta-net-base.cpp
1a18e8f1a1424d2e4f869f0f0d5148a961763d403122283dff8ee7e9cd32a7de  src/llama-memory-recurrent.cpp
740701e585872545650edfd08c9114619a9ad1e67dbab19f6b2060b6290fdf88  ggml/src/ggml-cpu/ops.cpp
EOF
        echo "build.sh: $LLAMA_CPP_DIR does not match llama.cpp ${PIN:0:8}; refusing to build" >&2
        exit 1
    }
fi

LIB_DIR=$LLAMA_CPP_DIR/build/bin
for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
    [ -e "$LIB_DIR/$lib" ] || { echo "build.sh: missing $LIB_DIR/$lib (build llama.cpp first)" >&2; exit 1; }
done

mkdir -p "$OUT_DIR"
set -x
"$CXX" -std=c++17 -O2 -Wall -Wextra \
    -I"$LLAMA_CPP_DIR/include" -I"$LLAMA_CPP_DIR/ggml/include" \
    "$HERE/dump_logits.cpp" -o "$OUT_DIR/dump_logits" \
    -L"$LIB_DIR" -Wl,-rpath,"$LIB_DIR" -lllama -lggml -lggml-base
