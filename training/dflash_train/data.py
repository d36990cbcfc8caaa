"""Reading `blockdraft gen-data` directories (format `blockdraft-taps/1`,
documented in crates/cli/src/commands/gen_data/shard.rs)."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

FORMAT = "blockdraft-taps/1"


class DataError(Exception):
    """A data directory that cannot be used as it is; the message says why."""


@dataclass
class Sequence:
    ids: torch.Tensor  # [S] int64
    prompt_len: int
    taps: torch.Tensor  # [S, T*H] float16

    @property
    def loss_mask(self) -> torch.Tensor:
        m = torch.zeros(len(self.ids), dtype=torch.bool)
        m[self.prompt_len:] = True
        return m


def read_manifest(data_dir: Path) -> dict:
    path = Path(data_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a gen-data manifest ({e})") from e
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def load_shards(data_dir: Path, manifest: dict) -> list[Sequence]:
    """Every complete shard of `data_dir` (gen-data renames a shard into
    place only when it is whole; a damaged one is an error, never skipped)."""
    width = len(manifest["tap_layers"]) * manifest["n_embd"]
    seqs = []
    for path in sorted(Path(data_dir).glob("shard-*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in
                     ("input_ids", "seq_offsets", "prompt_lens", "taps")}
        except Exception as e:  # safetensors raises several types
            raise DataError(f"{path}: corrupt or truncated shard ({e}); "
                            "delete it and rerun gen-data to make it again") from e
        if meta.get("format") != FORMAT or json.loads(meta.get("tap_layers", "null")) != manifest["tap_layers"]:
            raise DataError(f"{path}: made with other taps or format than {data_dir}/manifest.json")
        ids, off, pl, taps = t["input_ids"], t["seq_offsets"], t["prompt_lens"], t["taps"]
        if taps.shape != (len(ids), width) or off[0] != 0 or off[-1] != len(ids) or len(off) != len(pl) + 1:
            raise DataError(f"{path}: inconsistent shapes (taps {tuple(taps.shape)}, "
                            f"{len(ids)} ids, {len(off)} offsets)")
        for i in range(len(pl)):
            a, b = int(off[i]), int(off[i + 1])
            seqs.append(Sequence(ids[a:b].long(), int(pl[i]), taps[a:b]))
    if not seqs:
        raise DataError(f"{data_dir}: no shards yet (run blockdraft gen-data first)")
    return seqs
