#!/usr/bin/env python3
"""Golden fixtures for the DFlash / DFlash2 block drafters (run once; CI never runs it).

Writes, under tests/fixtures/dflash/:
  target-qwen3.gguf     tiny random Qwen3 target (F32), llama.cpp `qwen3` schema
  dflash-v1.gguf        tiny random DFlash v1 drafter (F32), llama.cpp `dflash` schema
  dflash2.gguf          tiny random DFlash2 drafter (F32), `dflash` schema + conv/selector
  golden-v1.json        reference activations / logits / tokens for dflash-v1.gguf
  golden-v2.json        same for dflash2.gguf (+ conv taps of layer 0, selector lattice)
  golden-rejection.json synthetic cases for dflash.model._rejection_sample,
                        _sampling_probs and the greedy acceptance rule

Reference implementation: PyPI `dflash` 0.1.0 (`dflash/model.py`), driven directly on CPU as
in shared/spec/dflash-reference.md §5.1/§5.2.  GGUF layout: shared/spec/dflash-family.md §1,
§2, §5 and llama.cpp's `conversion/qwen.py` (`Qwen3Model`, `DFlashModel`).

Environment actually used (2026-11-29, 2-core x86_64 CPU box, Python 3.11.7):
    python3 -m venv /work/venv-dflash
    /work/venv-dflash/bin/pip install torch==2.13.0 transformers==5.15.0 safetensors numpy gguf==0.19.0
    /work/venv-dflash/bin/pip install --no-deps dflash==0.1.0
  Only PyPI is reachable, so torch is the default PyPI wheel (the CUDA build, several GB with
  its nvidia-* dependencies); it runs on CPU unchanged.  No GPU is touched:
  `dflash.model._cuda_time` (which calls torch.cuda.synchronize) is rebound to
  time.perf_counter before dflash_generate(return_stats=True).
  The exact versions found at run time are also written to each JSON ("versions").

Run:  /work/venv-dflash/bin/python tests/golden/make_dflash_golden.py   (~1 min, deterministic:
      a second run reproduces every output byte for byte)

Checks built in (the script fails if any does not hold): GGUF re-read with GGUFReader (names,
ggml dims, F32, KV values, data == torch weights); dflash_generate(T=0) output == block_size=1
output == plain HF greedy; draft run with the context fed in two pieces through the draft KV cache
== one-shot run; _rejection_sample accept count == documented formula with the recorded
uniforms; and `numpy_check`: an independent float64 numpy implementation that reads only the
GGUF files reproduces the goldens (f64 set to ~1e-13, f32 set to ~1e-5, DFlash2 conv taps and
selector path exactly).  JSON schema: tests/fixtures/dflash/README.md.

Model configuration (all float32, seeded):
  target  Qwen3: V=256, H=64, I=128, 6 layers, 4 q heads, 2 kv heads, head_dim 16,
          rope_theta 1e4, rms eps 1e-6, tied embeddings (no output.weight), max_pos 256.
  drafts  Qwen3-style, same H/I/heads, 2 layers, block_size 8, target_layer_ids [1, 3]
          (HF convention; GGUF dflash.target_layers = [2, 4], the +1 shift), mask token V-1.
  DFlash2 adds conv_kernel_size 2, conv_group_size 16, selector_rank 8, selector_top_k 4.

Weight re-initialisation (HF default std 0.02 gives flat logits, spec ref §5.1):
  matrices N(0, 0.15); embedding (tied, = lm_head) N(0, 0.5); RMSNorm weights 1 + N(0, 0.1);
  DFlash2 base_kernel (torch.empty in the reference!) tap 0 = 1 + N(0, 0.2), other taps N(0, 0.3);
  kernel_projection N(0, 0.05); selector codebooks N(0, 0.5); hidden_projection N(0, 0.15).

Drafter fitting (deviation from "purely random", on purpose): a random drafter never agrees
with the target, so every acceptance length would be 1 and the multi-token bookkeeping of the
loop (context of c > 1 new positions, cache crop, bonus at the last slot) would go untested.
So after the random init each drafter gets FIT_STEPS full-batch Adam steps (lr FIT_LR) of the
DFlash objective on this one prompt: for every anchor s in [P, P+MAX_NEW-2] of the target's
greedy continuation, block [x_s, MASK x 7] with context features of positions < s, labels
x_{s+1..s+7} (cross-entropy through the target's tied head).  The selector tables are not
trained.  The GGUF files hold the final weights, so the fitting need not be reproduced.

Conv base mapping (DFlash2): torch `layers.i.attention_conv.base_kernel` has shape
[2, K, H] = [side, tap, channel] (side 0 = before the sub-layer, 1 = after).  It is written
unchanged as the numpy array [2, K, H], i.e. ggml dims {H, K, 2}: element (side s, tap t,
channel c) sits at flat offset c + H*(t + K*s).  `kernel_projection.weight` [2*K*G, H] is written
as ggml {H, 2*K*G}; its output row index is g + G*(t + K*s) (torch view [..., 2, K, G]), group of
channel c is c // conv_group_size.  No permutation anywhere.  Same for mlp_conv -> ffn_conv_*.

Qwen3 RoPE is NEOX style (rotate_half over the two halves of head_dim); the llama.cpp qwen3
converter does NOT permute q/k (unlike the `llama` arch), so none is applied here.
"""

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("GOLDEN_THREADS", "1")))

import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

import gguf  # noqa: E402
import dflash  # noqa: E402
import dflash.model as dm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "dflash"

V, H, I_FF, N_LAYER, N_HEAD, N_KV, HEAD_DIM = 256, 64, 128, 6, 4, 2, 16
ROPE_THETA, RMS_EPS, MAX_POS = 10000.0, 1e-6, 256
D_LAYERS, BLOCK, TARGET_IDS, MASK_ID = 2, 8, [1, 3], V - 1
CONV_K, CONV_G, SEL_RANK, SEL_TOPK = 2, 16, 8, 4
MAX_NEW = 24
FIT_STEPS, FIT_LR = 20, 3e-3
PROMPT = [3, 17, 42, 99, 7, 128, 64, 200, 5, 31, 77, 150]  # P = 12
PREFIX = 5  # cache-path split: context [0, PREFIX) first, then [PREFIX, P)

