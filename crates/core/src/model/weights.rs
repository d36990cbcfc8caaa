//! Loading a decoder's tensors onto a backend, with shape checks, from a
//! GGUF file or from weights made resident while a file streamed in.

use super::config::{Architecture, ModelConfig};
use crate::backend::{Backend, WeightSource};
use crate::error::ModelError;
use blockdraft_gguf::{GgmlType, GgufFile, TensorData, TensorInfo};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

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

impl<B: Backend> LayerWeights<B> {
    /// The weights each multiplied by one input, side by side where the
    /// backend wants them so ([`crate::backend::Device::colocate`]).
    fn colocate(&mut self, backend: &B) {
        backend.colocate(&mut [&mut self.wq, &mut self.wk, &mut self.wv]);
        if let (Some(bq), Some(bk), Some(bv)) = (&mut self.bq, &mut self.bk, &mut self.bv) {
            backend.colocate(&mut [bq, bk, bv]);
        }
        backend.colocate(&mut [&mut self.w_gate, &mut self.w_up]);
    }
}

pub struct DecoderWeights<B: Backend> {
    /// Shared: a drafter without embeddings uses its target's.
    pub tok_embd: Arc<B::Weight>,
    pub output_norm: B::Weight,
    /// `None` when the head is tied to `tok_embd`; shared like it.
    pub output: Option<Arc<B::Weight>>,
    pub layers: Vec<LayerWeights<B>>,
}

/// Where a decoder's tensors come from.
pub trait TensorSource<B: Backend> {
    /// Type and dims of tensor `name`, if the source has it.
    fn info(&self, name: &str) -> Option<&TensorInfo>;
    /// Tensor `name` resident on `backend`; asked once per name.
    fn load(&mut self, name: &str, backend: &B) -> Result<B::Weight, ModelError>;
}

/// A GGUF file (or split set) whose tensors are uploaded when asked for,
/// remembering which ones were taken: a loader can then account for every
/// tensor in the file, as llama.cpp refuses a file whose tensor count
/// differs from what its architecture creates.
pub struct FileTensors<'a> {
    file: &'a GgufFile,
    /// Shared access, so that the several parts of a drafter's loader can
    /// take tensors from one ledger.
    taken: RefCell<HashSet<String>>,
}

impl<'a> FileTensors<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        FileTensors {
            file,
            taken: RefCell::default(),
        }
    }

    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// Type and dims of `name` without taking it (detecting a variant).
    pub fn peek(&self, name: &str) -> Option<&'a TensorInfo> {
        self.file.tensor(name)
    }

    /// Takes `name`, which must have exactly the dims `expected` (ggml order).
    pub fn take(&self, name: &str, expected: &[u64]) -> Result<(GgmlType, TensorData), ModelError> {
        let info = self.peek(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })?;
        check_dims(name, &info.dims, expected)?;
        let data = self.file.tensor_data(name)?;
        self.taken.borrow_mut().insert(name.to_string());
        Ok((info.ty, data))
    }

    /// [`Self::take`] made resident on `backend`.
    pub fn weight<B: Backend>(
        &self,
        backend: &B,
        name: &str,
        expected: &[u64],
    ) -> Result<B::Weight, ModelError> {
        let (ty, data) = self.take(name, expected)?;
        Ok(backend.load_weight(WeightSource {
            name,
            ty,
            dims: expected,
            data,
        })?)
    }

    /// The file's tensors not taken so far, in file order.
    pub fn untaken(&self) -> Vec<String> {
        let taken = self.taken.borrow();
        self.file
            .tensors()
            .iter()
            .filter(|t| !taken.contains(&t.name))
            .map(|t| t.name.clone())
            .collect()
    }
}

impl<B: Backend> TensorSource<B> for FileTensors<'_> {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.peek(name)
    }

    fn load(&mut self, name: &str, backend: &B) -> Result<B::Weight, ModelError> {
        let dims = self
            .peek(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?
            .dims
            .clone();
        self.weight(backend, name, &dims)
    }
}

/// Embeddings and head a drafter takes from its target when its own file
/// has none.
pub struct Borrowed<'a, B: Backend> {
    pub config: &'a ModelConfig,
    pub weights: &'a DecoderWeights<B>,
}

/// Loads tensors by name, checking each shape against the config.
pub struct TensorLoader<'a, B: Backend> {
    pub source: &'a mut dyn TensorSource<B>,
    pub backend: &'a B,
    /// Called with the number of bytes made resident so far (progress bars).
    pub on_progress: &'a mut dyn FnMut(u64),
    pub loaded_bytes: u64,
    pub borrow_from: Option<Borrowed<'a, B>>,
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
        let Some(info) = self.source.info(name) else {
            return Ok(None);
        };
        check_dims(name, &info.dims, expected)?;
        let n_bytes = info.n_bytes;
        let w = self.source.load(name, self.backend)?;
        self.loaded_bytes += n_bytes;
        (self.on_progress)(self.loaded_bytes);
        Ok(Some(w))
    }

    /// `token_embd.weight` or `output.weight`: the source's own, else the
    /// target's (when borrowing), else `None`.
    fn shared(
        &mut self,
        name: &str,
        expected: &[u64],
    ) -> Result<Option<Arc<B::Weight>>, ModelError> {
        if let Some(w) = self.optional(name, expected)? {
            return Ok(Some(Arc::new(w)));
        }
        let Some(target) = &self.borrow_from else {
            return Ok(None);
        };
        let (w, dims) = match name {
            "token_embd.weight" => (
                Some(&target.weights.tok_embd),
                [target.config.n_embd as u64, target.config.n_vocab as u64],
            ),
            _ => (
                target.weights.output.as_ref(),
                [
                    target.config.n_embd as u64,
                    target.config.n_vocab_head as u64,
                ],
            ),
        };
        match w {
            Some(w) => {
                check_dims(name, &dims, expected)?;
                Ok(Some(w.clone()))
            }
            None => Ok(None),
        }
    }
}

fn check_dims(name: &str, found: &[u64], expected: &[u64]) -> Result<(), ModelError> {
    if found != expected {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            found: found.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
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
        let tok_embd = loader
            .shared("token_embd.weight", &[d, cfg.n_vocab as u64])?
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let output_norm = loader.require("output_norm.weight", &[d])?;
        let output = loader.shared("output.weight", &[d, cfg.n_vocab_head as u64])?;
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
            let mut layer = LayerWeights {
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
            };
            layer.colocate(loader.backend);
            layers.push(layer);
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
        self.output.as_deref().unwrap_or(&self.tok_embd)
    }
}
