#!/usr/bin/env python3
"""Golden block logits of a shipped drafter from the PyTorch reference (run
once per shipped drafter; CI only reads the output).

The PyPI `dflash` 0.1.0 `DFlashDraftModel` is built from the shipped GGUF's
own weights (dequantized with the PyPI `gguf` package), so the reference and
blockdraft run the very same numbers. The PyPI package has no DFly: a DFly
drafter runs in the trainer's `DFlyDrafter` (training/dflash_train/model.py,
written from the spec and tested against its formulas), its correction
chained as at inference: each slot corrected by the argmax of the one
before (the anchor for the first). Input: the first sequence of a
`blockdraft gen-data` directory made from the same target (its f16 taps are
the drafter's context), cut RESPONSE_CONTEXT tokens into the response; the
anchor is the token there. Output JSON: the taps, anchor, positions, and per draft slot the
argmax and the top-64 logits (ids and values) of the reference.

  python3 tests/golden/make_drafter_golden.py --drafter drafters/smollm2-dflash.gguf \
      --target smollm2.gguf --data DATA_DIR --out tests/fixtures/drafters/smollm2-dflash-golden.json

Environment: training/requirements.txt plus transformers==5.15.0 and
`pip install --no-deps dflash==0.1.0`.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
from dflash_train.data import load_shards, read_manifest  # noqa: E402
from dflash_train.gguf_drafter import read_drafter  # noqa: E402
from dflash_train.target import read_target  # noqa: E402

# The context ends 8 tokens into the response: drafting happens there, not
# inside the prompt (where a drafter was never trained).
RESPONSE_CONTEXT = 8
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    w, m = read_drafter(args.drafter)
    if m["variant"] == "dfly":
        return dfly_golden(args, w, m)
    taps_ids = m["taps"]
    cfg = Qwen3Config(
        hidden_size=m["hidden"], intermediate_size=m["intermediate"],
        num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"],
        rms_norm_eps=m["eps"], rope_theta=m["rope_theta"],
        max_position_embeddings=m["n_ctx"], attention_bias=False, vocab_size=1,
        tie_word_embeddings=False)
    cfg.num_target_layers = len(taps_ids)
    cfg.dflash_config = {"target_layer_ids": [t - 1 for t in taps_ids],
                         "mask_token_id": m["mask_token"]}
    cfg.block_size = m["block_size"]
    cfg._attn_implementation = "eager"
    model = DFlashDraftModel(cfg).float().eval()
    missing, unexpected = model.load_state_dict(w, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)

    embed, head = read_target(args.target)[:2]
    taps, seq, c, anchor = context(args, taps_ids)
    B = cfg.block_size
    block = torch.tensor([anchor] + [cfg.dflash_config["mask_token_id"]] * (B - 1))
    with torch.no_grad():
        hidden = model(position_ids=torch.arange(c + B)[None], noise_embedding=embed[block][None],
                       target_hidden=taps[None])
        if m["d2t"] is None:
            logits = model.compute_logits(hidden[:, 1:], lambda h: h @ head.T)[0]
        else:
            # A reduced vocabulary: the target's head rows at d2t, scattered
            # into a full row where every other id is impossible (-inf).
            d2t = m["d2t"]
            reduced = model.compute_logits(hidden[:, 1:], lambda h: h @ head[d2t].T)[0]
            logits = torch.full((reduced.shape[0], head.shape[0]), float("-inf"))
            logits[:, d2t] = reduced
    write_golden(args, logits, taps, seq, c, anchor, {"torch": torch.__version__, "dflash": "0.1.0"})


def context(args, taps_ids):
    """The first data sequence cut RESPONSE_CONTEXT tokens into its
    response: (its taps, the sequence, the cut, the anchor there)."""
    manifest = read_manifest(args.data)
    assert manifest["tap_layers"] == taps_ids, "the data's taps differ from the drafter's"
    seq = load_shards(args.data, manifest)[0]
    c = seq.prompt_len + RESPONSE_CONTEXT
    return seq.taps[:c].float(), seq, c, int(seq.ids[c])


def dfly_golden(args, w, m):
    from dflash_train.model import DFlyDrafter, Drafter, DrafterConfig
    extra = {}
    if m["hidden_correction"]:
        extra = {"enable_hidden_correction": True,
                 "hidden_correction_intermediate_size": w["hidden_correction.down_proj.weight"].shape[1]}
    embed, head = read_target(args.target)[:2]
    cfg = DrafterConfig(
        hidden_size=m["hidden"], intermediate_size=m["intermediate"], num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"],
        target_layer_ids=[t - 1 for t in m["taps"]], num_target_layers=max(m["taps"]),
        mask_token_id=m["mask_token"], vocab_size=head.shape[0], block_size=m["block_size"],
        rms_norm_eps=m["eps"], rope_theta=m["rope_theta"], extra=extra)
    model = DFlyDrafter(cfg).float().eval()
    model.load_state_dict(w)
    taps, seq, c, anchor = context(args, m["taps"])
    with torch.no_grad():
        hidden = Drafter.forward(model, taps, seq.ids[:c + 1], torch.tensor([c]), embed)[0]
        rows, prev = [], anchor
        for z in hidden:
            if model.hidden_correction is not None:
                z = model.hidden_correction(z, embed[prev])
            rows.append(z @ head.T)
            prev = int(rows[-1].argmax())
    write_golden(args, torch.stack(rows), taps, seq, c, anchor,
                 {"torch": torch.__version__, "reference": "training/dflash_train DFlyDrafter"})


def write_golden(args, logits, taps, seq, c, anchor, versions):
    top = logits.topk(64, dim=-1)
    golden = {
        "drafter": args.drafter.name,
        "drafter_sha256": hashlib.sha256(args.drafter.read_bytes()).hexdigest(),
        "target": args.target.name,
        "versions": versions,
        "context": c, "anchor": anchor, "prompt_ids": seq.ids[:c].tolist(),
        "taps": [float(f"{x:.5g}") for x in taps.flatten().tolist()],
        "argmax": logits.argmax(-1).tolist(),
        "top_ids": top.indices.tolist(),
        "top_logits": [[round(float(x), 5) for x in row] for row in top.values],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden))
    print(f"wrote {args.out}: argmax {golden['argmax']}")


if __name__ == "__main__":
    main()
