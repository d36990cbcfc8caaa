//! DSpark on the Qwen3 backbone (tensor `markov_w1.weight`, spec:
//! shared/spec/dflash-family.md §1.3, §3.4) and reduced draft vocabularies
//! (tensor `d2t`, §2).
//!
//! DSpark adds a low-rank Markov head: each block row's logits get a bias
//! `W2 · W1[prev]` from the token chosen at the row before (the anchor for
//! the first), chained greedily, and an optional confidence head
//! `sigmoid(w_c · [h ; W1[prev]] + b)` that stops the draft early.
//!
//! The confidence tensor's GGUF name is not confirmed by the spec; this
//! port reads `conf_proj.weight` `{n_embd + R_m, 1}` and the optional
//! `conf_proj.bias` `{1}`.

use crate::backend::{Backend, BackendError, WeightSource};
use crate::error::ModelError;
use crate::model::FileTensors;
use blockdraft_gguf::{quants, GgmlType, GgufFile};

pub const CONF_WEIGHT: &str = "conf_proj.weight";
pub const CONF_BIAS: &str = "conf_proj.bias";

/// DSpark-specific metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DSparkConfig {
    /// Row 0 (the anchor's) is a prediction slot (`dflash.sample_from_anchor`,
    /// default true); otherwise predictions start at row 1 as in DFlash.
    pub sample_from_anchor: bool,
    /// `dflash.has_confidence_head`; `None` when the key is absent (which
    /// llama.cpp's driver treats as "has a head").
    pub has_confidence_head: Option<bool>,
    /// Markov rank R_m (`markov_w1` ne0).
    pub rank: usize,
}

impl DSparkConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let md = file.metadata();
        let w1 = file
            .tensor("markov_w1.weight")
            .expect("DSpark is detected by it");
        Ok(DSparkConfig {
            sample_from_anchor: md.opt_bool("dflash.sample_from_anchor")?.unwrap_or(true),
            has_confidence_head: md.opt_bool("dflash.has_confidence_head")?,
            rank: w1.dims[0] as usize,
        })
    }
}

/// Takes `name` to host memory as F32 after checking its ggml dims.
fn host_tensor(tensors: &FileTensors, name: &str, dims: &[u64]) -> Result<Vec<f32>, ModelError> {
    let (ty, data) = tensors.take(name, dims)?;
    Ok(quants::dequantize_to_vec(ty, &data)?)
}

/// The Markov head, host-side: per row it is one R_m-wide gather and one
/// `n_vocab_draft × R_m` product, too small to be worth a device round trip.
pub struct MarkovHead {
    /// `[n_vocab][rank]`.
    w1: Vec<f32>,
    /// `[n_vocab_draft][rank]`, pre-multiplied by `markov_w2.scale`.
    w2: Vec<f32>,
    rank: usize,
    /// `w_c` over `[h ; W1[prev]]` and the bias.
    conf: Option<(Vec<f32>, f32)>,
}

impl MarkovHead {
    pub fn load(
        tensors: &FileTensors,
        cfg: &DSparkConfig,
        n_embd: usize,
        n_vocab: usize,
        n_vocab_draft: usize,
    ) -> Result<Self, ModelError> {
        let r = cfg.rank as u64;
        let w1 = host_tensor(tensors, "markov_w1.weight", &[r, n_vocab as u64])?;
        let mut w2 = host_tensor(tensors, "markov_w2.weight", &[r, n_vocab_draft as u64])?;
        if tensors.peek("markov_w2.scale").is_some() {
            let s = host_tensor(tensors, "markov_w2.scale", &[1])?[0];
            w2.iter_mut().for_each(|w| *w *= s);
        }
        // A head declared absent is not loaded even if a tensor is there:
        // the metadata is what llama.cpp's driver trusts (the tensors are
        // then known optional, see `DFlashConfig::known_optional`).
        let conf = if cfg.has_confidence_head == Some(false) {
            None
        } else if tensors.peek(CONF_WEIGHT).is_some() {
            let w = host_tensor(tensors, CONF_WEIGHT, &[(n_embd + cfg.rank) as u64, 1])?;
            let b = match tensors.peek(CONF_BIAS) {
                Some(_) => host_tensor(tensors, CONF_BIAS, &[1])?[0],
                None => 0.0,
            };
            Some((w, b))
        } else if cfg.has_confidence_head == Some(true) {
            return Err(ModelError::MissingTensor {
                name: CONF_WEIGHT.into(),
            });
        } else {
            None
        };
        Ok(MarkovHead {
            w1,
            w2,
            rank: cfg.rank,
            conf,
        })
    }

    pub fn has_confidence(&self) -> bool {
        self.conf.is_some()
    }

    fn embed(&self, prev: u32) -> &[f32] {
        let r = self.rank;
        &self.w1[prev as usize * r..(prev as usize + 1) * r]
    }

    /// Adds `W2 · W1[prev]` to `row` (target-vocabulary logits), through
    /// `d2t` when the head is a reduced vocabulary.
    pub fn add_bias(&self, row: &mut [f32], prev: u32, d2t: Option<&[u32]>) {
        let e = self.embed(prev);
        for (j, w) in self.w2.chunks_exact(self.rank).enumerate() {
            let b: f32 = w.iter().zip(e).map(|(a, b)| a * b).sum();
            let t = d2t.map_or(j, |m| m[j] as usize);
            row[t] += b;
        }
    }

