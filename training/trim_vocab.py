#!/usr/bin/env python3
"""Narrow a trained drafter's reduced vocabulary (d2t) after training.

  python3 training/trim_vocab.py RUN/hf --keep N --sequences FILE.jsonl [...] -o OUT_HF
  python3 training/trim_vocab.py DRAFTER.gguf --target MODEL.gguf --keep N --sequences ... -o OUT_HF

A reduced head's rows are the target's own LM-head rows, frozen in
training, so dropping some changes no other weight and no kept token's
logit: the drafter then never proposes the dropped tokens. The N kept are
the ones used most by the given sequences (`training/sequences.py` files:
the data the run was trained on), ranked as `train.draft_vocab` ranks
them, so a drafter can be trained with a wide head and shipped with a
narrower one (each Q8_0 row of Qwen2.5's 896 columns is 952 bytes of the
file).
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_train.data import Sequence  # noqa: E402
from dflash_train.gguf_drafter import DrafterFileError, read_drafter  # noqa: E402
from dflash_train.model import DrafterConfig  # noqa: E402
from dflash_train.target import read_target  # noqa: E402
from train import vocab_rank  # noqa: E402


def read_sequences(paths):
    """The token ids of `training/sequences.py` files (taps not needed)."""
    seqs = []
    for path in paths:
        with open(path) as f:
            next(f)  # the manifest line
            for line in f:
                s = json.loads(line)
                ids = torch.tensor(s["ids"], dtype=torch.long)
                seqs.append(Sequence(ids, s["prompt_len"], torch.zeros(0)))
    return seqs


def trim(tensors: dict, config: dict, keep: int, seqs) -> tuple[dict, dict]:
    """`tensors` and `config` with the head cut to the `keep` rows of d2t
    that the sequences rank first (ascending target ids, as train.py's)."""
    d2t, head = tensors["d2t"], tensors["lm_head.weight"]
    if not 0 < keep <= len(d2t):
        raise ValueError(f"--keep {keep} is not within 1..{len(d2t)} (the head's rows)")
    rank = vocab_rank(seqs, config["vocab_size"])
    rows = sorted(range(len(d2t)), key=lambda r: rank(int(d2t[r])))[:keep]
    rows = torch.tensor(sorted(rows, key=lambda r: int(d2t[r])))
    out = dict(tensors)
    out["d2t"] = d2t[rows].clone()
    out["lm_head.weight"] = head[rows].clone()
    cfg = dict(config)
    cfg["draft_vocab_size"] = keep
    return out, cfg


def from_gguf(path: Path, target: Path) -> tuple[dict, dict]:
    """A drafter GGUF with a reduced head as the HF checkpoint `trim` takes
    (a shipped file, whose run directory is gone): its weights, and its head
    rebuilt from the target's rows at d2t (the rows it was trained with,
    frozen)."""
    weights, m = read_drafter(path)
    if m["d2t"] is None:
        raise DrafterFileError(f"{path} has no reduced vocabulary (d2t) to trim")
    _, head, info = read_target(target)
    cfg = DrafterConfig(
        hidden_size=m["hidden"], intermediate_size=m["intermediate"], num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"],
        target_layer_ids=[t - 1 for t in m["taps"]], num_target_layers=info["n_layer"],
        mask_token_id=m["mask_token"], vocab_size=head.shape[0], block_size=m["block_size"],
        rms_norm_eps=m["eps"], rope_theta=m["rope_theta"], max_position_embeddings=m["n_ctx"],
        extra={"draft_vocab_size": len(m["d2t"])})
    weights["lm_head.weight"] = head[m["d2t"]].contiguous()
    weights["d2t"] = m["d2t"]
    return weights, cfg.hf_config()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf", type=Path, help="the run's hf/ directory (config.json, model.safetensors), "
                    "or a drafter GGUF (with --target)")
    ap.add_argument("--target", type=Path, help="the target GGUF, when trimming a drafter GGUF")
    ap.add_argument("--keep", type=int, required=True)
    ap.add_argument("--sequences", type=Path, nargs="+", required=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    if args.hf.is_file():
        if args.target is None:
            sys.exit("error: a drafter GGUF needs --target (its head rows are the target's)")
        try:
            tensors, config = from_gguf(args.hf, args.target)
        except DrafterFileError as e:
            sys.exit(f"error: {e}")
    else:
        config = json.loads((args.hf / "config.json").read_text())
        tensors = load_file(str(args.hf / "model.safetensors"))
    if "d2t" not in tensors:
        sys.exit(f"error: {args.hf} has no reduced vocabulary (d2t) to trim")
    seqs = read_sequences(args.sequences)
    try:
        out, cfg = trim(tensors, config, args.keep, seqs)
    except ValueError as e:
        sys.exit(f"error: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(out, str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for extra in args.hf.iterdir() if args.hf.is_dir() else ():
        if extra.name not in ("config.json", "model.safetensors") and extra.is_file():
            shutil.copy(extra, args.out / extra.name)
    covered = sum(int(torch.isin(s.ids[s.prompt_len:], out["d2t"]).sum()) for s in seqs)
    total = sum(len(s.ids) - s.prompt_len for s in seqs)
    print(f"{args.out}: {args.keep} of {len(tensors['d2t'])} rows, "
          f"{100 * covered / max(total, 1):.2f} % of the sequences' response tokens")


if __name__ == "__main__":
    main()
