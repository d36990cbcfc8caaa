"""The DFlash v1 drafter (z-lab `DFlashDraftModel` layout: module names are
the checkpoint's tensor names) and its training-time forward over many
blocks of one sequence at once (spec: shared/spec/dflash-reference.md §1.1,
§3.2); DFly (§1.3) as a subclass: per-layer context fusion and the
predecessor correction."""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: list  # HF ids (GGUF tap - 1)
    num_target_layers: int
    mask_token_id: int
    vocab_size: int
    block_size: int = 8
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 8192
    extra: dict = field(default_factory=dict)

    def hf_config(self) -> dict:
        """config.json in the z-lab layout, which `blockdraft convert` and the
        PyPI `dflash` reference read."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            # llama.cpp's converter wants the number of taps here (the z-lab
            # reference reads it only when target_layer_ids is absent); the
            # target's depth goes in target_num_hidden_layers.
            "num_target_layers": len(self.target_layer_ids),
            "target_num_hidden_layers": self.num_target_layers,
            "target_hidden_size": self.hidden_size,
            "dflash_config": {"target_layer_ids": self.target_layer_ids,
                              "mask_token_id": self.mask_token_id},
            **self.extra,
        }


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, pos, theta):
    """Rotate-half RoPE of x [..., n, heads, d] at positions pos [..., n]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [..., n, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        h, nh, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, c.rms_norm_eps)
        self.k_norm = RMSNorm(d, c.rms_norm_eps)
        self.c = c

    def kv(self, x, pos):
        c = self.c
        k = self.k_norm(self.k_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim)))
        v = self.v_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return rope(k, pos, c.rope_theta), v

    def forward(self, a, ctx, pos_blk, anchors):
        """a [A, B, H] normed block input; ctx [S, H] fused context.
        Block b's queries see context keys j < anchors[b] and all B keys of
        their own block (bidirectional), nothing of other blocks."""
        c = self.c
        A, B, _ = a.shape
        S = ctx.shape[0]
        g = c.num_attention_heads // c.num_key_value_heads
        q = self.q_norm(self.q_proj(a).unflatten(-1, (c.num_attention_heads, c.head_dim)))
        q = rope(q, pos_blk, c.rope_theta)  # [A, B, nh, d]
        kc, vc = self.kv(ctx, torch.arange(S))  # [S, nkv, d]
        kb, vb = self.kv(a, pos_blk)  # [A, B, nkv, d]
        kc, vc = kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1)
        kb, vb = kb.repeat_interleave(g, 2), vb.repeat_interleave(g, 2)
        scale = 1.0 / math.sqrt(c.head_dim)
        s_ctx = torch.einsum("abhd,shd->ahbs", q, kc) * scale
        visible = torch.arange(S)[None, :] < anchors[:, None]  # [A, S]
        s_ctx = s_ctx.masked_fill(~visible[:, None, None, :], float("-inf"))
        s_blk = torch.einsum("abhd,achd->ahbc", q, kb) * scale
        p = torch.softmax(torch.cat([s_ctx, s_blk], -1), -1)
        o = torch.einsum("ahbs,shd->abhd", p[..., :S], vc) + torch.einsum("ahbc,achd->abhd", p[..., S:], vb)
        return self.o_proj(o.flatten(-2))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, h, ctx, pos_blk, anchors):
        h = h + self.self_attn(self.input_layernorm(h), ctx, pos_blk, anchors)
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        n_taps = len(c.target_layer_ids)
        self.fc = nn.Linear(n_taps * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def contexts(self, taps):
        """Each draft layer's context keys' input [S, H]: one shared fused
        context in DFlash v1."""
        ctx = self.hidden_norm(self.fc(taps.float()))
        return [ctx] * len(self.layers)

    def forward(self, taps, ids, anchors, embed):
        """Hidden states of the B−1 draft slots of each anchor's block:
        [A, B−1, H]. taps [S, T·H] (positions 0..S−1), ids [S], anchors [A]."""
        c = self.config
        B = c.block_size
        blk = torch.full((len(anchors), B), c.mask_token_id, dtype=torch.long)
        blk[:, 0] = ids[anchors]
        h = embed[blk]
        pos_blk = anchors[:, None] + torch.arange(B)[None, :]
        for layer, ctx in zip(self.layers, self.contexts(taps)):
            h = layer(h, ctx, pos_blk, anchors)
        return self.norm(h)[:, 1:]


def fusion_init(n_layers, n_taps):
    """AngelSpec's start for the fusion logits: draft layer i leans on the
    tap at i·(T−1)/(D−1), shallow to shallow (−2 per tap of distance). A
    single draft layer leans on the deepest tap, as the last of several
    does."""
    centre = [round(i * (n_taps - 1) / (n_layers - 1)) if n_layers > 1 else n_taps - 1
              for i in range(n_layers)]
    t = torch.arange(n_taps, dtype=torch.float32)
    return torch.stack([-2.0 * (t - c).abs() for c in centre])


class HiddenCorrection(nn.Module):
    """TreeFlash's predecessor correction (spec §1.3): h + down(silu(gate u)
    ⊙ up u) with u = [norm(h) ; norm(e)], e the target embedding of the
    token before the slot. `down` starts at zero, so training starts from
    the uncorrected drafter."""

    def __init__(self, hidden, n_ff, eps):
        super().__init__()
        self.hidden_norm = RMSNorm(hidden, eps)
        self.embed_norm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(2 * hidden, n_ff, bias=False)
        self.up_proj = nn.Linear(2 * hidden, n_ff, bias=False)
        self.down_proj = nn.Linear(n_ff, hidden, bias=False)

    def forward(self, h, e):
        u = torch.cat([self.hidden_norm(h), self.embed_norm(e)], -1)
        return h + self.down_proj(F.silu(self.gate_proj(u)) * self.up_proj(u))


class DFlyDrafter(Drafter):
    """DFly (spec: shared/spec/dflash-family.md §3.5): draft layer l reads
    RMSNorm_ctx(fc·x + Σ_t softmax(w_l)_t · x_t), x_t the raw t-th tap; with
    `enable_hidden_correction` every slot's final hidden state is corrected
    by its predecessor's embedding. Training feeds the true predecessor
    (teacher forcing); inference feeds the token drafted before, which is the
    same token along every accepted prefix, so the τ proxy stays exact."""

    def __init__(self, c: DrafterConfig):
        super().__init__(c)
        del self.hidden_norm
        self.context_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layer_fusion_weights = nn.Parameter(fusion_init(c.num_hidden_layers, len(c.target_layer_ids)))
        self.hidden_correction = None
        if c.extra.get("enable_hidden_correction"):
            n_ff = c.extra.get("hidden_correction_intermediate_size", c.hidden_size)
            self.hidden_correction = HiddenCorrection(c.hidden_size, n_ff, c.rms_norm_eps)
            for m in self.hidden_correction.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(self.hidden_correction.down_proj.weight)

    def contexts(self, taps):
        x = taps.float()
        base = self.fc(x)
        raw = x.unflatten(-1, (len(self.config.target_layer_ids), self.config.hidden_size))  # [S, T, H]
        mix = torch.softmax(self.layer_fusion_weights, -1)  # [D, T]
        return [self.context_norm(base + torch.einsum("t,sth->sh", w, raw)) for w in mix]

    def forward(self, taps, ids, anchors, embed):
        h = super().forward(taps, ids, anchors, embed)
        if self.hidden_correction is None:
            return h
        k = torch.arange(1, self.config.block_size)
        prev = ids[(anchors[:, None] + k[None, :] - 1).clamp(max=len(ids) - 1)]
        return self.hidden_correction(h, embed[prev])