SIG = 9  # significant digits in JSON floats (round-trips float32 exactly)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def fl(t, sig=None):
    """tensor/array -> nested lists of floats with SIG (float64 data: 17) significant digits"""
    sig = sig or (17 if torch.is_tensor(t) and t.dtype == torch.float64 else SIG)
    a = np.asarray(t.detach().cpu().double().numpy() if torch.is_tensor(t) else t, dtype=np.float64)

    def conv(x):
        if isinstance(x, list):
            return [conv(y) for y in x]
        return float(f"{x:.{sig}g}")
    return conv(a.tolist())


def il(t):
    a = t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)
    return a.astype(np.int64).tolist()


def make_target_config():
    return Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=I_FF, num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD, num_key_value_heads=N_KV, head_dim=HEAD_DIM,
        rope_theta=ROPE_THETA, rms_norm_eps=RMS_EPS, max_position_embeddings=MAX_POS,
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        layer_types=["full_attention"] * N_LAYER,
    )


def make_draft_config(v2):
    cfg = Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=I_FF, num_hidden_layers=D_LAYERS,
        num_attention_heads=N_HEAD, num_key_value_heads=N_KV, head_dim=HEAD_DIM,
        rope_theta=ROPE_THETA, rms_norm_eps=RMS_EPS, max_position_embeddings=MAX_POS,
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
        layer_types=["full_attention"] * D_LAYERS,
    )
    cfg.num_target_layers = N_LAYER
    cfg.block_size = BLOCK
    dc = {"target_layer_ids": list(TARGET_IDS), "mask_token_id": MASK_ID, "block_size": BLOCK}
    if v2:
        dc.update(conv_kernel_size=CONV_K, conv_group_size=CONV_G,
                  selector_rank=SEL_RANK, selector_top_k=SEL_TOPK)
        cfg.architectures = ["DFlash2DraftModel"]
    else:
        cfg.architectures = ["DFlashDraftModel"]
    cfg.dflash_config = dc
    return cfg


@torch.no_grad()
def reinit(model, gen, *, embed=False):
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith("base_kernel"):
            w = 0.3 * torch.randn(p.shape, generator=gen)
            w[:, 0, :] = 1.0 + 0.2 * torch.randn(p.shape[0], p.shape[2], generator=gen)
            p.copy_(w)
        elif "kernel_projection" in name:
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        elif "codebook" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name


def fit_drafter(draft, target, prompt):
    """FIT_STEPS Adam steps of the DFlash block objective on the prompt's greedy continuation."""
    P = prompt.shape[1]
    with torch.no_grad():
        ids = prompt.clone()
        for _ in range(MAX_NEW + BLOCK):
            ids = torch.cat([ids, torch.argmax(target(ids).logits[0, -1]).view(1, 1)], 1)
        feats = dm.extract_context_feature(target(ids, output_hidden_states=True).hidden_states,
                                           draft.target_layer_ids)
    seq = ids[0]
    head = dm._output_head(target)
    for p in target.parameters():
        p.requires_grad_(False)
    draft.train()
    opt = torch.optim.Adam(draft.parameters(), lr=FIT_LR)
    anchors = list(range(P, P + MAX_NEW - 1))
    for _ in range(FIT_STEPS):
        opt.zero_grad()
        loss = 0.0
        for s in anchors:
            blk = torch.full((1, BLOCK), MASK_ID, dtype=torch.long)
            blk[0, 0] = seq[s]
            noise = dm._raw_input_embeddings(target, blk)
            h = draft(target_hidden=feats[:, :s], noise_embedding=noise,
                      position_ids=torch.arange(s + BLOCK)[None])
            lg = draft.compute_logits(h[:, 1:], head)
            loss = loss + torch.nn.functional.cross_entropy(lg[0], seq[s + 1:s + BLOCK])
        loss.backward()
        opt.step()
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(False)
    print(f"fitted {type(draft).__name__}: final mean CE {loss.item() / len(anchors):.3f}")


# --------------------------------------------------------------------------------------
# GGUF writing (llama.cpp converter conventions)
# --------------------------------------------------------------------------------------

LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # DFlash2
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
GLOBAL_MAP = {
    # target
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    # drafter
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    "candidate_selector.predecessor_codebook.weight": "selector_predecessor.weight",
    "candidate_selector.successor_codebook.weight": "selector_successor.weight",
}


def gguf_name(name):
    if name in GLOBAL_MAP:
        return GLOBAL_MAP[name]
    parts = name.split(".")
    if parts[0] == "model":
        parts = parts[1:]
    assert parts[0] == "layers", name
    bid = int(parts[1])
    rest = ".".join(parts[2:])
    return f"blk.{bid}.{LAYER_MAP[rest]}"


