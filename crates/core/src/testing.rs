//! Small random GGUF models for tests and benchmarks: a decoder of every
//! supported architecture (hybrids included) and DFlash drafters (v1, DFlash2, DFly, DSpark, with or
//! without a reduced vocabulary), written with the GGUF writer
//! exactly as llama.cpp's converter names things. Weights are F32 and
//! returned alongside, so tests can compute independent references.

use crate::sampling::Rng;
use blockdraft_gguf::{quants, GgmlType, GgufWriter};
use std::collections::HashMap;

/// Geometry of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticDims {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Sliding window of gemma3's local layers.
    pub window: usize,
}

impl Default for SyntheticDims {
    fn default() -> Self {
        SyntheticDims {
            n_layer: 7,
            n_embd: 48,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_ff: 80,
            n_vocab: 61,
            window: 3,
        }
    }
}

/// A written model and its weights by tensor name (as F32, row-major in
/// ggml order: element `[r][c]` of a `{c_dim, r_dim}` tensor at `r*c_dim + c`).
pub struct SyntheticModel {
    pub bytes: Vec<u8>,
    pub weights: HashMap<String, Vec<f32>>,
}

struct Builder {
    writer: GgufWriter,
    weights: HashMap<String, Vec<f32>>,
    rng: Rng,
    /// Type of 2-D matrices (vectors stay F32).
    matrix_type: GgmlType,
}

impl Builder {
    fn new(arch: &str, seed: u64) -> Self {
        let mut writer = GgufWriter::new();
        writer.add("general.architecture", arch);
        Builder {
            writer,
            weights: HashMap::new(),
            rng: Rng::new(seed),
            matrix_type: GgmlType::F32,
        }
    }

    /// Adds a tensor of uniform values in `offset ± scale`; `weights` keeps
    /// the values the file really holds (after quantization).
    fn tensor(&mut self, name: String, dims: &[usize], scale: f64, offset: f32) {
        let n = dims.iter().product();
        let mut v: Vec<f32> = (0..n)
            .map(|_| ((self.rng.next_f64() * 2.0 - 1.0) * scale) as f32 + offset)
            .collect();
        let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        let ty = self.matrix_type;
        if dims.len() == 2 && ty != GgmlType::F32 && dims[0].is_multiple_of(ty.block_len()) {
            let bytes = quants::quantize_to_vec(ty, &v).expect("quantizable synthetic tensor");
            v = quants::dequantize_to_vec(ty, &bytes).expect("just quantized");
            self.writer
                .add_tensor(name.clone(), &d, ty, bytes)
                .expect("valid synthetic tensor");
        } else {
            self.writer
                .add_f32_tensor(name.clone(), &d, &v)
                .expect("valid synthetic tensor");
        }
        self.weights.insert(name, v);
    }

