#!/usr/bin/env bash
# Remakes tests/fixtures/llamacpp/qwen35-{default,narrow}.json: llama.cpp 34af94cd's logits
# on the random `qwen35` GGUFs that blockdraft's generator writes (the geometries of
# crates/cpu/tests/hybrid_models.rs), which that test compares blockdraft against.
#
# usage: tests/reference/qwen35/make_fixtures.sh      (llama.cpp built as build.sh says)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$HERE/build.sh" "$WORK/bin"
(cd "$ROOT" && QWEN35_FIXTURE_DIR="$WORK" cargo test -q -p blockdraft-cpu --test hybrid_models \
    -- --ignored --exact write_fixture_models)
for name in default narrow; do
    "$WORK/bin/dump_logits" "$WORK/qwen35-$name.gguf" "$WORK/$name.json" --threads 2
    python3 - "$WORK/$name.json" "$(cat "$WORK/qwen35-$name.fnv")" \
        "$ROOT/tests/fixtures/llamacpp/qwen35-$name.json" <<'PY'
import json, sys
dump = json.load(open(sys.argv[1]))
out = {"llama_cpp": "34af94cd", "gguf_fnv1a64": sys.argv[2], **dump}
json.dump(out, open(sys.argv[3], "w"), separators=(",", ":"))
PY
    echo "wrote tests/fixtures/llamacpp/qwen35-$name.json"
done