    /// `sigmoid(w_c · [h ; W1[prev]] + b)` for the final-normed hidden row
    /// `h`; `None` without a confidence head.
    pub fn confidence(&self, h: &[f32], prev: u32) -> Option<f32> {
        let (w, b) = self.conf.as_ref()?;
        let x = h.iter().chain(self.embed(prev));
        let z: f32 = w.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() + b;
        Some(1.0 / (1.0 + (-z).exp()))
    }
}

/// The Markov chain on the device, for greedy drafting without a readback
/// (full-vocabulary heads): `W1` as an embedding table, `W2` as a matmul
/// weight.
pub(super) struct DeviceMarkov<B: Backend> {
    w1: B::Weight,
    w2: B::Weight,
    /// `markov_w2.scale`, applied to the bias.
    scale: Option<f32>,
    rank: usize,
}

/// One row of a sequence's scratch for [`DeviceMarkov`].
pub(super) struct DeviceMarkovScratch<B: Backend> {
    e: B::Tensor,
    bias: B::Tensor,
    row: B::Tensor,
}

impl<B: Backend> DeviceMarkov<B> {
    /// `None` when a row of `W1` or `W2` (rank values) is not a whole
    /// number of quantization blocks, which device weights need, or the
    /// backend cannot keep their type resident: the host chains then.
    pub(super) fn load(
        be: &B,
        tensors: &FileTensors,
        cfg: &DSparkConfig,
        n_vocab: usize,
    ) -> Result<Option<Self>, ModelError> {
        let dims = [cfg.rank as u64, n_vocab as u64];
        let mut weights = Vec::with_capacity(2);
        for name in ["markov_w1.weight", "markov_w2.weight"] {
            let (ty, data) = tensors.take(name, &dims)?;
            if !cfg.rank.is_multiple_of(ty.block_len()) {
                return Ok(None);
            }
            match be.load_weight(WeightSource {
                name,
                ty,
                dims: &dims,
                data,
                role: tensors.role(),
            }) {
                Ok(w) => weights.push(w),
                Err(BackendError::Unsupported { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        let scale = match tensors.peek("markov_w2.scale") {
            Some(_) => Some(host_tensor(tensors, "markov_w2.scale", &[1])?[0]),
            None => None,
        };
        let w2 = weights.pop().expect("two weights");
        let w1 = weights.pop().expect("two weights");
        Ok(Some(DeviceMarkov {
            w1,
            w2,
            scale,
            rank: cfg.rank,
        }))
    }

    /// Scratch for one sequence.
    pub(super) fn scratch(&self, be: &B, n_vocab: usize) -> DeviceMarkovScratch<B> {
        DeviceMarkovScratch {
            e: be.tensor(1, self.rank),
            bias: be.tensor(1, n_vocab),
            row: be.tensor(1, n_vocab),
        }
    }

    /// Biases row `row` of `logits` by `W2 · W1[prev]`, `prev` being the id
    /// in column 0 of row `slot − 1` of `ids`, and writes the argmax (the
    /// draft, and the next row's `prev`) to row `slot`.
    pub(super) fn draft_row(
        &self,
        s: &mut DeviceMarkovScratch<B>,
        be: &B,
        logits: &B::Tensor,
        row: usize,
        slot: usize,
        ids: &mut B::Tensor,
    ) {
        be.embed_from(&self.w1, ids, slot - 1, &mut s.e);
        be.matmul(&self.w2, &s.e, &mut s.bias);
        if let Some(scale) = self.scale {
            be.scale(&mut s.bias, scale);
        }
        be.copy_rows(logits, row, &mut s.row, 0, 0, 1);
        be.add(&mut s.row, &s.bias);
        be.argmax_to(&s.row, ids, slot, 0);
    }
}

/// Reads and checks `d2t` (draft row → target id) for a head of
/// `n_vocab_draft` rows over a target vocabulary of `n_vocab`.
pub fn load_d2t(
    tensors: &FileTensors,
    n_vocab_draft: usize,
    n_vocab: usize,
) -> Result<Vec<u32>, ModelError> {
    let bad = |why: String| ModelError::Usage(format!("DFlash drafter: tensor `d2t` {why}"));
    let info = tensors.peek("d2t").expect("checked by the caller");
    if info.ty != GgmlType::I64 {
        return Err(bad(format!("is {:?}, expected I64", info.ty)));
    }
    let (_, data) = tensors.take("d2t", &[n_vocab_draft as u64])?;
    let mut seen = vec![false; n_vocab];
    let mut map = Vec::with_capacity(n_vocab_draft);
    for (j, b) in data.chunks_exact(8).enumerate() {
        let t = i64::from_le_bytes(b.try_into().expect("8 bytes"));
        let id = usize::try_from(t)
            .ok()
            .filter(|&id| id < n_vocab)
            .ok_or_else(|| {
                bad(format!(
                    "maps draft row {j} to {t}, outside the target vocabulary of {n_vocab}"
                ))
            })?;
        if std::mem::replace(&mut seen[id], true) {
            return Err(bad(format!(
                "maps two draft rows to target id {id} (row {j} repeats it)"
            )));
        }
        map.push(id as u32);
    }
    Ok(map)
}