    fn common_keys(&mut self, arch: &str, d: &SyntheticDims) {
        let w = &mut self.writer;
        let key = |k: &str| format!("{arch}.{k}");
        w.add(key("block_count"), d.n_layer as u32);
        w.add(key("embedding_length"), d.n_embd as u32);
        w.add(key("feed_forward_length"), d.n_ff as u32);
        w.add(key("attention.head_count"), d.n_head as u32);
        w.add(key("attention.head_count_kv"), d.n_head_kv as u32);
        w.add(key("attention.key_length"), d.head_dim as u32);
        w.add(key("attention.value_length"), d.head_dim as u32);
        w.add(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
        w.add(key("rope.freq_base"), 1000.0f32);
        w.add(key("context_length"), 256u32);
    }

    fn layers(&mut self, d: &SyntheticDims, bias: bool, qk_norm: bool, post_norms: bool) {
        let (e, q, kv, ff) = (
            d.n_embd,
            d.n_head * d.head_dim,
            d.n_head_kv * d.head_dim,
            d.n_ff,
        );
        for il in 0..d.n_layer {
            let n = |t: &str| format!("blk.{il}.{t}");
            self.tensor(n("attn_norm.weight"), &[e], 0.2, 1.0);
            self.tensor(n("attn_q.weight"), &[e, q], 0.3, 0.0);
            self.tensor(n("attn_k.weight"), &[e, kv], 0.3, 0.0);
            self.tensor(n("attn_v.weight"), &[e, kv], 0.3, 0.0);
            self.tensor(n("attn_output.weight"), &[q, e], 0.2, 0.0);
            if bias {
                self.tensor(n("attn_q.bias"), &[q], 0.5, 0.0);
                self.tensor(n("attn_k.bias"), &[kv], 0.5, 0.0);
                self.tensor(n("attn_v.bias"), &[kv], 0.5, 0.0);
            }
            if qk_norm {
                self.tensor(n("attn_q_norm.weight"), &[d.head_dim], 0.2, 1.0);
                self.tensor(n("attn_k_norm.weight"), &[d.head_dim], 0.2, 1.0);
            }
            if post_norms {
                self.tensor(n("post_attention_norm.weight"), &[e], 0.2, 1.0);
                self.tensor(n("post_ffw_norm.weight"), &[e], 0.2, 1.0);
            }
            self.tensor(n("ffn_norm.weight"), &[e], 0.2, 1.0);
            self.tensor(n("ffn_gate.weight"), &[e, ff], 0.3, 0.0);
            self.tensor(n("ffn_up.weight"), &[e, ff], 0.3, 0.0);
            self.tensor(n("ffn_down.weight"), &[ff, e], 0.2, 0.0);
        }
    }

    fn finish(self) -> SyntheticModel {
        SyntheticModel {
            bytes: self.writer.to_bytes().expect("valid synthetic model"),
            weights: self.weights,
        }
    }
}

/// A random decoder of `arch` (`llama`, `qwen2`, `qwen3` or `gemma3`).
/// gemma3 ties its head to the embeddings; the others have `output.weight`.
pub fn synthetic_decoder(arch: &str, d: SyntheticDims, seed: u64) -> SyntheticModel {
    synthetic_decoder_of(arch, d, seed, GgmlType::F32)
}

/// [`synthetic_decoder`] with its matrices stored as `matrix_type` (those
/// whose rows are whole blocks of it; the others stay F32).
pub fn synthetic_decoder_of(
    arch: &str,
    d: SyntheticDims,
    seed: u64,
    matrix_type: GgmlType,
) -> SyntheticModel {
    let mut b = Builder::new(arch, seed);
    b.matrix_type = matrix_type;
    b.common_keys(arch, &d);
    b.writer.add(format!("{arch}.vocab_size"), d.n_vocab as u32);
    if arch == "gemma3" {
        b.writer
            .add("gemma3.attention.sliding_window", d.window as u32);
    }
    b.tensor("token_embd.weight".into(), &[d.n_embd, d.n_vocab], 1.0, 0.0);
    b.tensor("output_norm.weight".into(), &[d.n_embd], 0.2, 1.0);
    if arch != "gemma3" {
        b.tensor("output.weight".into(), &[d.n_embd, d.n_vocab], 0.3, 0.0);
    }
    b.layers(
        &d,
        arch == "qwen2",
        arch == "qwen3" || arch == "gemma3",
        arch == "gemma3",
    );
    b.finish()
}

/// Geometry of a synthetic hybrid (`qwen35`) model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticHybrid {
    /// `n_layer`, `n_embd`, `n_ff`, `n_vocab` and the attention blocks'
    /// heads (`n_head`, `n_head_kv`, `head_dim`); `window` is unused.
    pub dims: SyntheticDims,
    /// Every this many blocks, one is attention (`full_attention_interval`).
    pub interval: usize,
    /// Rotated dimensions of an attention head.
    pub n_rot: usize,
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Width of every DeltaNet head (`ssm.state_size`).
    pub state_size: usize,
    /// Multi-token-prediction layers appended as `blk.{n_layer}..`
    /// (loaded by llama.cpp on request only; blockdraft skips them).
    pub mtp_layers: usize,
    /// Type of the matrices whose rows are whole blocks of it.
    pub matrix_type: GgmlType,
}

impl SyntheticHybrid {
    /// Qwen3.5-0.8B's geometry (24 blocks, one in four attention, width
    /// 1024, 16 DeltaNet heads of 128), with a vocabulary of `n_vocab`.
    pub fn qwen35_0_8b(n_vocab: usize, matrix_type: GgmlType) -> Self {
        SyntheticHybrid {
            dims: SyntheticDims {
                n_layer: 24,
                n_embd: 1024,
                n_head: 8,
                n_head_kv: 2,
                head_dim: 256,
                n_ff: 3584,
                n_vocab,
                window: 0,
            },
            interval: 4,
            n_rot: 64,
            conv_kernel: 4,
            n_k_heads: 16,
            n_v_heads: 16,
            state_size: 128,
            mtp_layers: 0,
            matrix_type,
        }
    }
}

impl Default for SyntheticHybrid {
    fn default() -> Self {
        SyntheticHybrid {
            dims: SyntheticDims {
                n_layer: 6,
                n_embd: 64,
                n_head: 2,
                n_head_kv: 1,
                head_dim: 32,
                n_ff: 96,
                n_vocab: 96,
                window: 0,
            },
            interval: 3,
            n_rot: 16,
            conv_kernel: 4,
            n_k_heads: 2,
            n_v_heads: 4,
            state_size: 16,
            mtp_layers: 0,
            matrix_type: GgmlType::F32,
        }
    }
}

