//! Loading a decoder's tensors from GGUF onto a backend, with shape checks.

use super::config::{Architecture, ModelConfig};
use crate::backend::{Backend, WeightSource};
use crate::error::ModelError;
use blockdraft_gguf::GgufFile;

pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub q_norm: Option<B::Weight>,
    pub k_norm: Option<B::Weight>,
    pub post_attn_norm: Option<B::Weight>,
    pub ffn_norm: B::Weight,
    pub w_gate: B::Weight,
    pub w_up: B::Weight,
    pub w_down: B::Weight,
    pub post_ffn_norm: Option<B::Weight>,
}

pub struct DecoderWeights<B: Backend> {
    pub tok_embd: B::Weight,
    pub output_norm: B::Weight,
    /// `None` when the head is tied to `tok_embd`.
    pub output: Option<B::Weight>,
    pub layers: Vec<LayerWeights<B>>,
}

/// Loads tensors by name, checking each shape against the config.
pub struct TensorLoader<'a, B: Backend> {
    pub file: &'a GgufFile,
    pub backend: &'a B,
    /// Called with the number of bytes made resident so far (progress bars).
    pub on_progress: &'a mut dyn FnMut(u64),
    pub loaded_bytes: u64,
    /// Where `token_embd.weight` and `output.weight` come from when `file`
    /// lacks them (drafters borrow the target's embeddings and head).
    pub borrow_from: Option<&'a GgufFile>,
}

impl<B: Backend> TensorLoader<'_, B> {
    /// Loads `name`, which must have exactly the dims `expected` (ggml order).
    pub fn require(&mut self, name: &str, expected: &[u64]) -> Result<B::Weight, ModelError> {
        self.optional(name, expected)?
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    pub fn optional(
        &mut self,
        name: &str,
        expected: &[u64],
    ) -> Result<Option<B::Weight>, ModelError> {
        let borrowable = matches!(name, "token_embd.weight" | "output.weight");
        let file = match (self.file.tensor(name), self.borrow_from) {
            (Some(_), _) => self.file,
            (None, Some(other)) if borrowable && other.tensor(name).is_some() => other,
            _ => return Ok(None),
        };
        let info = file.tensor(name).expect("checked above");
        if info.dims != expected {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                found: info.dims.clone(),
                expected: expected.to_vec(),
            });
        }
        let data = file.tensor_data(name)?;
        let w = self.backend.load_weight(WeightSource {
            name,
            ty: info.ty,
            dims: &info.dims,
            data,
        })?;
        self.loaded_bytes += info.n_bytes;
        (self.on_progress)(self.loaded_bytes);
        Ok(Some(w))
    }
}

impl<B: Backend> DecoderWeights<B> {
    pub fn load(cfg: &ModelConfig, loader: &mut TensorLoader<'_, B>) -> Result<Self, ModelError> {
        let (d, q, kv, ff, hd) = (
            cfg.n_embd as u64,
            cfg.q_dim() as u64,
            cfg.kv_dim() as u64,
            cfg.n_ff as u64,
            cfg.head_dim as u64,
        );
        let tok_embd = loader.require("token_embd.weight", &[d, cfg.n_vocab as u64])?;
        let output_norm = loader.require("output_norm.weight", &[d])?;
        let output = loader.optional("output.weight", &[d, cfg.n_vocab_head as u64])?;
        let has_qk_norm = matches!(
            cfg.arch,
            Architecture::Qwen3 | Architecture::Gemma3 | Architecture::DFlash
        );
        let has_post_norms = cfg.arch == Architecture::Gemma3;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |t: &str| format!("blk.{il}.{t}");
            let qk_norm = |loader: &mut TensorLoader<'_, B>,
                           t: &str|
             -> Result<Option<B::Weight>, ModelError> {
                if has_qk_norm {
                    loader.require(&n(t), &[hd]).map(Some)
                } else {
                    Ok(None)
                }
            };
            let post_norm = |loader: &mut TensorLoader<'_, B>,
                             t: &str|
             -> Result<Option<B::Weight>, ModelError> {
                if has_post_norms {
                    loader.require(&n(t), &[d]).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: loader.require(&n("attn_norm.weight"), &[d])?,
                wq: loader.require(&n("attn_q.weight"), &[d, q])?,
                wk: loader.require(&n("attn_k.weight"), &[d, kv])?,
                wv: loader.require(&n("attn_v.weight"), &[d, kv])?,
                wo: loader.require(&n("attn_output.weight"), &[q, d])?,
                bq: loader.optional(&n("attn_q.bias"), &[q])?,
                bk: loader.optional(&n("attn_k.bias"), &[kv])?,
                bv: loader.optional(&n("attn_v.bias"), &[kv])?,
                q_norm: qk_norm(loader, "attn_q_norm.weight")?,
                k_norm: qk_norm(loader, "attn_k_norm.weight")?,
                post_attn_norm: post_norm(loader, "post_attention_norm.weight")?,
                ffn_norm: loader.require(&n("ffn_norm.weight"), &[d])?,
                w_gate: loader.require(&n("ffn_gate.weight"), &[d, ff])?,
                w_up: loader.require(&n("ffn_up.weight"), &[d, ff])?,
                w_down: loader.require(&n("ffn_down.weight"), &[ff, d])?,
                post_ffn_norm: post_norm(loader, "post_ffw_norm.weight")?,
            });
        }
        Ok(DecoderWeights {
            tok_embd,
            output_norm,
            output,
            layers,
        })
    }

    /// The LM head: `output.weight`, or the tied embedding table.
    pub fn head(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }
}
