//! Decoder hyper-parameters read from GGUF metadata.

use crate::backend::{GatedActivation, RopeStyle};
use crate::error::ModelError;
use blockdraft_gguf::Metadata;

/// The decoder families blockdraft runs. All share one block structure;
/// the differences are switches in [`ModelConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    /// Qwen3.5 family hybrids: gated-DeltaNet blocks with a gated-attention
    /// block every `full_attention_interval` (llama.cpp's `qwen35`).
    Qwen35,
    /// A DFlash-family block drafter: Qwen3-style layers (see `speculative::dflash`).
    DFlash,
}

impl Architecture {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            "gemma3" => Some(Self::Gemma3),
            "qwen35" => Some(Self::Qwen35),
            "dflash" => Some(Self::DFlash),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Qwen35 => "qwen35",
            Self::DFlash => "dflash",
        }
    }
}

/// Sizes of a gated-DeltaNet block (the `ssm.*` keys of a `qwen35` file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetConfig {
    /// Width of the causal depthwise convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); value head `j` reads key head
    /// `j mod n_k_heads`.
    pub n_v_heads: usize,
    /// Width of a key head, and rows of a head's state (`ssm.state_size`).
    pub k_dim: usize,
    /// Width of a value head, and columns of a head's state.
    pub v_dim: usize,
}

impl DeltaNetConfig {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.k_dim + self.value_dim()
    }

    /// Width of the block's output before `ssm_out`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_dim
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    /// Rows of the LM head (logit width): `n_vocab`, except for a drafter
    /// with a reduced vocabulary (`d2t`) whose own head is narrower.
    pub n_vocab_head: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_style: RopeStyle,
    pub n_rot: usize,
    pub rope_base: f32,
    /// Rope base of sliding-window layers (gemma3 uses 10k there).
    pub rope_base_swa: f32,
    /// Window of sliding-window layers, if any.
    pub sliding_window: Option<usize>,
    /// `swa_layers[il]` is true for sliding-window layers.
    pub swa_layers: Vec<bool>,
    pub activation: GatedActivation,
    /// Multiplier applied to the token embeddings (gemma: sqrt(n_embd)).
    pub embedding_scale: Option<f32>,
    /// Multiplier of the attention scores `q·k`.
    pub attention_scale: f32,
    /// Whether the queries are multiplied by `attention_scale` before
    /// attention (whose own scale is then 1), as llama.cpp's gemma3 graph
    /// does, rather than the scores: the same values in f32, but not once
    /// flash attention rounds the queries to f16 (small ones go subnormal).
    pub scale_queries_first: bool,
    /// Sizes of the gated-DeltaNet blocks of a hybrid model (`qwen35`).
    pub delta_net: Option<DeltaNetConfig>,
    /// `recurrent_layers[il]` is true for gated-DeltaNet blocks; the others
    /// are attention blocks with a KV cache.
    pub recurrent_layers: Vec<bool>,
    /// Whether `attn_q` also yields a per-head output gate, interleaved
    /// with the queries head by head, that scales the attention output
    /// through a sigmoid (Qwen3.5's gated attention).
    pub gated_attention: bool,
}

impl ModelConfig {
    /// A model's config; a drafter's file is refused
    /// ([`ModelError::DrafterAsModel`]: it runs only beside its target, see
    /// [`Self::from_metadata_with_vocab`]).
    pub fn from_metadata(md: &Metadata) -> Result<Self, ModelError> {
        if md.get_str("general.architecture")? == Architecture::DFlash.name() {
            return Err(ModelError::DrafterAsModel);
        }
        Self::parse(md, None)
    }

    /// For drafters that borrow the target's vocabulary: `n_vocab` applies
    /// unless the file declares its own.
    pub fn from_metadata_with_vocab(md: &Metadata, n_vocab: usize) -> Result<Self, ModelError> {
        Self::parse(md, Some(n_vocab))
    }

    fn parse(md: &Metadata, vocab_fallback: Option<usize>) -> Result<Self, ModelError> {
        let arch_name = md.get_str("general.architecture")?;
        let arch = Architecture::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let get = |k: &str| -> Result<usize, ModelError> { Ok(md.get_u64(&key(k))? as usize) };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            Ok(md.opt_u64(&key(k))?.map(|v| v as usize))
        };