/// A random Qwen3.5-style hybrid as llama.cpp's converter writes one
/// (`qwen35`: norms stored as given, `ssm_a` negative, no vocabulary, an
/// `output.weight`), with rope sections that rotate every pair by the text
/// position. llama.cpp loads and runs it.
pub fn synthetic_qwen35(h: &SyntheticHybrid, seed: u64) -> SyntheticModel {
    let arch = "qwen35";
    let d = h.dims;
    let mut b = Builder::new(arch, seed);
    b.matrix_type = h.matrix_type;
    b.common_keys(arch, &d);
    let w = &mut b.writer;
    let key = |k: &str| format!("{arch}.{k}");
    w.add(key("block_count"), (d.n_layer + h.mtp_layers) as u32);
    w.add(key("vocab_size"), d.n_vocab as u32);
    w.add("tokenizer.ggml.model", "no_vocab");
    w.add(key("full_attention_interval"), h.interval as u32);
    w.add(key("rope.dimension_count"), h.n_rot as u32);
    // Section k counts the pairs i ≡ k (mod 3), so every pair takes time,
    // height or width (see `check_rope_sections`): Qwen3.5's [11, 11, 10,
    // 0] for 32 pairs.
    let pairs = (h.n_rot / 2) as i32;
    let section = |k: i32| (pairs - k + 2) / 3;
    w.add(
        key("rope.dimension_sections"),
        vec![section(0), section(1), section(2), 0],
    );
    w.add(key("ssm.conv_kernel"), h.conv_kernel as u32);
    w.add(key("ssm.state_size"), h.state_size as u32);
    w.add(key("ssm.group_count"), h.n_k_heads as u32);
    w.add(key("ssm.time_step_rank"), h.n_v_heads as u32);
    w.add(key("ssm.inner_size"), (h.n_v_heads * h.state_size) as u32);
    w.add(key("nextn_predict_layers"), h.mtp_layers as u32);
    let (e, ff, hd) = (d.n_embd, d.n_ff, d.head_dim);
    let (q, kv) = (d.n_head * hd, d.n_head_kv * hd);
    let key_dim = h.n_k_heads * h.state_size;
    let value = h.n_v_heads * h.state_size;
    let conv = 2 * key_dim + value;
    // Matrices of about unit gain, so that activations stay O(1).
    let gain = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    b.tensor("token_embd.weight".into(), &[e, d.n_vocab], 1.0, 0.0);
    b.tensor("output_norm.weight".into(), &[e], 0.2, 1.0);
    b.tensor("output.weight".into(), &[e, d.n_vocab], 1.5 * gain(e), 0.0);
    for il in 0..d.n_layer + h.mtp_layers {
        let n = |t: &str| format!("blk.{il}.{t}");
        b.tensor(n("attn_norm.weight"), &[e], 0.2, 1.0);
        b.tensor(n("post_attention_norm.weight"), &[e], 0.2, 1.0);
        let recurrent = il < d.n_layer && (il + 1) % h.interval != 0;
        if recurrent {
            b.tensor(n("attn_qkv.weight"), &[e, conv], 1.5 * gain(e), 0.0);
            b.tensor(n("attn_gate.weight"), &[e, value], 1.5 * gain(e), 0.0);
            b.tensor(n("ssm_conv1d.weight"), &[h.conv_kernel, conv], 0.5, 0.0);
            b.tensor(n("ssm_dt.bias"), &[h.n_v_heads], 0.5, 0.0);
            b.tensor(n("ssm_a"), &[h.n_v_heads], 0.5, -1.0);
            b.tensor(n("ssm_beta.weight"), &[e, h.n_v_heads], 1.5 * gain(e), 0.0);
            b.tensor(n("ssm_alpha.weight"), &[e, h.n_v_heads], 1.5 * gain(e), 0.0);
            b.tensor(n("ssm_norm.weight"), &[h.state_size], 0.2, 1.0);
            b.tensor(n("ssm_out.weight"), &[value, e], 1.5 * gain(value), 0.0);
        } else {
            b.tensor(n("attn_q.weight"), &[e, 2 * q], 1.5 * gain(e), 0.0);
            b.tensor(n("attn_k.weight"), &[e, kv], 1.5 * gain(e), 0.0);
            b.tensor(n("attn_v.weight"), &[e, kv], 1.5 * gain(e), 0.0);
            b.tensor(n("attn_output.weight"), &[q, e], 1.5 * gain(q), 0.0);
            b.tensor(n("attn_q_norm.weight"), &[hd], 0.2, 1.0);
            b.tensor(n("attn_k_norm.weight"), &[hd], 0.2, 1.0);
        }
        b.tensor(n("ffn_gate.weight"), &[e, ff], 1.5 * gain(e), 0.0);
        b.tensor(n("ffn_up.weight"), &[e, ff], 1.5 * gain(e), 0.0);
        b.tensor(n("ffn_down.weight"), &[ff, e], 1.5 * gain(ff), 0.0);
        if il >= d.n_layer {
            b.tensor(n("nextn.eh_proj.weight"), &[2 * e, e], gain(2 * e), 0.0);
            b.tensor(n("nextn.enorm.weight"), &[e], 0.2, 1.0);
            b.tensor(n("nextn.hnorm.weight"), &[e], 0.2, 1.0);
            b.tensor(n("nextn.shared_head_norm.weight"), &[e], 0.2, 1.0);
        }
    }
    b.finish()
}