def add_common_kv(w, arch, n_layer):
    w.add_block_count(n_layer)
    w.add_context_length(MAX_POS)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def write_gguf(path, arch, model, extra_kv, skip=()):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    add_common_kv(w, arch, model.config.num_hidden_layers)
    extra_kv(w)
    names = []
    for name, t in model.state_dict().items():
        if name in skip:
            continue
        gname = gguf_name(name)
        arr = t.detach().cpu().to(torch.float32).numpy().copy()
        w.add_tensor(gname, arr)  # numpy [out, in] -> ggml {in, out}
        names.append((gname, tuple(arr.shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def verify_gguf(path, expect):
    """re-read with GGUFReader; expect: {name: torch-shape}. Prints a summary."""
    r = gguf.GGUFReader(str(path))
    got = {}
    for t in r.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, (t.name, t.tensor_type)
        got[t.name] = tuple(int(x) for x in t.shape)  # ggml order {ne0, ne1, ...}
    want = {n: tuple(reversed(s)) for n, s in expect}
    assert got == want, (set(got) ^ set(want), [(k, got.get(k), want.get(k)) for k in want if got.get(k) != want.get(k)])
    kv = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        kv[f.name] = f.contents()
    print(f"== {path.relative_to(ROOT)}: {len(got)} tensors, {path.stat().st_size} bytes")
    for k, v in kv.items():
        print(f"   {k} = {v!r}")
    for n in sorted(got, key=lambda s: (not s.startswith("blk."), s)):
        if n.startswith("blk.") and not n.startswith("blk.0."):
            continue
        print(f"   {n:34s} ggml {got[n]}")
    return kv, got


# --------------------------------------------------------------------------------------
# reference runs
# --------------------------------------------------------------------------------------

class pure_f64:
    """Patch Qwen3RMSNorm / Qwen3RotaryEmbedding so a float64 model computes norms and RoPE
    tables in float64 (stock HF forces float32 there)."""

    def __enter__(self):
        from transformers.models.qwen3 import modeling_qwen3 as mq
        self.mq = mq
        self.norm_fwd, self.rope_fwd = mq.Qwen3RMSNorm.forward, mq.Qwen3RotaryEmbedding.forward

        def norm_fwd(mod, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return mod.weight * (x * torch.rsqrt(var + mod.variance_epsilon))

        def rope_fwd(mod, x, position_ids):
            cfg = mod.config
            d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            freqs = position_ids[:, :, None].double() * inv[None, None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

        mq.Qwen3RMSNorm.forward, mq.Qwen3RotaryEmbedding.forward = norm_fwd, rope_fwd
        return self

    def __exit__(self, *exc):
        self.mq.Qwen3RMSNorm.forward, self.mq.Qwen3RotaryEmbedding.forward = self.norm_fwd, self.rope_fwd
        return False


class ConvRecorder:
    """wraps dflash.model._grouped_dynamic_convolve to record calls (only when .on)."""

    def __init__(self):
        self.orig = dm._grouped_dynamic_convolve
        self.calls = []
        self.on = False

    def __call__(self, hidden, dynamic, base, group_size):
        out = self.orig(hidden, dynamic, base, group_size)
        if self.on:
            self.calls.append(dict(input=hidden[0].clone(), dynamic=dynamic[0].clone(),
                                   base=base.clone(), output=out[0].clone()))
        return out


def record_target_calls(target):
    calls = []
    orig = target.forward

    def fwd(input_ids=None, *a, **k):
        calls.append(dict(ids=input_ids[0].tolist(), pos=k["position_ids"][0].tolist()))
        return orig(input_ids, *a, **k)
    target.forward = fwd
    return calls, lambda: setattr(target, "forward", orig)


@torch.no_grad()
def draft_step(draft, target, ctx, block_ids, pos, cache=None):
    noise = dm._raw_input_embeddings(target, block_ids,
                                     float(dm._draft_value(draft.config, "input_embedding_scale", 1.0)))
    kw = dict(past_key_values=cache, use_cache=True) if cache is not None else {}
    hidden = draft(target_hidden=ctx, noise_embedding=noise, position_ids=pos, **kw)
    return noise, hidden


@torch.no_grad()
def run_drafter(kind, target, draft, prompt, versions, conv_rec=None):
    v2 = kind == "v2"
    P = prompt.shape[1]
    head = dm._output_head(target)
    g = {"format": FORMAT_DOC, "versions": versions, "kind": "dflash2" if v2 else "dflash-v1"}
    g["config"] = dict(
        vocab_size=V, hidden_size=H, intermediate_size=I_FF, target_layers=N_LAYER,
        draft_layers=D_LAYERS, n_head=N_HEAD, n_head_kv=N_KV, head_dim=HEAD_DIM,
        rope_theta=ROPE_THETA, rms_eps=RMS_EPS, block_size=BLOCK,
        target_layer_ids_hf=TARGET_IDS, target_layers_gguf=[i + 1 for i in TARGET_IDS],
        mask_token_id=MASK_ID, dtype="float32",
        target_gguf="target-qwen3.gguf", draft_gguf="dflash2.gguf" if v2 else "dflash-v1.gguf",
    )
    if v2:
        g["config"].update(conv_kernel_size=CONV_K, conv_group_size=CONV_G,
                           selector_rank=SEL_RANK, selector_top_k=SEL_TOPK,
                           conv_base_layout=CONV_LAYOUT_DOC)

    # 1. target prefill
    out = target(prompt, position_ids=torch.arange(P)[None], output_hidden_states=True)
    tlog = out.logits[0]
    anchor = int(torch.argmax(tlog[-1]))
    ctx = dm.extract_context_feature(out.hidden_states, draft.target_layer_ids)  # [1,P,T*H]
    g["prompt_ids"] = prompt[0].tolist()
    g["target_logits"] = fl(tlog)
    g["target_last_logits"] = fl(tlog[-1])
    g["target_next_token"] = anchor
    g["target_argmax_all_rows"] = il(torch.argmax(tlog, -1))
    g["ctx_features"] = fl(ctx[0])

    # 2. block + draft forward (no cache)
    block_ids = torch.full((1, BLOCK), MASK_ID, dtype=torch.long)
    block_ids[0, 0] = anchor
    pos = torch.arange(P + BLOCK)[None]
    if conv_rec is not None:
        conv_rec.calls.clear()
        conv_rec.on = True
    noise, hidden = draft_step(draft, target, ctx, block_ids, pos)
    if conv_rec is not None:
        conv_rec.on = False
    fused = draft.hidden_norm(draft.fc(ctx))
    logits = draft.compute_logits(hidden[:, 1:], head)  # [1,B-1,V]
    g["block_ids"] = block_ids[0].tolist()
    g["block_positions"] = list(range(P, P + BLOCK))
    g["context_positions"] = list(range(0, P))
    g["noise_embedding"] = fl(noise[0])
    g["fused_context"] = fl(fused[0])
    g["draft_hidden"] = fl(hidden[0])
    g["draft_logits"] = fl(logits[0])
    g["draft_argmax"] = il(torch.argmax(logits[0], -1))

    if v2:
        calls = conv_rec.calls
        assert len(calls) == 4 * D_LAYERS, len(calls)
        names = ["attn_pre", "attn_post", "ffn_pre", "ffn_post"]
        g["conv_layer0"] = {
            n: dict(input=fl(c["input"]), dynamic=fl(c["dynamic"]), output=fl(c["output"]))
            for n, c in zip(names, calls[:4])
        }
        path, cand, q = draft.propose(hidden[:, 1:], block_ids[:, 0], head, 0.0)
        assert q is None
        # recompute the lattice (scores of the chosen predecessor) for the record
        sel = draft.candidate_selector
        unary = torch.gather(logits, -1, cand)
        proj = sel.hidden_projection(hidden[:, 1:])
        pred = block_ids[:, 0]
        scores_rows, full_rows = [], []
        for r in range(BLOCK - 1):
            s = unary[:, r] + torch.einsum("br,bkr->bk", sel.predecessor_codebook(pred) * proj[:, r],
                                           sel.successor_codebook(cand[:, r]))
            scores_rows.append(s[0])
            assert int(cand[0, r, int(torch.argmax(s[0]))]) == int(path[0, r])
            # full K x K lattice vs every candidate of the previous row (row 0: the anchor only)
            preds = block_ids[:, 0].expand(SEL_TOPK) if r == 0 else cand[0, r - 1]
            full = unary[0, r][None, :] + torch.einsum(
                "pr,kr->pk", sel.predecessor_codebook(preds) * proj[0, r][None], sel.successor_codebook(cand[0, r]))
            full_rows.append(full)
            pred = path[:, r]
        order = torch.argsort(unary[0], dim=-1, descending=True)
        g["selector"] = dict(
            candidates=il(cand[0]),
            unary=fl(unary[0]),
            candidates_sorted_by_logit=il(torch.gather(cand[0], -1, order)),
            hidden_projection=fl(proj[0]),
            path_scores=fl(torch.stack(scores_rows)),
            lattice=fl(torch.stack(full_rows)),
            path=il(path[0]),
            path_differs_from_argmax=[int(a) != int(b) for a, b in zip(path[0], torch.argmax(logits[0], -1))],
        )

    # 2b. same single step in float64 (same weights, exactly widened) for f64 ports.  HF's
    # Qwen3RMSNorm casts to float32 internally and Qwen3RotaryEmbedding builds cos/sin in float32
    # even for a float64 model, so both are patched to stay in float64 here (pure_f64).
    t64 = copy.deepcopy(target).double()
    d64 = copy.deepcopy(draft).double()
    with pure_f64():
        o64 = t64(prompt, position_ids=torch.arange(P)[None], output_hidden_states=True)
        ctx64 = dm.extract_context_feature(o64.hidden_states, d64.target_layer_ids)
        assert int(torch.argmax(o64.logits[0, -1])) == anchor
        _, h64 = draft_step(d64, t64, ctx64, block_ids, pos)
        l64 = d64.compute_logits(h64[:, 1:], dm._output_head(t64))
        if v2:
            p64, _, _ = d64.propose(h64[:, 1:], block_ids[:, 0], dm._output_head(t64), 0.0)
    assert torch.equal(torch.argmax(l64[0], -1), torch.argmax(logits[0], -1))
    g["f64"] = dict(
        doc=("17 significant digits; same inputs and weights run fully in float64 (weights widened exactly from the f32 GGUF "
             "values; RMSNorm and RoPE tables also in float64, unlike stock HF which does both in float32)"),
        target_last_logits=fl(o64.logits[0, -1]), ctx_features=fl(ctx64[0]),
        draft_hidden=fl(h64[0]), draft_logits=fl(l64[0]),
        max_abs_diff_f32_vs_f64_draft_logits=float((l64.float() - logits).abs().max()),
    )
    if v2:
        g["f64"]["selector_path"] = il(p64[0])
    del t64, d64

    # 3. cache path: context in two pieces
    cache = dm._make_cache(draft.config)
    pre_ids = torch.full((1, BLOCK), MASK_ID, dtype=torch.long)
    pre_ids[0, 0] = prompt[0, PREFIX]
    _, h_pre = draft_step(draft, target, ctx[:, :PREFIX], pre_ids,
                          torch.arange(0, PREFIX + BLOCK)[None], cache)
    assert cache.get_seq_length() == PREFIX + BLOCK
    dm._crop_to(cache, PREFIX)
    assert cache.get_seq_length() == PREFIX
    pre_logits = draft.compute_logits(h_pre[:, 1:], head)
    _, h2 = draft_step(draft, target, ctx[:, PREFIX:], block_ids,
                       torch.arange(PREFIX, P + BLOCK)[None], cache)
    logits2 = draft.compute_logits(h2[:, 1:], head)
    diff_h = float((h2 - hidden).abs().max())
    diff_l = float((logits2 - logits).abs().max())
    print(f"[{kind}] cache path: max|dhidden|={diff_h:.3g} max|dlogits|={diff_l:.3g}")
    assert torch.allclose(h2, hidden, atol=1e-5, rtol=1e-5), diff_h
    assert torch.allclose(logits2, logits, atol=1e-4, rtol=1e-5), diff_l
    assert torch.equal(torch.argmax(logits2, -1), torch.argmax(logits, -1))
    g["cache_path"] = dict(
        prefix_len=PREFIX,
        step1_block_ids=pre_ids[0].tolist(),
        step1_positions=list(range(0, PREFIX + BLOCK)),
        step1_draft_logits=fl(pre_logits[0]),
        step1_draft_argmax=il(torch.argmax(pre_logits[0], -1)),
        step2_positions=list(range(PREFIX, P + BLOCK)),
        max_abs_diff_hidden=diff_h,
        max_abs_diff_logits=diff_l,
    )

    # 4. end to end
    dm._cuda_time = time.perf_counter
    calls, restore = record_target_calls(target)
    res = dm.dflash_generate(draft, target, prompt, MAX_NEW, None, temperature=0.0, return_stats=True)
    restore()
    base = dm.dflash_generate(draft, target, prompt, MAX_NEW, None, temperature=0.0, block_size=1)
    # plain greedy with the HF model as a third opinion
    ids = prompt.clone()
    for _ in range(MAX_NEW):
        nxt = torch.argmax(target(ids).logits[0, -1])
        ids = torch.cat([ids, nxt.view(1, 1)], 1)
    assert torch.equal(res.output_ids, base), (res.output_ids, base)
    assert torch.equal(base, ids), (base, ids)
    assert sum(res.acceptance_lengths) == MAX_NEW - 1, res.acceptance_lengths
    print(f"[{kind}] e2e output {res.output_ids[0, P:].tolist()} acceptance {res.acceptance_lengths}")
    verify = calls[1:]
    assert len(verify) == len(res.acceptance_lengths)
    g["e2e"] = dict(
        max_new_tokens=MAX_NEW,
        temperature=0.0,
        output_ids=res.output_ids[0].tolist(),
        new_ids=res.output_ids[0, P:].tolist(),
        num_output_tokens=int(res.num_output_tokens),
        acceptance_lengths=list(map(int, res.acceptance_lengths)),
        greedy_block_size_1=base[0].tolist(),
        verify_blocks=[c["ids"] for c in verify],
        verify_positions=[c["pos"][0] for c in verify],
    )
    return g


FORMAT_DOC = (
    "JSON, float arrays as nested lists (row-major, torch order, batch dim dropped), "
    "values printed with 9 significant digits (exact float32 round trip). All activations "
    "are the float32 torch reference (dflash 0.1.0). Shapes: P=len(prompt_ids), B=block_size, "
    "T=len(target_layer_ids), H=hidden, V=vocab."
)
CONV_LAYOUT_DOC = (
    "torch base_kernel [2, K, H] = [side, tap, channel] (side 0 before sub-layer, 1 after) written as "
    "numpy [2,K,H] -> ggml {H, K, 2}: base[s][t][c] at flat c + H*(t + K*s). kernel_projection.weight "
    "[2*K*G, H] -> ggml {H, 2*K*G}; output index g + G*(t + K*s); G = H/conv_group_size, group(c) = "
    "c // conv_group_size. conv out[i,c] = sum_t (base[s][t][c] + dyn[i][s][t][group(c)]) * x[i-t,c], "
    "x[<0]=0 (block only)."
)


@torch.no_grad()
def rejection_cases(versions):
    gen = torch.Generator().manual_seed(1234)
    cases = []

    def probs(shape, sharp=2.0):
        return torch.softmax(sharp * torch.randn(shape, generator=gen, dtype=torch.float64), -1).float()

    captured = []
    orig_sample = dm._sample_probs

    def cap(p):
        captured.append(p.clone())
        return orig_sample(p)

    specs = [
        # (gamma, V, draft_indices K or None, seed, forced accept prefix)
        (3, 8, None, 0, None),
        (4, 8, None, 1, None),
        (3, 8, None, 2, "all"),       # target == draft on drafted tokens -> all accepted
        (5, 16, None, 3, None),
        (3, 8, 4, 4, None),           # DFlash2 style: q only on K candidates
        (4, 16, 4, 5, None),
        (3, 8, 4, 6, "first_reject"),  # p of first draft token tiny
        (5, 16, 4, 7, None),
        (6, 8, None, 8, None),
        (6, 8, 4, 9, None),
    ]
    dm._sample_probs = cap
    try:
        for gamma, vv, k, seed, force in specs:
            tp = probs((1, gamma + 1, vv))
            if k is None:
                dp = probs((1, gamma, vv))
                tok = torch.stack([torch.multinomial(dp[0, j], 1, generator=gen)[0] for j in range(gamma)])[None]
                di = None
            else:
                di = torch.stack([torch.randperm(vv, generator=gen)[:k] for _ in range(gamma)])[None]
                dp = probs((1, gamma, k))
                pick = torch.stack([torch.multinomial(dp[0, j], 1, generator=gen)[0] for j in range(gamma)])
                tok = di[0, torch.arange(gamma), pick][None]
            if force is None:
                # correlate target with draft so that some drafts are accepted
                dfull = dp if di is None else torch.zeros(1, gamma, vv).scatter(-1, di, dp)
                tp[:, :gamma] = 0.6 * dfull + 0.4 * tp[:, :gamma]
            if force == "all":
                tp[0, :gamma] = dp[0]
            if force == "first_reject":
                tp[0, 0, tok[0, 0]] = 1e-6
                tp[0, 0] /= tp[0, 0].sum()
            # the uniforms: the first RNG draw inside _rejection_sample is torch.rand_like(q)
            p = tp[:, :gamma].gather(-1, tok[..., None])[..., 0]
            q = dp.gather(-1, tok[..., None])[..., 0] if di is None else (dp * (di == tok[..., None])).sum(-1)
            torch.manual_seed(seed)
            u = torch.rand_like(q)
            torch.manual_seed(seed)
            captured.clear()
            acc, bonus = dm._rejection_sample(tok, tp, dp, di)
            assert len(captured) == 1
            exp_acc = int((u * q < p).to(torch.int32).cumprod(-1).sum())
            assert exp_acc == acc, (exp_acc, acc)
            dist = captured[0].reshape(-1)
            assert dist[int(bonus)] > 0
            cases.append(dict(
                gamma=gamma, vocab=vv, torch_seed=seed,
                draft_tokens=il(tok[0]),
                target_probs=fl(tp[0]), draft_probs=fl(dp[0]),
                draft_indices=il(di[0]) if di is not None else None,
                p=fl(p[0]), q=fl(q[0]), uniforms=fl(u[0]),
                accepted=int(acc),
                bonus_distribution=fl(dist),
                bonus_token=int(bonus),
            ))
    finally:
        dm._sample_probs = orig_sample

    samp = []
    for (temp, top_p, top_k) in [(1.0, 1.0, 0), (0.7, 1.0, 5), (1.3, 0.8, 0), (0.5, 0.9, 10)]:
        lg = 2.0 * torch.randn(2, 16, generator=gen)
        samp.append(dict(temperature=temp, top_p=top_p, top_k=top_k, logits=fl(lg),
                         probs=fl(dm._sampling_probs(lg, temp, top_p, top_k))))

    greedy = []
    for draft_toks, post in [([5, 6, 7], [5, 6, 9, 1]), ([5, 6, 7], [4, 6, 7, 1]),
                             ([5, 6, 7], [5, 6, 7, 8]), ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 0, 5, 6, 7, 9])]:
        d = torch.tensor([draft_toks])
        pst = torch.tensor([post])
        a = int((d == pst[:, :-1]).cumprod(dim=1).sum(dim=1)[0])
        greedy.append(dict(draft_tokens=draft_toks, target_argmax=post, accepted=a,
                           bonus=int(pst[0, a]), produced=a + 1))

    return {
        "format": FORMAT_DOC,
        "versions": versions,
        "doc": (
            "rejection: dflash.model._rejection_sample(draft_tokens[1,gamma], target_probs[1,gamma+1,V], "
            "draft_probs[1,gamma,V] or [1,gamma,K] with draft_indices[1,gamma,K]). p_j = target_probs[j, tok_j]; "
            "q_j = draft_probs[j, tok_j] (or the candidate-matched entry). accepted = number of leading j with "
            "u_j*q_j < p_j, where u = torch.rand_like(q) right after torch.manual_seed(torch_seed) -- the "
            "uniforms are recorded so no torch RNG is needed. If accepted == gamma the bonus is sampled from "
            "target_probs[gamma]; else from normalize(max(target_probs[a] - draft_probs[a], 0)) (DFlash2: the "
            "draft probs are subtracted only at draft_indices[a], via scatter_add), falling back to "
            "target_probs[a] when that residual sums to 0. bonus_distribution is the exact vector passed to "
            "torch.multinomial; bonus_token is what torch drew (its uniform is not reproducible outside torch; "
            "check only that it has positive probability). sampling_probs: dflash.model._sampling_probs("
            "logits, temperature, top_p, top_k): softmax(logits/T) after top-k (0 = off) then top-p (keep "
            "sorted tokens while cumsum - p < top_p), renormalised. greedy: accepted = leading matches of "
            "draft_tokens[j] == target_argmax[j] (target_argmax row j predicts the token after block slot j), "
            "bonus = target_argmax[accepted], produced = accepted + 1."
        ),
        "rejection": cases,
        "sampling_probs": samp,
        "greedy": greedy,
    }


# --------------------------------------------------------------------------------------
# independent numpy re-implementation from the GGUF files (checks layout + documented math)
# --------------------------------------------------------------------------------------

def _gguf_tensors(path):
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        ne = [int(x) for x in t.shape]  # ggml order
        flat = np.asarray(t.data, dtype=np.float64).reshape(-1)
        out[t.name] = (flat, ne)
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return out, kv


def _mat(tens, name):
    """ggml {ne0, ne1} -> numpy [ne1, ne0] (row = output feature for a Linear weight)"""
    flat, ne = tens[name]
    return flat.reshape(list(reversed(ne)))


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_neox(x, pos, theta):
    # x [n, heads, d]; NEOX: pairs (i, i + d/2)
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _attn(q, k, v, causal_offset=None):
    # q [nq, nh, d], k/v [nk, nkv, d]; causal_offset: query i sees keys <= i + offset
    nh, nkv, d = q.shape[1], k.shape[1], q.shape[2]
    rep = nh // nkv
    out = np.zeros_like(q)
    for h in range(nh):
        s = q[:, h] @ k[:, h // rep].T / math.sqrt(d)
        if causal_offset is not None:
            qi = np.arange(q.shape[0])[:, None] + causal_offset
            s = np.where(np.arange(k.shape[0])[None, :] <= qi, s, -np.inf)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        out[:, h] = p @ v[:, h // rep]
    return out


def _silu(x):
    return x / (1.0 + np.exp(-x))


def np_target(tt, kv, ids):
    eps, theta = float(kv["qwen3.attention.layer_norm_rms_epsilon"]), float(kv["qwen3.rope.freq_base"])
    nl, nh, nkv, d = (int(kv[f"qwen3.{k}"]) for k in ("block_count", "attention.head_count",
                                                        "attention.head_count_kv", "attention.key_length"))
    E = _mat(tt, "token_embd.weight")
    x = E[ids]
    pos = np.arange(len(ids))
    layer_inputs = []
    for i in range(nl):
        layer_inputs.append(x.copy())
        W = lambda n: _mat(tt, f"blk.{i}.{n}.weight")  # noqa: E731
        a = _rms(x, W("attn_norm"), eps)
        q = _rms((a @ W("attn_q").T).reshape(-1, nh, d), W("attn_q_norm"), eps)
        k = _rms((a @ W("attn_k").T).reshape(-1, nkv, d), W("attn_k_norm"), eps)
        v = (a @ W("attn_v").T).reshape(-1, nkv, d)
        o = _attn(_rope_neox(q, pos, theta), _rope_neox(k, pos, theta), v, causal_offset=0)
        x = x + o.reshape(len(ids), -1) @ W("attn_output").T
        b = _rms(x, W("ffn_norm"), eps)
        x = x + (_silu(b @ W("ffn_gate").T) * (b @ W("ffn_up").T)) @ W("ffn_down").T
    layer_inputs.append(x.copy())  # == input of a virtual block n_layer (pre final norm)
    logits = _rms(x, _mat(tt, "output_norm.weight"), eps) @ E.T
    return logits, layer_inputs


def _np_conv(x, base_flat, H, K, side, dyn, group):
    # x [B,H]; dyn [B,K,G]; base element (side, tap t, channel c) at c + H*(t + K*side)
    out = np.zeros_like(x)
    for t in range(K):
        base = base_flat[H * (t + K * side): H * (t + K * side) + H]
        xs = np.zeros_like(x)
        xs[t:] = x[: x.shape[0] - t]
        w = base[None, :] + np.repeat(dyn[:, t, :], group, axis=-1)
        out += w * xs
    return out


def np_draft(dt, kv, tt, feats, block_ids, ctx_pos, blk_pos):
    eps, theta = float(kv["dflash.attention.layer_norm_rms_epsilon"]), float(kv["dflash.rope.freq_base"])
    nl, nh, nkv, d, H = (int(kv[f"dflash.{k}"]) for k in ("block_count", "attention.head_count",
                                                          "attention.head_count_kv", "attention.key_length",
                                                          "embedding_length"))
    v2 = "selector_hidden.weight" in dt
    if v2:
        K, group = int(kv["dflash.conv_kernel_size"]), int(kv["dflash.conv_group_size"])
        G = H // group
    E = _mat(tt, "token_embd.weight")
    ctx = _rms(feats @ _mat(dt, "fc.weight").T, _mat(dt, "enc.output_norm.weight"), eps)
    h = E[block_ids]
    Bn = len(block_ids)
    convs = []
    for i in range(nl):
        W = lambda n: _mat(dt, f"blk.{i}.{n}.weight")  # noqa: E731
        a = _rms(h, W("attn_norm"), eps)
        if v2:
            dyn = (a @ W("attn_conv_proj").T).reshape(Bn, 2, K, G)
            base_a = dt[f"blk.{i}.attn_conv_base"][0]
            a = _np_conv(a, base_a, H, K, 0, dyn[:, 0], group)
            convs.append(a)
        q = _rms((a @ W("attn_q").T).reshape(Bn, nh, d), W("attn_q_norm"), eps)
        kk = np.concatenate([ctx @ W("attn_k").T, a @ W("attn_k").T]).reshape(-1, nkv, d)
        kk = _rms(kk, W("attn_k_norm"), eps)
        vv = np.concatenate([ctx @ W("attn_v").T, a @ W("attn_v").T]).reshape(-1, nkv, d)
        allpos = list(ctx_pos) + list(blk_pos)
        o = _attn(_rope_neox(q, blk_pos, theta), _rope_neox(kk, allpos, theta), vv)  # non-causal
        o = o.reshape(Bn, -1) @ W("attn_output").T
        if v2:
            o = _np_conv(o, base_a, H, K, 1, dyn[:, 1], group)
            convs.append(o)
        h = h + o
        b = _rms(h, W("ffn_norm"), eps)
        if v2:
            dyn = (b @ W("ffn_conv_proj").T).reshape(Bn, 2, K, G)
            base_f = dt[f"blk.{i}.ffn_conv_base"][0]
            b = _np_conv(b, base_f, H, K, 0, dyn[:, 0], group)
            convs.append(b)
        m = (_silu(b @ W("ffn_gate").T) * (b @ W("ffn_up").T)) @ W("ffn_down").T
        if v2:
            m = _np_conv(m, base_f, H, K, 1, dyn[:, 1], group)
            convs.append(m)
        h = h + m
    z = _rms(h, _mat(dt, "output_norm.weight"), eps)
    logits = z[1:] @ E.T
    res = dict(hidden=z, logits=logits, convs=convs)
    if v2:
        topk = int(kv["dflash.selector_top_k"])
        A, Bc = _mat(dt, "selector_predecessor.weight"), _mat(dt, "selector_successor.weight")
        proj = z[1:] @ _mat(dt, "selector_hidden.weight").T
        pred, path, cands = block_ids[0], [], []
        for r in range(Bn - 1):
            cand = np.argsort(-logits[r], kind="stable")[:topk]
            score = logits[r][cand] + (Bc[cand] @ (A[pred] * proj[r]))
            pred = int(cand[int(np.argmax(score))])
            path.append(pred)
            cands.append(sorted(cand.tolist()))
        res.update(path=path, cands=cands)
    return res


def numpy_check():
    """Recompute golden values from the GGUF files alone with numpy float64."""
    tt, tkv = _gguf_tensors(OUT / "target-qwen3.gguf")
    for kind, gfn, dfn in (("v1", "golden-v1.json", "dflash-v1.gguf"), ("v2", "golden-v2.json", "dflash2.gguf")):
        g = json.loads((OUT / gfn).read_text())
        dt, dkv = _gguf_tensors(OUT / dfn)
        ids = np.array(g["prompt_ids"])
        logits, inputs = np_target(tt, tkv, ids)
        taps = [int(x) for x in dkv["dflash.target_layers"]]
        feats = np.concatenate([inputs[k] for k in taps], -1)  # GGUF id k = input of block k
        err_t = np.abs(logits - np.array(g["target_logits"])).max()
        err_c = np.abs(feats - np.array(g["ctx_features"])).max()
        err_t64 = np.abs(logits[-1] - np.array(g["f64"]["target_last_logits"])).max()
        res = np_draft(dt, dkv, tt, feats, np.array(g["block_ids"]), g["context_positions"], g["block_positions"])
        err_h = np.abs(res["hidden"] - np.array(g["draft_hidden"])).max()
        err_l = np.abs(res["logits"] - np.array(g["draft_logits"])).max()
        err_l64 = np.abs(res["logits"] - np.array(g["f64"]["draft_logits"])).max()
        print(f"[{kind}] numpy-from-GGUF vs golden: target logits {err_t:.2e} (f64 {err_t64:.2e}), ctx {err_c:.2e}, "
              f"draft hidden {err_h:.2e}, draft logits {err_l:.2e} (f64 {err_l64:.2e})")
        assert err_t < 1e-3 and err_c < 1e-3 and err_h < 1e-3 and err_l < 1e-3
        assert err_t64 < 1e-10 and err_l64 < 1e-10, (err_t64, err_l64)
        assert list(np.argmax(res["logits"], -1)) == g["draft_argmax"]
        if kind == "v2":
            names = ["attn_pre", "attn_post", "ffn_pre", "ffn_post"]
            for n, c in zip(names, res["convs"][:4]):
                e = np.abs(c - np.array(g["conv_layer0"][n]["output"])).max()
                assert e < 1e-3, (n, e)
            assert res["path"] == g["selector"]["path"], (res["path"], g["selector"]["path"])
            assert res["cands"] == [sorted(c) for c in g["selector"]["candidates"]]
            print(f"[{kind}] numpy conv taps and selector path agree: {res['path']}")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    versions = dict(torch=torch.__version__, transformers=transformers.__version__,
                    gguf=getattr(gguf, "__version__", None) or _dist_version("gguf"),
                    dflash=_dist_version("dflash"), numpy=np.__version__,
                    python=sys.version.split()[0])
    print("versions:", versions)

    conv_rec = ConvRecorder()
    dm._grouped_dynamic_convolve = conv_rec

    # ---- target
    torch.manual_seed(0)
    tcfg = make_target_config()
    tcfg._attn_implementation = "sdpa"
    target = Qwen3ForCausalLM(tcfg).eval()
    reinit(target, torch.Generator().manual_seed(1000))
    assert target.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr(), "not tied"
    target = target.float()

    # ---- drafters
    drafts = {}
    for kind, seed in (("v1", 2000), ("v2", 3000)):
        torch.manual_seed(seed)
        cls = dm.DFlash2DraftModel if kind == "v2" else dm.DFlashDraftModel
        d = cls(make_draft_config(kind == "v2")).eval()
        reinit(d, torch.Generator().manual_seed(seed + 1))
        torch.manual_seed(seed + 2)
        fit_drafter(d, target, torch.tensor([PROMPT], dtype=torch.long))
        drafts[kind] = d.float()
        assert d.target_layer_ids == TARGET_IDS and d.block_size == BLOCK and d.mask_token_id == MASK_ID

    # ---- GGUF
    def target_kv(w):
        w.add_vocab_size(V)

    tnames = write_gguf(OUT / "target-qwen3.gguf", "qwen3", target, target_kv, skip={"lm_head.weight"})

    def draft_kv(v2):
        def f(w):
            # gguf 0.19.0 has no add_block_size/add_target_layers (newer gguf-py has); same keys/types:
            w.add_uint32("dflash.block_size", BLOCK)
            w.add_key_value("dflash.target_layers", [i + 1 for i in TARGET_IDS],  # +1 shift (DFlashModel)
                            gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
            w.add_mask_token_id(MASK_ID)
            if v2:
                w.add_uint32("dflash.conv_kernel_size", CONV_K)
                w.add_uint32("dflash.conv_group_size", CONV_G)
                w.add_uint32("dflash.selector_rank", SEL_RANK)
                w.add_uint32("dflash.selector_top_k", SEL_TOPK)
        return f

    v1names = write_gguf(OUT / "dflash-v1.gguf", "dflash", drafts["v1"], draft_kv(False))
    v2names = write_gguf(OUT / "dflash2.gguf", "dflash", drafts["v2"], draft_kv(True))
    summaries = {}
    for fn, nm in (("target-qwen3.gguf", tnames), ("dflash-v1.gguf", v1names), ("dflash2.gguf", v2names)):
        summaries[fn] = verify_gguf(OUT / fn, nm)
    # key checks
    kv_t = summaries["target-qwen3.gguf"][0]
    assert kv_t["general.architecture"] == "qwen3" and kv_t["qwen3.block_count"] == N_LAYER
    assert "output.weight" not in summaries["target-qwen3.gguf"][1]
    for fn in ("dflash-v1.gguf", "dflash2.gguf"):
        kv, tens = summaries[fn]
        assert kv["general.architecture"] == "dflash"
        assert list(kv["dflash.target_layers"]) == [2, 4]
        assert kv["dflash.block_size"] == BLOCK and kv["tokenizer.ggml.mask_token_id"] == MASK_ID
        assert "token_embd.weight" not in tens and "output.weight" not in tens
        assert tens["fc.weight"] == (len(TARGET_IDS) * H, H)
    _, t2 = summaries["dflash2.gguf"]
    assert t2["blk.0.attn_conv_base"] == (H, CONV_K, 2)
    assert t2["blk.0.attn_conv_proj.weight"] == (H, 2 * CONV_K * (H // CONV_G))
    assert t2["selector_hidden.weight"] == (H, SEL_RANK)
    assert t2["selector_predecessor.weight"] == (SEL_RANK, V)
    # the GGUF data must be the exact torch weights (spot-check through the reader)
    r = gguf.GGUFReader(str(OUT / "dflash2.gguf"))
    td = {t.name: t for t in r.tensors}
    base = drafts["v2"].layers[1].mlp_conv.base_kernel.detach().numpy()
    flat = np.asarray(td["blk.1.ffn_conv_base"].data).reshape(-1)
    s, t, c = 1, 1, 37
    assert flat[c + H * (t + CONV_K * s)] == base[s, t, c]
    rt = gguf.GGUFReader(str(OUT / "target-qwen3.gguf"))
    emb = {t.name: t for t in rt.tensors}["token_embd.weight"]
    assert np.array_equal(np.asarray(emb.data).reshape(V, H), target.model.embed_tokens.weight.detach().numpy())

    # ---- golden
    prompt = torch.tensor([PROMPT], dtype=torch.long)
    for kind, fn in (("v1", "golden-v1.json"), ("v2", "golden-v2.json")):
        g = run_drafter(kind, target, drafts[kind], prompt, versions, conv_rec if kind == "v2" else None)
        (OUT / fn).write_text(json.dumps(g, separators=(",", ":")) + "\n")
    (OUT / "golden-rejection.json").write_text(json.dumps(rejection_cases(versions), separators=(",", ":")) + "\n")

    total = 0
    for p in sorted(OUT.iterdir()):
        total += p.stat().st_size
        print(f"   {p.name:24s} {p.stat().st_size:9d} bytes")
    print(f"   total {total} bytes")
    assert total < 4 * 1024 * 1024
    numpy_check()


def _dist_version(name):
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
