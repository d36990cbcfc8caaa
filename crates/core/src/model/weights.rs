//! Loading a decoder's tensors onto a backend, with shape checks, from a
//! GGUF file or from weights made resident while a file streamed in.

use super::config::{Architecture, ModelConfig};
use crate::backend::{Backend, WeightRole, WeightSource};
use crate::error::ModelError;
use blockdraft_gguf::{GgmlType, GgufFile, TensorData, TensorInfo};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    /// What mixes positions: attention, or a gated DeltaNet.
    pub mixer: Mixer<B>,
    pub post_attn_norm: Option<B::Weight>,
    pub ffn_norm: B::Weight,
    pub w_gate: B::Weight,
    pub w_up: B::Weight,
    pub w_down: B::Weight,
    pub post_ffn_norm: Option<B::Weight>,
}

/// A block's sequence mixer.
pub enum Mixer<B: Backend> {
    Attention(AttentionWeights<B>),
    DeltaNet(DeltaNetWeights<B>),
}

pub struct AttentionWeights<B: Backend> {
    /// Queries; with gated attention each head's gate follows its queries.
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub q_norm: Option<B::Weight>,
    pub k_norm: Option<B::Weight>,
}

/// A gated-DeltaNet block's tensors (llama.cpp's `qwen35` names).
pub struct DeltaNetWeights<B: Backend> {
    /// `attn_qkv`: the convolution's input (queries, keys, values).
    pub w_qkv: B::Weight,
    /// `attn_gate`: the output gate `z`.
    pub w_z: B::Weight,
    /// `ssm_beta`, `ssm_alpha`: per value head, the update strength and
    /// the decay's input.
    pub w_beta: B::Weight,
    pub w_alpha: B::Weight,
    /// `ssm_conv1d`: `{conv_kernel, conv_dim}` taps.
    pub conv: B::Weight,
    /// `ssm_dt.bias` and `ssm_a` (−exp(A_log)), one per value head.
    pub dt_bias: B::Weight,
    pub a: B::Weight,
    /// `ssm_norm`: the output's per-head RMS norm.
    pub norm: B::Weight,
    /// `ssm_out`.
    pub w_out: B::Weight,
}

impl<B: Backend> LayerWeights<B> {
    /// The attention weights of an attention block.
    pub fn attention(&self) -> Option<&AttentionWeights<B>> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        }
    }

    /// The weights each multiplied by one input, and the head norms one
    /// attention step reads, side by side where the backend wants them so
    /// ([`crate::backend::Device::colocate`]).
    fn colocate(&mut self, backend: &B) {
        match &mut self.mixer {
            Mixer::Attention(a) => {
                backend.colocate(&mut [&mut a.wq, &mut a.wk, &mut a.wv]);
                if let (Some(bq), Some(bk), Some(bv)) = (&mut a.bq, &mut a.bk, &mut a.bv) {
                    backend.colocate(&mut [bq, bk, bv]);
                }
                if let (Some(qn), Some(kn)) = (&mut a.q_norm, &mut a.k_norm) {
                    backend.colocate(&mut [qn, kn]);
                }
            }
            Mixer::DeltaNet(d) => {
                backend.colocate(&mut [&mut d.w_qkv, &mut d.w_z, &mut d.w_beta, &mut d.w_alpha])
            }
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
    role: WeightRole,
    /// Shared access, so that the several parts of a drafter's loader can
    /// take tensors from one ledger.
    taken: RefCell<HashSet<String>>,
}

impl<'a> FileTensors<'a> {
    /// A target's tensors.
    pub fn new(file: &'a GgufFile) -> Self {
        Self::with_role(file, WeightRole::Target)
    }

    /// Tensors made resident for `role`.
    pub fn with_role(file: &'a GgufFile, role: WeightRole) -> Self {
        FileTensors {
            file,
            role,
            taken: RefCell::default(),
        }
    }

    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The role its tensors are made resident for.
    pub fn role(&self) -> WeightRole {
        self.role
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
            role: self.role,
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
            Architecture::Qwen3
                | Architecture::Gemma3
                | Architecture::Qwen35
                | Architecture::DFlash
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
            let mixer = if cfg.recurrent_layers[il] {
                Mixer::DeltaNet(DeltaNetWeights::load(cfg, loader, il)?)
            } else {
                Mixer::Attention(AttentionWeights {
                    wq: loader.require(&n("attn_q.weight"), &[d, cfg.q_proj_dim() as u64])?,
                    wk: loader.require(&n("attn_k.weight"), &[d, kv])?,
                    wv: loader.require(&n("attn_v.weight"), &[d, kv])?,
                    wo: loader.require(&n("attn_output.weight"), &[q, d])?,
                    bq: loader.optional(&n("attn_q.bias"), &[q])?,
                    bk: loader.optional(&n("attn_k.bias"), &[kv])?,
                    bv: loader.optional(&n("attn_v.bias"), &[kv])?,
                    q_norm: qk_norm(loader, "attn_q_norm.weight")?,
                    k_norm: qk_norm(loader, "attn_k_norm.weight")?,
                })
            };
            // Qwen3.5 names its pre-FFN norm `post_attention_norm`.
            let (post_attn_norm, ffn_norm) = if cfg.arch == Architecture::Qwen35 {
                (
                    None,
                    loader.require(&n("post_attention_norm.weight"), &[d])?,
                )
            } else {
                (
                    post_norm(loader, "post_attention_norm.weight")?,
                    loader.require(&n("ffn_norm.weight"), &[d])?,
                )
            };
            let mut layer = LayerWeights {
                attn_norm: loader.require(&n("attn_norm.weight"), &[d])?,
                mixer,
                post_attn_norm,
                ffn_norm,
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

impl<B: Backend> DeltaNetWeights<B> {
    fn load(
        cfg: &ModelConfig,
        loader: &mut TensorLoader<'_, B>,
        il: usize,
    ) -> Result<Self, ModelError> {
        let dn = cfg.delta_net.ok_or_else(|| {
            ModelError::Usage(format!(
                "layer {il} is recurrent but the model has no ssm sizes"
            ))
        })?;
        let n = |t: &str| format!("blk.{il}.{t}");
        let (e, conv, value, hv) = (
            cfg.n_embd as u64,
            dn.conv_dim() as u64,
            dn.value_dim() as u64,
            dn.n_v_heads as u64,
        );
        Ok(DeltaNetWeights {
            w_qkv: loader.require(&n("attn_qkv.weight"), &[e, conv])?,
            w_z: loader.require(&n("attn_gate.weight"), &[e, value])?,
            w_beta: loader.require(&n("ssm_beta.weight"), &[e, hv])?,
            w_alpha: loader.require(&n("ssm_alpha.weight"), &[e, hv])?,
            conv: loader.require(&n("ssm_conv1d.weight"), &[dn.conv_kernel as u64, conv])?,
            dt_bias: loader.require(&n("ssm_dt.bias"), &[hv])?,
            a: loader.require(&n("ssm_a"), &[hv])?,
            norm: loader.require(&n("ssm_norm.weight"), &[dn.v_dim as u64])?,
            w_out: loader.require(&n("ssm_out.weight"), &[value, e])?,
        })
    }
}