/// What a synthetic DFlash drafter declares.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticDFlash {
    pub dims: SyntheticDims,
    /// +1-shifted tap ids, written to `dflash.target_layers`.
    pub target_layers: Vec<i32>,
    pub block_size: u32,
    pub mask_token: u32,
    /// Type of the matrices (real drafters ship quantized).
    pub matrix_type: GgmlType,
}

impl SyntheticDFlash {
    /// The tests' usual drafter: two layers of 4 heads (2 KV heads) of 16,
    /// block 8, mask token 0, no vocabulary of its own.
    pub fn small(n_embd: usize, target_layers: Vec<i32>, matrix_type: GgmlType) -> Self {
        SyntheticDFlash {
            dims: SyntheticDims {
                n_layer: 2,
                n_embd,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                n_ff: 64,
                n_vocab: 0,
                window: 0,
            },
            target_layers,
            block_size: 8,
            mask_token: 0,
            matrix_type,
        }
    }
}

/// A random DFlash (v1) drafter without embeddings or head (borrowed from
/// the target). `dims.n_vocab` is not written.
pub fn synthetic_dflash(spec: &SyntheticDFlash, seed: u64) -> SyntheticModel {
    dflash_builder(spec, "enc.output_norm.weight", seed).finish()
}

/// A random DFly drafter: v1's tensors with `context_norm` for
/// `enc.output_norm`, `layer_fusion` `{T, L}` and, with
/// `hidden_correction`, the five correction tensors (intermediate width
/// `dims.n_ff`).
pub fn synthetic_dfly(
    spec: &SyntheticDFlash,
    hidden_correction: bool,
    seed: u64,
) -> SyntheticModel {
    let d = spec.dims;
    let mut b = dflash_builder(spec, "context_norm.weight", seed);
    // Wide logits so each layer's softmax is far from uniform; F32 always
    // (a softmax input, never quantized).
    let ty = std::mem::replace(&mut b.matrix_type, GgmlType::F32);
    b.tensor(
        "layer_fusion".into(),
        &[spec.target_layers.len(), d.n_layer],
        2.0,
        0.0,
    );
    b.matrix_type = ty;
    if hidden_correction {
        let (e, ff) = (d.n_embd, d.n_ff);
        b.tensor(
            "hidden_correction.hidden_norm.weight".into(),
            &[e],
            0.2,
            1.0,
        );
        b.tensor("hidden_correction.embed_norm.weight".into(), &[e], 0.2, 1.0);
        b.tensor(
            "hidden_correction.gate.weight".into(),
            &[2 * e, ff],
            0.3,
            0.0,
        );
        b.tensor("hidden_correction.up.weight".into(), &[2 * e, ff], 0.3, 0.0);
        b.tensor("hidden_correction.down.weight".into(), &[ff, e], 0.3, 0.0);
    }
    b.finish()
}

/// DSpark's extras (and the reduced vocabulary of any drafter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyntheticDSpark {
    /// Markov rank R_m.
    pub rank: usize,
    /// Written to `dflash.sample_from_anchor` when set.
    pub sample_from_anchor: Option<bool>,
    /// Written to `dflash.has_confidence_head` when set.
    pub has_confidence_head: Option<bool>,
    /// Writes `conf_proj.weight` and `conf_proj.bias`.
    pub confidence_tensors: bool,
    /// Writes `markov_w2.scale`.
    pub markov_scale: Option<f32>,
    /// Reduced vocabulary: target id of each row of the drafter's own head.
    pub d2t: Option<Vec<i64>>,
}

/// A random DSpark drafter: v1's tensors plus `markov_w1` `{R_m, n_vocab}`
/// (`spec.dims.n_vocab` = the target's vocabulary) and `markov_w2`
/// `{R_m, n_vocab_draft}`, and whatever `ds` asks for.
pub fn synthetic_dspark(spec: &SyntheticDFlash, ds: &SyntheticDSpark, seed: u64) -> SyntheticModel {
    let d = spec.dims;
    let mut b = dflash_builder(spec, "enc.output_norm.weight", seed);
    let n_draft = ds.d2t.as_ref().map_or(d.n_vocab, Vec::len);
    b.tensor("markov_w1.weight".into(), &[ds.rank, d.n_vocab], 1.0, 0.0);
    b.tensor("markov_w2.weight".into(), &[ds.rank, n_draft], 1.0, 0.0);
    if let Some(s) = ds.markov_scale {
        b.tensor("markov_w2.scale".into(), &[1], 0.0, s);
    }
    if ds.confidence_tensors {
        b.tensor(
            "conf_proj.weight".into(),
            &[d.n_embd + ds.rank, 1],
            0.5,
            0.0,
        );
        b.tensor("conf_proj.bias".into(), &[1], 0.5, 0.0);
    }
    if let Some(v) = ds.sample_from_anchor {
        b.writer.add("dflash.sample_from_anchor", v);
    }
    if let Some(v) = ds.has_confidence_head {
        b.writer.add("dflash.has_confidence_head", v);
    }
    if let Some(map) = &ds.d2t {
        b.d2t(d.n_embd, map);
    }
    b.finish()
}

