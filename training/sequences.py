#!/usr/bin/env python3
"""Export the token sequences of a `blockdraft gen-data` directory: the
expensive part of training data (the target's own greedy answers) in a
file small enough to commit, from which `blockdraft gen-data --replay`
rebuilds the taps with batched forward passes on any machine.

  python3 training/sequences.py DATA_DIR -o training/data/NAME.jsonl

One JSON object per line, by prompt index: {"prompt_index", "prompt_len",
"finished", "ids"}. The first line is the data's manifest (model, taps,
chat template and prompts hashes) under the key "manifest", so a replay can
be matched with what made it.
"""
import argparse
import json
import os
import sys
from pathlib import Path

from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_train.data import DataError, read_manifest  # noqa: E402


def sequences(data_dir: Path):
    """Every sequence of the directory's complete shards, in prompt order."""
    out = []
    for path in sorted(Path(data_dir).glob("shard-*.safetensors")):
        try:
            with safe_open(str(path), framework="numpy") as f:
                t = {k: f.get_tensor(k) for k in
                     ("input_ids", "seq_offsets", "prompt_lens", "prompt_index", "finished")}
        except Exception as e:  # safetensors raises several types
            raise DataError(f"{path}: corrupt or truncated shard ({e})") from e
        off = t["seq_offsets"]
        for i in range(len(t["prompt_lens"])):
            out.append({"prompt_index": int(t["prompt_index"][i]),
                        "prompt_len": int(t["prompt_lens"][i]),
                        "finished": bool(t["finished"][i]),
                        "ids": t["input_ids"][off[i]:off[i + 1]].tolist()})
    return sorted(out, key=lambda s: s["prompt_index"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        manifest = read_manifest(args.data)
        seqs = sequences(args.data)
    except DataError as e:
        sys.exit(f"error: {e}")
    tmp = args.out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"manifest": manifest}) + "\n")
        for s in seqs:
            f.write(json.dumps(s, separators=(",", ":")) + "\n")
    os.replace(tmp, args.out)
    tokens = sum(len(s["ids"]) - s["prompt_len"] for s in seqs)
    print(f"{args.out}: {len(seqs)} sequences, {tokens} response tokens")


if __name__ == "__main__":
    main()
