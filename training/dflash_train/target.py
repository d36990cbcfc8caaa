"""The frozen parts a drafter borrows from its target, read from the target's
own GGUF so that training sees what inference computes."""
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize


class TargetMismatch(Exception):
    pass


def _field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types and f.types[0].name == "STRING" else v.tolist()[0]


def read_target(path: Path):
    """(embedding [V, H], lm_head [V, H], info) of the GGUF at `path`, as
    float32 tensors; info: arch, n_layer, n_embd, rope_theta, n_ctx and the
    chat template."""
    r = GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    n_embd = _field(r, f"{arch}.embedding_length")
    tensors = {t.name: t for t in r.tensors}

    def matrix(name):
        t = tensors[name]
        w = dequantize(t.data, t.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(-1, n_embd)

    embed = matrix("token_embd.weight")
    head = matrix("output.weight") if "output.weight" in tensors else embed
    info = {"arch": arch, "n_layer": _field(r, f"{arch}.block_count"), "n_embd": n_embd,
            "rope_theta": float(_field(r, f"{arch}.rope.freq_base") or 1e6),
            "n_ctx": _field(r, f"{arch}.context_length"),
            "template": _field(r, "tokenizer.chat_template") or ""}
    return embed, head, info


def load_target(path: Path, manifest: dict):
    """`read_target`, checked against the data's manifest: a drafter
    trained on the taps of one model is useless on another."""
    embed, head, info = read_target(path)
    for name, ours, theirs in (("architecture", info["arch"], manifest["architecture"]),
                               ("n_layer", info["n_layer"], manifest["n_layer"]),
                               ("n_embd", info["n_embd"], manifest["n_embd"])):
        if ours != theirs:
            raise TargetMismatch(f"{path}: {name} is {ours}, the data was made from a model with {theirs}")
    if _fnv1a(info["template"].encode()) != manifest["template_hash"]:
        raise TargetMismatch(f"{path}: its chat template differs from the one the data was made with")
    if embed.shape[0] != manifest["n_vocab"]:
        raise TargetMismatch(f"{path}: vocabulary {embed.shape[0]}, the data has {manifest['n_vocab']}")
    return embed, head, info


def _fnv1a(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