/// A random DFlash (v1) drafter with its own head of `d2t.len()` rows and
/// the `d2t` map to target ids.
pub fn synthetic_dflash_d2t(spec: &SyntheticDFlash, d2t: &[i64], seed: u64) -> SyntheticModel {
    let mut b = dflash_builder(spec, "enc.output_norm.weight", seed);
    b.d2t(spec.dims.n_embd, d2t);
    b.finish()
}

impl Builder {
    fn d2t(&mut self, n_embd: usize, map: &[i64]) {
        self.tensor("output.weight".into(), &[n_embd, map.len()], 0.3, 0.0);
        let bytes: Vec<u8> = map.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.writer
            .add_tensor("d2t".to_string(), &[map.len() as u64], GgmlType::I64, bytes)
            .expect("valid d2t");
    }
}

fn dflash_builder(spec: &SyntheticDFlash, context_norm: &str, seed: u64) -> Builder {
    let d = spec.dims;
    let mut b = Builder::new("dflash", seed);
    b.matrix_type = spec.matrix_type;
    b.common_keys("dflash", &d);
    b.writer.add("dflash.block_size", spec.block_size);
    b.writer
        .add("dflash.target_layers", spec.target_layers.clone());
    b.writer
        .add("tokenizer.ggml.mask_token_id", spec.mask_token);
    let width = spec.target_layers.len() * d.n_embd;
    b.tensor("fc.weight".into(), &[width, d.n_embd], 0.1, 0.0);
    b.tensor(context_norm.into(), &[d.n_embd], 0.2, 1.0);
    b.tensor("output_norm.weight".into(), &[d.n_embd], 0.2, 1.0);
    b.layers(&d, false, true, false);
    b
}

/// DFlash2's convolutions and candidate selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticDFlash2 {
    /// Taps T of every convolution.
    pub conv_kernel_size: usize,
    /// Channels per group G (divides `n_embd`).
    pub conv_group_size: usize,
    /// Selector rank R.
    pub selector_rank: usize,
    pub selector_top_k: usize,
}

/// A random DFlash2 drafter: v1's tensors plus, per layer,
/// `attn_conv_base`/`ffn_conv_base` `{n_embd, T, 2}` (F32) and
/// `attn_conv_proj`/`ffn_conv_proj` `{n_embd, 2·T·(n_embd/G)}`, and the
/// selector `selector_hidden` `{n_embd, R}`, `selector_predecessor` and
/// `selector_successor` `{R, n_vocab}` (`spec.dims.n_vocab` = the target's
/// vocabulary). No logit scale or softcap is written.
pub fn synthetic_dflash2(
    spec: &SyntheticDFlash,
    v2: &SyntheticDFlash2,
    seed: u64,
) -> SyntheticModel {
    dflash2_builder(spec, v2, seed).finish()
}

/// [`synthetic_dflash2`] with a reduced draft vocabulary: its own
/// `output.weight` over `d2t.len()` rows and the `d2t` map to target ids.
pub fn synthetic_dflash2_d2t(
    spec: &SyntheticDFlash,
    v2: &SyntheticDFlash2,
    d2t: &[i64],
    seed: u64,
) -> SyntheticModel {
    let mut b = dflash2_builder(spec, v2, seed);
    b.d2t(spec.dims.n_embd, d2t);
    b.finish()
}

fn dflash2_builder(spec: &SyntheticDFlash, v2: &SyntheticDFlash2, seed: u64) -> Builder {
    let d = spec.dims;
    assert!(
        d.n_vocab > 0,
        "DFlash2 codebooks need the target vocabulary"
    );
    let (e, t) = (d.n_embd, v2.conv_kernel_size);
    let dyn_cols = 2 * t * (e / v2.conv_group_size);
    let mut b = dflash_builder(spec, "enc.output_norm.weight", seed);
    let w = &mut b.writer;
    w.add("dflash.conv_kernel_size", t as u32);
    w.add("dflash.conv_group_size", v2.conv_group_size as u32);
    w.add("dflash.selector_rank", v2.selector_rank as u32);
    w.add("dflash.selector_top_k", v2.selector_top_k as u32);
    for il in 0..d.n_layer {
        for sub in ["attn", "ffn"] {
            // Base kernels near 0.5 so the convolution mixes neighbours
            // without vanishing; small dynamic deltas on top.
            b.tensor(format!("blk.{il}.{sub}_conv_base"), &[e, t, 2], 0.3, 0.5);
            b.tensor(
                format!("blk.{il}.{sub}_conv_proj.weight"),
                &[e, dyn_cols],
                0.1,
                0.0,
            );
        }
    }
    let r = v2.selector_rank;
    b.tensor("selector_hidden.weight".into(), &[e, r], 0.3, 0.0);
    b.tensor(
        "selector_predecessor.weight".into(),
        &[r, d.n_vocab],
        1.0,
        0.0,
    );
    b.tensor(
        "selector_successor.weight".into(),
        &[r, d.n_vocab],
        1.0,
        0.0,
    );
    b
}