        // A `qwen35` file counts its multi-token-prediction layers (stored
        // as `blk.{n_layer}`) in `block_count`; the decoder is the rest.
        let n_layer = get("block_count")?.saturating_sub(opt("nextn_predict_layers")?.unwrap_or(0));
        let n_embd = get("embedding_length")?;
        let n_ff = get("feed_forward_length")?;
        let n_head = get("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::invalid(
                key("attention.head_count_kv"),
                format!("{n_head} query heads cannot be grouped over {n_head_kv} kv heads"),
            ));
        }
        let head_dim = match opt("attention.key_length")? {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(ModelError::invalid(
                        key("embedding_length"),
                        format!("{n_embd} not divisible by {n_head} heads"),
                    ));
                }
                n_embd / n_head
            }
        };
        if let Some(v) = opt("attention.value_length")? {
            if v != head_dim {
                return Err(ModelError::invalid(
                    key("attention.value_length"),
                    format!("{v} differs from key length {head_dim}"),
                ));
            }
        }
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::invalid(
                key("rope.dimension_count"),
                format!("{n_rot} must be even and at most head_dim {head_dim}"),
            ));
        }
        if let Some(kind) = md.opt_str(&key("rope.scaling.type"))? {
            if kind != "none" {
                return Err(ModelError::invalid(
                    key("rope.scaling.type"),
                    format!("rope scaling `{kind}` is not supported"),
                ));
            }
        }
        let n_vocab = match (
            opt("vocab_size")?,
            md.opt_array("tokenizer.ggml.tokens")?,
            vocab_fallback,
        ) {
            (Some(v), _, _) => v,
            (None, Some(tokens), _) => tokens.len(),
            (None, None, Some(v)) => v,
            (None, None, None) => md.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let rms_eps = md.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let n_ctx_train = opt("context_length")?.unwrap_or(4096);

        let mut cfg = ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_vocab_head: n_vocab,
            n_ctx_train,
            rms_eps,
            rope_style: RopeStyle::Neox,
            n_rot,
            rope_base,
            rope_base_swa: rope_base,
            sliding_window: None,
            swa_layers: vec![false; n_layer],
            activation: GatedActivation::SwiGlu,
            embedding_scale: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            scale_queries_first: false,
            delta_net: None,
            recurrent_layers: vec![false; n_layer],
            gated_attention: false,
        };
        match arch {
            Architecture::Llama => cfg.rope_style = RopeStyle::Normal,
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::DFlash => {}
            Architecture::Gemma3 => {
                cfg.activation = GatedActivation::GeGlu;
                cfg.embedding_scale = Some((n_embd as f32).sqrt());
                cfg.scale_queries_first = true;
                // Gemma 3 fixes the local layers' rope base at 10k and uses a
                // 5 local : 1 global layer pattern.
                cfg.rope_base_swa = 10_000.0;
                let window = opt("attention.sliding_window")?.ok_or_else(|| {
                    ModelError::invalid(
                        key("attention.sliding_window"),
                        "required for gemma3".into(),
                    )
                })?;
                cfg.sliding_window = Some(window);
                cfg.swa_layers = (0..n_layer).map(|il| il % 6 < 5).collect();
            }
            Architecture::Qwen35 => {
                cfg.gated_attention = true;
                cfg.recurrent_layers = recurrent_layers(md, arch_name, n_layer)?;
                cfg.delta_net = Some(delta_net_config(md, arch_name)?);
                check_rope_sections(md, arch_name, n_rot)?;
            }
        }
        if n_layer == 0 || n_embd == 0 || n_ff == 0 || n_vocab == 0 {
            return Err(ModelError::invalid(
                key("block_count"),
                "layer, embedding, feed-forward and vocab sizes must be non-zero".into(),
            ));
        }
        Ok(cfg)
    }

    /// Whether some blocks keep recurrent state, which a speculative
    /// rollback restores rather than shortens.
    pub fn is_hybrid(&self) -> bool {
        self.recurrent_layers.iter().any(|&r| r)
    }

    /// Layers with a KV cache (attention blocks).
    pub fn n_kv_layers(&self) -> usize {
        self.recurrent_layers.iter().filter(|&&r| !r).count()
    }

    /// Layers with recurrent state (gated-DeltaNet blocks).
    pub fn n_recurrent_layers(&self) -> usize {
        self.n_layer - self.n_kv_layers()
    }

    /// Index of layer `il` among the layers of its kind: its KV cache slot
    /// for an attention block, its state slot for a recurrent one.
    pub fn slot_of(&self, il: usize) -> usize {
        let kind = self.recurrent_layers[il];
        self.recurrent_layers[..il]
            .iter()
            .filter(|&&r| r == kind)
            .count()
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Columns of `attn_q`'s output: the queries, and with gated attention
    /// each head's gate after its queries.
    pub fn q_proj_dim(&self) -> usize {
        if self.gated_attention {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The one context rule of every command and API: the context holds
    /// `requested` positions if given, else just the `needed` ones; it must
    /// hold the needed ones, and never more than the model was trained for
    /// (beyond that a model's output degrades, and a typo such as `-c
    /// 100000000` would allocate a KV cache of tens of GB).
    pub fn context_size(
        &self,
        needed: usize,
        requested: Option<usize>,
    ) -> Result<usize, ModelError> {
        let n_ctx = requested.unwrap_or(needed);
        if n_ctx > self.n_ctx_train {
            return Err(ModelError::ContextTooLong {
                needed: n_ctx,
                trained: self.n_ctx_train,
            });
        }
        if needed > n_ctx {
            return Err(ModelError::ContextFull {
                needed,
                capacity: n_ctx,
            });
        }
        Ok(n_ctx.max(1))
    }
}

/// Which blocks of a hybrid are gated-DeltaNet ones: as the file lists
/// them (`attention.recurrent_layers`, one flag per block, multi-token
/// prediction layers included), else every block but each
/// `full_attention_interval`-th (4 where absent), as llama.cpp reads them.
fn recurrent_layers(md: &Metadata, arch: &str, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    use blockdraft_gguf::ArrayValue;
    let list = format!("{arch}.attention.recurrent_layers");
    if let Some(flags) = md.opt_array(&list)? {
        let flags: Vec<bool> = match flags {
            ArrayValue::Bool(v) => v.clone(),
            ArrayValue::U8(v) => v.iter().map(|&f| f != 0).collect(),
            ArrayValue::I32(v) => v.iter().map(|&f| f != 0).collect(),
            ArrayValue::U32(v) => v.iter().map(|&f| f != 0).collect(),
            _ => {
                return Err(ModelError::invalid(
                    list,
                    "expected an array of flags".into(),
                ));
            }
        };
        if flags.len() < n_layer {
            return Err(ModelError::invalid(
                list,
                format!("{} flags for {n_layer} blocks", flags.len()),
            ));
        }
        return Ok(flags[..n_layer].to_vec());
    }
    let key = format!("{arch}.full_attention_interval");
    let interval = md.opt_u64(&key)?.unwrap_or(4);
    if interval == 0 {
        return Err(ModelError::invalid(key, "must be at least 1".into()));
    }
    Ok((0..n_layer as u64)
        .map(|il| (il + 1) % interval != 0)
        .collect())
}

/// The `ssm.*` sizes of a hybrid file, checked against each other.
fn delta_net_config(md: &Metadata, arch: &str) -> Result<DeltaNetConfig, ModelError> {
    let key = |k: &str| format!("{arch}.ssm.{k}");
    let get = |k: &str| -> Result<usize, ModelError> { Ok(md.get_u64(&key(k))? as usize) };
    let (conv_kernel, n_k_heads, n_v_heads, k_dim, inner) = (
        get("conv_kernel")?,
        get("group_count")?,
        get("time_step_rank")?,
        get("state_size")?,
        get("inner_size")?,
    );
    // Bounds far above any published model, below sizes that would make
    // a state allocation overflow.
    for (k, v, max) in [
        ("conv_kernel", conv_kernel, 64),
        ("group_count", n_k_heads, 4096),
        ("time_step_rank", n_v_heads, 4096),
        ("state_size", k_dim, 4096),
        ("inner_size", inner, 1 << 20),
    ] {
        if v == 0 || v > max {
            return Err(ModelError::invalid(
                key(k),
                format!("{v} is not in 1..={max}"),
            ));
        }
    }
    if n_v_heads % n_k_heads != 0 {
        return Err(ModelError::invalid(
            key("time_step_rank"),
            format!("{n_v_heads} value heads cannot be grouped over {n_k_heads} key heads"),
        ));
    }
    // llama.cpp sizes value heads as key heads (`state_size` each).
    if inner != n_v_heads * k_dim {
        return Err(ModelError::invalid(
            key("inner_size"),
            format!("{inner} differs from {n_v_heads} value heads of {k_dim}"),
        ));
    }
    Ok(DeltaNetConfig {
        conv_kernel,
        n_k_heads,
        n_v_heads,
        k_dim,
        v_dim: k_dim,
    })
}

/// Multi-section rope (Qwen3.5's IMROPE) rotates pair `i` of the first
/// `n_rot` dimensions by the position of its section: sector `i mod Σs`
/// takes the time position when `≡ 0 (mod 3)` and `< 3·s0`, height when
/// `≡ 1` and `< 3·s1`, width when `≡ 2` and `< 3·s2`, else the fourth
/// (0 for text: not rotated). Text gives time, height and width one
/// position, so where every pair takes one of them this is NEOX rope over
/// `n_rot` dimensions, which is what blockdraft runs; other patterns are
/// refused.
fn check_rope_sections(md: &Metadata, arch: &str, n_rot: usize) -> Result<(), ModelError> {
    let key = format!("{arch}.rope.dimension_sections");
    if md.opt_array(&key)?.is_none() {
        return Ok(());
    }
    let s = md.get_i32_array(&key)?;
    let total: i64 = s.iter().map(|&v| i64::from(v)).sum();
    let covered = s.len() == 4
        && s.iter().all(|&v| v >= 0)
        && total > 0
        && (0..n_rot / 2).all(|i| {
            let sector = i as i64 % total;
            let section = 3 * i64::from(s[(sector % 3) as usize]);
            sector < section
        });
    if !covered {
        return Err(ModelError::invalid(
            key,
            format!(
                "sections {s:?} leave some of the {} rotated pairs to the fourth (unrotated) \
                 position; only patterns that rotate every pair by the text position are supported",
                n_rot / 2
            ),
        ));
    }
    Ok(())
}
