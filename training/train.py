#!/usr/bin/env python3
"""Train a DFlash v1 or DFly block drafter on `blockdraft gen-data` output.

  python3 training/train.py --data DATA_DIR --target MODEL.gguf --out RUN_DIR \
      [--heldout HELDOUT_DATA_DIR] [--steps 4000] [--layers 1] ...

RUN_DIR/checkpoint.pt is written every --save-every steps (atomically) and a
rerun with the same RUN_DIR resumes from it; RUN_DIR/hf/ holds the drafter in
the z-lab HF layout (config.json + model.safetensors) for `blockdraft convert`.
See training/README.md for the whole pipeline.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_train.data import DataError, load_shards, read_manifest  # noqa: E402
from dflash_train.gguf_drafter import DrafterFileError, read_drafter  # noqa: E402
from dflash_train.model import DFlyDrafter, Drafter, DrafterConfig  # noqa: E402
from dflash_train.objective import (accept_length, block_loss,  # noqa: E402
                                    labels_and_weights, sample_anchors)
from dflash_train.target import TargetMismatch, load_target  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, help="gen-data dir of held-out prompts (evaluation only)")
    ap.add_argument("--target", type=Path, required=True, help="the target GGUF the data was made with")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", choices=("dflash", "dfly"), default="dflash",
                    help="dfly: per-layer context fusion and the predecessor correction (full vocabulary)")
    ap.add_argument("--no-hidden-correction", action="store_true", help="dfly without the correction")
    ap.add_argument("--layers", type=int, help="drafter layers (default 1)")
    ap.add_argument("--intermediate", type=int, help="drafter MLP width (default: the target's)")
    ap.add_argument("--heads", type=int, help="query heads (default: hidden/64)")
    ap.add_argument("--kv-heads", type=int, help="key/value heads (default: heads/3 or 1)")
    ap.add_argument("--head-dim", type=int, help="default 64")
    ap.add_argument("--block", type=int, help="tokens per block, the anchor included (default 8)")
    ap.add_argument("--mask-token", type=int, help="required unless --init-from gives it")
    ap.add_argument("--init-from", type=Path, metavar="DRAFTER_GGUF",
                    help="start from this drafter's weights (a shipped DFlash v1 GGUF made for the same "
                         "target and taps); its shape replaces the shape flags, which must agree with it")
    ap.add_argument("--draft-vocab", type=int,
                    help="reduced draft vocabulary (d2t): the drafter's head keeps N target tokens "
                         "(see draft_vocab); cheaper to train and to run, and a token outside it is "
                         "never drafted (default: the full vocabulary)")
    ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence per step")
    ap.add_argument("--seqs", type=int, default=1, help="sequences per optimizer step")
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=float, default=0.04)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def warm_start(args, manifest):
    """The weights of `args.init_from`, after checking it was made for this
    data (taps, width) and setting the shape flags from it (an explicit flag
    that disagrees is an error, not silently overridden)."""
    weights, m = read_drafter(args.init_from)
    if m["taps"] != manifest["tap_layers"] or m["hidden"] != manifest["n_embd"]:
        raise DrafterFileError(f"{args.init_from}: taps {m['taps']}, width {m['hidden']}; the data has "
                               f"taps {manifest['tap_layers']}, width {manifest['n_embd']}")
    # More layers than the file's: it fills the first ones and the rest start
    # as identities (see grow_layers), so training resumes from its function.
    args.init_layers = m["layers"]
    if args.layers is not None and args.layers < m["layers"]:
        raise DrafterFileError(f"{args.init_from}: --layers {args.layers}, the file has {m['layers']} "
                               "(a warm start may add layers, not drop them)")
    for flag, key in (("intermediate", "intermediate"), ("heads", "heads"),
                      ("kv_heads", "kv_heads"), ("head_dim", "head_dim"), ("mask_token", "mask_token")):
        given = getattr(args, flag)
        if given is not None and given != m[key]:
            raise DrafterFileError(f"{args.init_from}: --{flag.replace('_', '-')} {given}, the file has {m[key]}")
        setattr(args, flag, m[key])
    # The block is not a weight shape: a warm start may train on longer (or
    # shorter) blocks than the file's, and the file written names the new one.
    args.block = args.block or m["block_size"]
    args.layers = args.layers or m["layers"]
    args.init_d2t = m["d2t"]
    if m["variant"] == "dfly" and args.variant != "dfly":
        raise DrafterFileError(f"{args.init_from}: a DFly drafter; pass --variant dfly")
    if args.variant == "dfly" and m["variant"] == "dflash":
        # A DFlash v1 file starts a DFly run: its context norm becomes the
        # shared one, the fusion and the correction start as DFly's do, and
        # its reduced head is dropped (DFly drafts over the whole vocabulary).
        weights["context_norm.weight"] = weights.pop("hidden_norm.weight")
        args.init_d2t = None
    return weights


def grow_layers(model: Drafter, loaded: int):
    """Layers from `loaded` on add nothing to the residual stream at first
    (their attention and MLP output projections zeroed), so a drafter
    warm-started with more layers than its file computes what the file
    does; their other weights keep their random start."""
    with torch.no_grad():
        for layer in model.layers[loaded:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def lr_at(step, args):
    warm = max(1, int(args.warmup * args.steps))
    if step < warm:
        return args.lr * (step + 1) / warm
    t = (step - warm) / max(1, args.steps - warm)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def save_atomic(obj, path: Path):
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def export_hf(model: Drafter, head: "DraftHead", out: Path):
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if head.d2t is not None:
        # The reduced head ships with the drafter (the target's rows, frozen).
        tensors["lm_head.weight"] = head.weight
        tensors["d2t"] = head.d2t.clone()
    save_file(tensors, str(out / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(model.config.hf_config(), indent=2))


class DraftHead:
    """The frozen head the drafter's logits come from: the target's, or its
    rows for a reduced vocabulary `d2t` (draft row -> target id), where a
    label outside the vocabulary weighs nothing and is never hit."""

    def __init__(self, head, d2t=None):
        self.d2t = d2t
        self.weight = head if d2t is None else head[d2t].contiguous()
        self.t2d = None
        if d2t is not None:
            self.t2d = torch.full((head.shape[0],), -1, dtype=torch.long)
            self.t2d[d2t] = torch.arange(len(d2t))

    def labels(self, labels, w):
        if self.t2d is None:
            return labels, w
        rows = self.t2d[labels]
        return rows.clamp(min=0), w * (rows >= 0)


def vocab_rank(seqs, n_vocab):
    """The sort key of how much a drafter needs each target token: 8 x its
    count in the responses of `seqs` plus its count in the whole sequences
    (a word of the prompt is often copied into the answer), descending,
    then the id (BPE ids follow merge order, roughly the tokenizer corpus's
    frequency), so that the rows the data never shows are the commonest
    tokens."""
    score = torch.zeros(n_vocab, dtype=torch.long)
    for s in seqs:
        score += 8 * torch.bincount(s.ids[s.prompt_len:], minlength=n_vocab)
        score += torch.bincount(s.ids, minlength=n_vocab)
    score = score.tolist()
    return lambda t: (-score[t], t)


def draft_vocab(seqs, n, n_vocab):
    """The `n` target tokens a drafter most needs (`vocab_rank`), in
    increasing id order."""
    order = sorted(range(n_vocab), key=vocab_rank(seqs, n_vocab))[:n]
    return torch.tensor(sorted(order), dtype=torch.long)


def step_on(model, seq, embed, head, args, gen, train=True):
    mask = seq.loss_mask
    anchors = sample_anchors(mask, args.anchors, gen)
    if len(anchors) == 0:
        return None
    labels, w = labels_and_weights(seq.ids, mask, anchors, args.block, args.gamma)
    labels, w = head.labels(labels, w)
    hidden = model(seq.taps, seq.ids, anchors, embed)
    loss, hits = block_loss(hidden, head.weight, labels, w)
    return loss, hits, w


@torch.no_grad()
def evaluate(model, seqs, embed, head, args):
    """Weighted loss, per-slot accuracy and the τ proxy on every valid anchor
    (capped at 256 per sequence) of `seqs`."""
    gen = torch.Generator().manual_seed(1234)
    n_slot = torch.zeros(args.block - 1)
    ok_slot = torch.zeros(args.block - 1)
    taus, losses = [], []
    eval_args = argparse.Namespace(**{**vars(args), "anchors": 256})
    for seq in seqs:
        r = step_on(model, seq, embed, head, eval_args, gen, train=False)
        if r is None:
            continue
        loss, hits, w = r
        losses.append(loss.item())
        valid = w > 0
        n_slot += valid.sum(0)
        ok_slot += (hits & valid).sum(0)
        taus.append(accept_length(hits, w))
    tau = torch.cat(taus).mean().item()
    return {"loss": sum(losses) / len(losses), "tau_proxy": tau,
            "slot_accuracy": [round(x, 4) for x in (ok_slot / n_slot.clamp(min=1)).tolist()]}


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        manifest = read_manifest(args.data)
        seqs = load_shards(args.data, manifest)
        held = None
        if args.heldout:
            hm = read_manifest(args.heldout)
            for k in ("tap_layers", "template_hash", "n_embd", "architecture"):
                if hm[k] != manifest[k]:
                    raise DataError(f"{args.heldout}: {k} differs from {args.data}")
            held = load_shards(args.heldout, hm)
        embed, head, info = load_target(args.target, manifest)
    except (DataError, TargetMismatch) as e:
        sys.exit(f"error: {e}")
    H = manifest["n_embd"]
    init = None
    if args.init_from:
        try:
            init = warm_start(args, manifest)
        except DrafterFileError as e:
            sys.exit(f"error: --init-from {e}")
    args.layers, args.head_dim, args.block = args.layers or 1, args.head_dim or 64, args.block or 8
    if args.mask_token is None:
        sys.exit("error: --mask-token is required (or --init-from a drafter that names it)")
    if not 0 <= args.mask_token < manifest["n_vocab"]:
        sys.exit(f"error: --mask-token {args.mask_token} is outside the vocabulary of {manifest['n_vocab']}")
    heads = args.heads or H // args.head_dim
    kv = args.kv_heads or max(1, heads // 3)
    if heads % kv:
        sys.exit(f"error: {heads} query heads are not a multiple of {kv} kv heads")
    cfg = DrafterConfig(
        hidden_size=H, intermediate_size=args.intermediate or 4 * H,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=args.head_dim, target_layer_ids=[l - 1 for l in manifest["tap_layers"]],
        num_target_layers=manifest["n_layer"], mask_token_id=args.mask_token,
        vocab_size=manifest["n_vocab"], block_size=args.block, rope_theta=info["rope_theta"],
        max_position_embeddings=info["n_ctx"] or 8192)
    ckpt_path = args.out / "checkpoint.pt"
    ck = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
    if args.variant == "dfly":
        if args.draft_vocab is not None:
            sys.exit("error: --draft-vocab: DFly drafts over the target's whole vocabulary (its correction chain "
                     "embeds each drafted token), so it has no reduced head")
        cfg.extra.update({"architectures": ["Qwen3DFlyModel"]})
        if not args.no_hidden_correction:
            cfg.extra.update({"enable_hidden_correction": True, "hidden_correction_intermediate_size": H})
    d2t = None
    if ck is not None and ck.get("d2t") is not None:
        d2t = ck["d2t"]  # the vocabulary the run started with, whatever data came since
        if args.draft_vocab not in (None, len(d2t)):
            sys.exit(f"error: {ckpt_path} has a draft vocabulary of {len(d2t)}, not {args.draft_vocab}")
    elif getattr(args, "init_d2t", None) is not None and args.draft_vocab in (None, len(args.init_d2t)):
        d2t = args.init_d2t  # the warm start's own vocabulary
    elif args.draft_vocab is not None:
        if not 0 < args.draft_vocab < manifest["n_vocab"]:
            sys.exit(f"error: --draft-vocab {args.draft_vocab} is not within 1..{manifest['n_vocab'] - 1}")
        d2t = draft_vocab(seqs, args.draft_vocab, manifest["n_vocab"])
    head = DraftHead(head, d2t)
    if d2t is not None:
        cfg.extra["draft_vocab_size"] = len(d2t)
        covered = sum(int((head.t2d[s.ids[s.prompt_len:]] >= 0).sum()) for s in seqs)
        total = sum(len(s.ids) - s.prompt_len for s in seqs)
        print(f"draft vocabulary {len(d2t)}: {100 * covered / total:.2f} % of response tokens", flush=True)
    model = (DFlyDrafter if args.variant == "dfly" else Drafter)(cfg)
    if init is not None:
        missing, unexpected = model.load_state_dict(init, strict=False)
        grown = {f"layers.{i}." for i in range(args.init_layers, args.layers)}
        if args.variant == "dfly":
            grown |= {"layer_fusion_weights", "hidden_correction."}
        missing = [k for k in missing if not any(k.startswith(g) for g in grown)]
        if missing or unexpected:
            sys.exit(f"error: --init-from {args.init_from}: missing {missing}, unexpected {unexpected}")
        grow_layers(model, args.init_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    step, order_pos = 0, 0
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(seqs), generator=gen)
    if ck is not None:
        if ck["config"] != cfg.hf_config():
            sys.exit(f"error: {ckpt_path} is a run with another drafter shape; use another --out")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, order_pos, order = ck["step"], ck["order_pos"], ck["order"]
        gen.set_state(ck["gen"])
        if len(order) != len(seqs):
            # gen-data wrote more shards since: a new epoch over all of them.
            order, order_pos = torch.randperm(len(seqs), generator=gen), 0
        print(f"resumed at step {step}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{len(seqs)} sequences, {sum(len(s.ids) - s.prompt_len for s in seqs)} response tokens; "
          f"drafter {n_params / 1e6:.2f}M parameters, {cfg.num_hidden_layers} layers", flush=True)
    log = open(args.out / "log.jsonl", "a")
    t0, hist = time.time(), []
    while step < args.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        opt.zero_grad()
        for _ in range(args.seqs):
            if order_pos >= len(order):
                order, order_pos = torch.randperm(len(seqs), generator=gen), 0
            seq = seqs[order[order_pos]]
            order_pos += 1
            r = step_on(model, seq, embed, head, args, gen)
            if r is None:
                continue
            loss, hits, w = r
            (loss / args.seqs).backward()
            hist.append((loss.item(), accept_length(hits, w).mean().item()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            l, t = (sum(x) / len(hist) for x in zip(*hist))
            rec = {"step": step, "loss": round(l, 4), "tau_proxy": round(t, 3),
                   "lr": lr_at(step, args), "s_per_step": round((time.time() - t0) / 50, 3)}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            t0, hist = time.time(), []
        if step % args.eval_every == 0 or step == args.steps:
            if held:
                rec = {"step": step, "heldout": evaluate(model, held, embed, head, args)}
                print(json.dumps(rec), flush=True)
                log.write(json.dumps(rec) + "\n")
                log.flush()
        if step % args.save_every == 0 or step == args.steps:
            save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                         "order": order, "order_pos": order_pos, "gen": gen.get_state(),
                         "config": cfg.hf_config(), "d2t": head.d2t}, ckpt_path)
            export_hf(model, head, args.out / "hf")
    print(f"done: {args.out / 'hf'}", flush=True)


if __name__ == "__main__":
    main()