/// Runs a future to completion on this thread: how native tests and tools
/// drive the engine's async read-backs (their futures are ready at once on
/// the CPU and after a blocking device poll natively on wgpu).
pub use pollster::block_on;

/// A tiny random drafter of every block variant (DFlash v1, DFlash2, DFly
/// with its correction, anchor-first DSpark with a confidence head) for a
/// synthetic target of `n_vocab` tokens, by kind.
pub fn synthetic_block_drafters(n_vocab: usize) -> [(&'static str, Vec<u8>); 4] {
    let spec = SyntheticDFlash::small(48, vec![1, 4, 7], GgmlType::F32);
    let mut spec_v = spec.clone();
    spec_v.dims.n_vocab = n_vocab;
    let v2 = SyntheticDFlash2 {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 8,
        selector_top_k: 4,
    };
    let ds = SyntheticDSpark {
        rank: 8,
        sample_from_anchor: Some(true),
        has_confidence_head: Some(true),
        confidence_tensors: true,
        markov_scale: Some(0.7),
        d2t: None,
    };
    [
        ("dflash", synthetic_dflash(&spec, 5).bytes),
        ("dflash2", synthetic_dflash2(&spec_v, &v2, 6).bytes),
        ("dfly", synthetic_dfly(&spec, true, 7).bytes),
        ("dspark", synthetic_dspark(&spec_v, &ds, 8).bytes),
    ]
}

/// Each drafter of [`synthetic_block_drafters`] for `dec` (a synthetic
/// target), by kind, having observed the taps of a prefill of `history`:
/// ready to draft after it.
pub fn observed_block_drafters<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    history: &[u32],
) -> Vec<(&'static str, crate::speculative::DFlashDrafter<B>)> {
    use crate::speculative::Drafter;
    synthetic_block_drafters(dec.config.n_vocab)
        .into_iter()
        .map(|(kind, bytes)| {
            let f = blockdraft_gguf::GgufFile::from_bytes(bytes).expect("a drafter file");
            let mut d = crate::speculative::DFlashDrafter::load(&f, dec, 64, 32).expect(kind);
            let mut state = dec.new_state(64, 32);
            let mut taps = crate::model::Taps::new(&*dec.backend, &dec.config, d.tap_layers(), 32)
                .expect(kind);
            dec.forward(
                &mut state,
                history,
                crate::model::LogitRows::Last,
                true,
                Some(&mut taps),
            )
            .expect(kind);
            block_on(d.observe(history, 0, Some(taps.output()))).expect(kind);
            (kind, d)
        })
        .collect()
}

/// The greedy draft of up to `n` tokens after `history` that `d` makes on
/// the device (`None` where it drafts on the host only), read back from
/// its round tensor.
pub fn device_draft<B: crate::Backend>(
    be: &B,
    d: &mut dyn crate::speculative::Drafter<B>,
    history: &[u32],
    n: usize,
) -> Option<Vec<u32>> {
    let mut round = be.tensor(n + 1, 2);
    let drafted = d
        .propose_on_device(history, n, &mut round)
        .expect("a device draft")?;
    let ids = block_on(be.read(&round));
    assert_eq!(
        ids[0],
        history[history.len() - 1] as f32,
        "row 0 holds the anchor"
    );
    Some((1..=drafted).map(|r| ids[r * 2] as u32).collect())
}

/// Dispatches a device backend records per decoder layer for a pass of
/// `rows` rows (a decode step: 1; a verify: k) after a short prefill: the
/// difference between synthetic `arch` models of 2 and 5 layers with
/// matrices of `ty` (so the embedding, head and argmax cancel out), on a
/// backend from `backend` each.
pub async fn dispatches_per_layer<B: crate::Backend>(
    backend: impl Fn() -> std::sync::Arc<B>,
    arch: &str,
    ty: GgmlType,
    rows: usize,
) -> u64 {
    let mut counts = [0u64; 2];
    for (count, n_layer) in counts.iter_mut().zip([2, 5]) {
        let dims = SyntheticDims {
            n_layer,
            n_embd: 256,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_ff: 512,
            n_vocab: 64,
            window: 0,
        };
        let bytes = synthetic_decoder_of(arch, dims, 3, ty).bytes;
        let file = blockdraft_gguf::GgufFile::from_bytes(bytes).expect("synthetic model");
        let be = backend();
        let dec = crate::model::Decoder::load(&file, be.clone(), &mut |_| {}).expect("load");
        let mut state = dec.try_new_state(64, 16).expect("state");
        let rows_of = crate::model::LogitRows::All;
        dec.forward(&mut state, &[1, 2, 3, 4], rows_of, true, None)
            .expect("prefill");
        be.argmax(state.logits()).await;
        let before = be.command_counts().expect("a device backend").dispatches;
        let tokens: Vec<u32> = (5..5 + rows as u32).collect();
        dec.forward(&mut state, &tokens, rows_of, true, None)
            .expect("pass");
        be.argmax(state.logits()).await;
        *count = be.command_counts().expect("a device backend").dispatches - before;
    }
    (counts[1] - counts[0]) / 3
}

