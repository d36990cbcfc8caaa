"""A DFlash v1 or DFly drafter GGUF (`blockdraft convert` output) read back
into the HF tensor names the trainer's modules use, dequantized to float32: the golden generator builds
the PyPI reference from it, and the trainer warm-starts from a shipped file
(`train.py --init-from`), so data made in one session is not lost with the
machine that made it."""
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

GGUF_TO_HF = {
    "fc.weight": "fc.weight",
    "enc.output_norm.weight": "hidden_norm.weight",
    "output_norm.weight": "norm.weight",
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    # DFly (spec: shared/spec/dflash-family.md §1, DFly extras)
    "context_norm.weight": "context_norm.weight",
    "layer_fusion": "layer_fusion_weights",
    "hidden_correction.hidden_norm.weight": "hidden_correction.hidden_norm.weight",
    "hidden_correction.embed_norm.weight": "hidden_correction.embed_norm.weight",
    "hidden_correction.gate.weight": "hidden_correction.gate_proj.weight",
    "hidden_correction.up.weight": "hidden_correction.up_proj.weight",
    "hidden_correction.down.weight": "hidden_correction.down_proj.weight",
}


class DrafterFileError(Exception):
    """A drafter GGUF that is not a DFlash v1 or DFly file this trainer can read."""


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        raise DrafterFileError(f"no metadata key {key!r}")
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v.tolist()[0]


def array(reader, key):
    f = reader.fields.get(key)
    if f is None:
        raise DrafterFileError(f"no metadata key {key!r}")
    return [int(f.parts[i][0]) for i in f.data]


def read_drafter(path: Path):
    """(weights by HF name, metadata) of the drafter at `path`. Metadata:
    variant ("dflash" or "dfly"), hidden_correction (DFly's, present),
    taps (GGUF tap layers), mask_token, block_size, hidden, layers, heads,
    kv_heads, head_dim, intermediate, eps, rope_theta, n_ctx, and d2t (a
    reduced vocabulary's target ids, or None)."""
    try:
        r = GGUFReader(str(path))
    except Exception as e:  # the gguf package raises several types
        raise DrafterFileError(f"{path}: not a readable GGUF ({e})") from e
    if field(r, "general.architecture") != "dflash":
        raise DrafterFileError(f"{path}: architecture {field(r, 'general.architecture')!r}, expected 'dflash'")
    weights, d2t = {}, None
    for t in r.tensors:
        if t.name == "d2t":
            d2t = torch.from_numpy(np.array(t.data, dtype=np.int64))
            continue
        if t.name == "output.weight":
            continue  # a reduced head: the target's rows at d2t, rebuilt from the target
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))  # a copy: the map is read-only
        if t.name.startswith("blk."):
            _, i, rest = t.name.split(".", 2)
            base = rest.removesuffix(".weight")
            if base not in GGUF_TO_HF:
                raise DrafterFileError(f"{path}: tensor {t.name} is not part of a DFlash v1 or DFly drafter")
            weights[f"layers.{i}.{GGUF_TO_HF[base]}.weight"] = w
        elif t.name in GGUF_TO_HF:
            weights[GGUF_TO_HF[t.name]] = w
        else:
            raise DrafterFileError(f"{path}: tensor {t.name} is not part of a DFlash v1 or DFly drafter")
    n = lambda k: field(r, f"dflash.{k}")  # noqa: E731
    meta = {
        "taps": array(r, "dflash.target_layers"),
        "mask_token": field(r, "tokenizer.ggml.mask_token_id"),
        "block_size": n("block_size"),
        "hidden": n("embedding_length"),
        "layers": n("block_count"),
        "heads": n("attention.head_count"),
        "kv_heads": n("attention.head_count_kv"),
        "head_dim": n("attention.key_length"),
        "intermediate": weights["layers.0.mlp.gate_proj.weight"].shape[0],
        "eps": n("attention.layer_norm_rms_epsilon"),
        "rope_theta": n("rope.freq_base"),
        "n_ctx": n("context_length"),
        "d2t": d2t,
        "variant": "dfly" if "layer_fusion_weights" in weights else "dflash",
        "hidden_correction": "hidden_correction.down_proj.weight" in weights,
    }
    return weights, meta