/// Plain greedy decoding of `n` tokens after `prompt` (the reference every
/// speculative and cross-backend test compares with).
pub fn greedy_plain<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    block_on(greedy_plain_async(dec, prompt, n))
}

/// [`greedy_plain`] for callers that can only await (a browser).
pub async fn greedy_plain_async<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    plain_async(dec, prompt, n, &crate::sampling::SamplingParams::greedy()).await
}

/// Plain decoding of `n` tokens sampled with `params`.
pub fn sampled_plain<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    prompt: &[u32],
    n: usize,
    params: &crate::sampling::SamplingParams,
) -> Vec<u32> {
    block_on(plain_async(dec, prompt, n, params))
}

async fn plain_async<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    prompt: &[u32],
    n: usize,
    params: &crate::sampling::SamplingParams,
) -> Vec<u32> {
    let mut state = dec.new_state(prompt.len() + n + 1, 32);
    plain_in_state(dec, &mut state, prompt, n, params)
        .await
        .expect("plain decoding")
}

/// Plain decoding of `n` tokens sampled with `params` in a state the
/// caller sized (tests of the rows a backend holds), its error kept.
pub async fn plain_in_state<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    state: &mut crate::model::DecoderState<B>,
    prompt: &[u32],
    n: usize,
    params: &crate::sampling::SamplingParams,
) -> Result<Vec<u32>, crate::ModelError> {
    let mut sampler = crate::sampling::Sampler::new(params.clone());
    let (eog, mut each) = (|_: u32| false, |_: u32| true);
    let run = crate::generate::generate(dec, state, prompt, n, &mut sampler, &eog, &mut each);
    Ok(run.await?.0)
}

/// Greedy speculative decoding of `n` tokens with `drafter` under `policy`.
pub fn greedy_speculative<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    drafter: &mut dyn crate::speculative::Drafter<B>,
    prompt: &[u32],
    n: usize,
    policy: crate::speculative::PolicyConfig,
) -> (Vec<u32>, crate::speculative::SpecStats) {
    block_on(greedy_speculative_async(dec, drafter, prompt, n, policy))
}

/// [`greedy_speculative`] for callers that can only await (a browser).
pub async fn greedy_speculative_async<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    drafter: &mut dyn crate::speculative::Drafter<B>,
    prompt: &[u32],
    n: usize,
    policy: crate::speculative::PolicyConfig,
) -> (Vec<u32>, crate::speculative::SpecStats) {
    let greedy = crate::sampling::SamplingParams::greedy();
    speculative_async(dec, drafter, prompt, n, &greedy, policy).await
}

/// Speculative decoding of `n` tokens sampled with `params` under `policy`.
pub fn sampled_speculative<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    drafter: &mut dyn crate::speculative::Drafter<B>,
    prompt: &[u32],
    n: usize,
    params: &crate::sampling::SamplingParams,
    policy: crate::speculative::PolicyConfig,
) -> (Vec<u32>, crate::speculative::SpecStats) {
    block_on(speculative_async(dec, drafter, prompt, n, params, policy))
}

async fn speculative_async<B: crate::Backend>(
    dec: &crate::model::Decoder<B>,
    drafter: &mut dyn crate::speculative::Drafter<B>,
    prompt: &[u32],
    n: usize,
    params: &crate::sampling::SamplingParams,
    policy: crate::speculative::PolicyConfig,
) -> (Vec<u32>, crate::speculative::SpecStats) {
    use crate::sampling::Sampler;
    let mut state = dec.new_state(prompt.len() + n + 32, 32);
    let mut sampler = Sampler::new(params.clone());
    let mut policy = crate::speculative::DraftPolicy::new(policy);
    let (tokens, _, stats) = crate::speculative::generate_speculative(
        dec,
        &mut state,
        drafter,
        &mut policy,
        prompt,
        n,
        &mut sampler,
        &|_| false,
        &mut |_| true,
        &mut |_| {},
    )
    .await
    .expect("speculative decoding");
    (tokens, stats)
}

/// Path of a real model from `tests/fetch_models.sh` (`$BLOCKDRAFT_MODELS`,
/// default `~/.cache/blockdraft/models`). A missing model fails the test
/// with instructions, unless `BLOCKDRAFT_SKIP_MODEL_TESTS=1`, in which case
/// `None` is returned and the caller skips.
pub fn real_model(file: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = std::env::var_os("BLOCKDRAFT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/blockdraft/models")
        });
    let path = dir.join(file);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("BLOCKDRAFT_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "SKIP: {} missing and BLOCKDRAFT_SKIP_MODEL_TESTS=1",
            path.display()
        );
        return None;
    }
    panic!("{} is missing: run tests/fetch_models.sh (or set BLOCKDRAFT_SKIP_MODEL_TESTS=1 to skip real-model tests)", path.display());
}

/// The hybrid-target check each device backend's tests run: a synthetic
/// `qwen35` target (7 layers, width 48) on `device` gives every prefill
/// row's logits as on `reference` (the CPU backend) to 1e-4 of their
/// largest, the same greedy tokens, and greedy speculative decoding whose
/// rejected rows roll its recurrent state back identical to plain: n-gram,
/// the target as its own draft model and an oracle (every draft accepted),
/// an oracle none of whose drafts is accepted, and each DFlash variant.
pub fn check_hybrid_target<B: crate::Backend, R: crate::Backend>(
    device: std::sync::Arc<B>,
    reference: std::sync::Arc<R>,
) {
    use crate::speculative::{
        DFlashDrafter, DraftModelDrafter, Drafter, NgramDrafter, OracleDrafter, PolicyConfig,
    };
    let mut h = SyntheticHybrid::default();
    h.dims.n_layer = 7;
    h.dims.n_embd = 48;
    let file = blockdraft_gguf::GgufFile::from_bytes(synthetic_qwen35(&h, 35).bytes).unwrap();
    fn load<B: crate::Backend>(
        file: &blockdraft_gguf::GgufFile,
        be: std::sync::Arc<B>,
    ) -> std::sync::Arc<crate::model::Decoder<B>> {
        std::sync::Arc::new(crate::model::Decoder::load(file, be, &mut |_| {}).expect("load"))
    }
    fn all_rows<B: crate::Backend>(d: &crate::model::Decoder<B>, prompt: &[u32]) -> Vec<f32> {
        let mut state = d.new_state(prompt.len(), prompt.len());
        d.forward(&mut state, prompt, crate::model::LogitRows::All, true, None)
            .expect("prefill");
        block_on(d.backend.read(state.logits()))
    }
    let (dec, cpu) = (load(&file, device), load(&file, reference));
    let prompt = [3u32, 14, 15, 9, 26, 5, 3, 14, 15, 9];
    // And a prompt long enough for a device's prefill form of the delta
    // rule (wgpu's chunked one, from 64 rows).
    let long: Vec<u32> = (0..100u32).map(|i| (i * 7 + 3) % 50).collect();
    for tokens in [&prompt[..], &long] {
        let (got, want) = (all_rows(&dec, tokens), all_rows(&cpu, tokens));
        let err = rel_err(&got, &want);
        assert!(
            err < 1e-4,
            "a {}-token prefill's logits differ by {err} of their largest",
            tokens.len()
        );
    }
    let n = 24;
    let want = greedy_plain(&dec, &prompt, n);
    assert_eq!(
        want,
        greedy_plain(&cpu, &prompt, n),
        "the device and the reference agree"
    );
    let n_vocab = dec.config.n_vocab;
    let ctx = prompt.len() + n + 32;
    let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
    let mut drafters: Vec<(String, Box<dyn Drafter<B>>)> = vec![
        ("ngram".into(), Box::new(NgramDrafter::default())),
        (
            "the target as its draft model".into(),
            Box::new(DraftModelDrafter::new(dec.clone(), n_vocab, ctx).unwrap()),
        ),
        (
            "oracle, all accepted".into(),
            Box::new(OracleDrafter::new(sequence.clone(), 0.0, n_vocab, 1)),
        ),
        (
            "oracle, none accepted".into(),
            Box::new(OracleDrafter::new(sequence, 1.0, n_vocab, 1)),
        ),
    ];
    for (kind, bytes) in synthetic_block_drafters(n_vocab) {
        let f = blockdraft_gguf::GgufFile::from_bytes(bytes).unwrap();
        drafters.push((
            kind.into(),
            Box::new(DFlashDrafter::load(&f, &dec, ctx, 32).unwrap()),
        ));
    }
    for (kind, d) in drafters.iter_mut() {
        let (got, stats) = greedy_speculative(&dec, d.as_mut(), &prompt, n, PolicyConfig::fixed(5));
        assert_eq!(got, want, "{kind}");
        assert!(stats.rounds > 0, "{kind}: {stats:?}");
        match kind.as_str() {
            "oracle, all accepted" | "the target as its draft model" => {
                assert_eq!(stats.accepted, stats.drafted, "{kind}: {stats:?}")
            }
            "oracle, none accepted" => assert_eq!(stats.accepted, 0, "{kind}"),
            _ => {}
        }
    }
}

/// Largest difference relative to the reference's largest magnitude (a NaN
/// counts as infinitely far): the cross-backend comparisons' measure.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f32::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f32::max)
        / scale
}
