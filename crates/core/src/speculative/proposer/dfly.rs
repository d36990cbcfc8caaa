//! DFly (tensor `layer_fusion`, spec: shared/spec/dflash-family.md §1.3,
//! §3.5): each draft layer reads its own context, the shared `fc`
//! projection plus a softmax-weighted mix of the raw taps, and an optional
//! predecessor correction refines every block row with the embedding of the
//! token drafted just before it.

use crate::backend::{Backend, GatedActivation};
use crate::error::ModelError;
use crate::model::FileTensors;
use blockdraft_gguf::GgmlType;

pub(super) const CORRECTION: [&str; 5] = [
    "hidden_correction.hidden_norm.weight",
    "hidden_correction.embed_norm.weight",
    "hidden_correction.gate.weight",
    "hidden_correction.up.weight",
    "hidden_correction.down.weight",
];

/// DFly-specific structure, checked at load.
#[derive(Clone, Debug, PartialEq)]
pub struct DFlyConfig {
    /// Softmax over the taps of each draft layer's fusion logits,
    /// `[layer][tap]` (ggml `{T, L}` = HF `layer_fusion_weights [L, T]`).
    pub fusion: Vec<Vec<f32>>,
    /// All five `hidden_correction.*` tensors are present.
    pub hidden_correction: bool,
}

impl DFlyConfig {
    /// `n_taps` = len(target_layers); the error strings name the variant so
    /// a misdetected file says why.
    pub fn from_gguf(tensors: &FileTensors, n_taps: usize) -> Result<Self, String> {
        if tensors.peek("d2t").is_some() {
            return Err("DFly with a reduced draft vocabulary (d2t) is not supported. The reference chain runs the full target head".into());
        }
        if tensors.peek("markov_w1.weight").is_some() {
            return Err("checkpoint has both a DFly layer_fusion and a DSpark markov_w1; they are mutually exclusive, the export is wrong".into());
        }
        if tensors.peek("context_norm.weight").is_none() {
            return Err("DFly drafter (tensor `layer_fusion`) lacks `context_norm.weight`".into());
        }
        let n_layer = tensors
            .file()
            .metadata()
            .get_usize("dflash.block_count")
            .map_err(|e| e.to_string())?;
        let info = tensors
            .peek("layer_fusion")
            .expect("DFly is detected by it");
        let expected = [n_taps as u64, n_layer as u64];
        if info.dims != expected {
            return Err(format!(
                "DFly `layer_fusion` has shape {:?}, expected {{T, L}} = {expected:?} ({n_taps} taps, {n_layer} draft layers)",
                info.dims
            ));
        }
        // Consumed by a softmax, never by a matmul: llama.cpp keeps it F32.
        if info.ty != GgmlType::F32 {
            return Err(format!(
                "DFly `layer_fusion` is {:?}, expected F32",
                info.ty
            ));
        }
        let (_, data) = tensors
            .take("layer_fusion", &expected)
            .map_err(|e| e.to_string())?;
        let logits: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // ne0 = T is the fastest axis: row l holds layer l's T logits.
        let fusion = logits.chunks_exact(n_taps).map(softmax).collect();
        let present = CORRECTION
            .iter()
            .filter(|n| tensors.peek(n).is_some())
            .count();
        if present != 0 && present != CORRECTION.len() {
            let missing: Vec<_> = CORRECTION
                .iter()
                .filter(|n| tensors.peek(n).is_none())
                .collect();
            return Err(format!(
                "DFly hidden correction is a partial set (missing {missing:?}): a broken export"
            ));
        }
        Ok(DFlyConfig {
            fusion,
            hidden_correction: present == CORRECTION.len(),
        })
    }
}

fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// The predecessor correction's weights (TreeFlash).
pub(super) struct Correction<B: Backend> {
    hidden_norm: B::Weight,
    embed_norm: B::Weight,
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
    /// Hidden width of the feed-forward.
    ff: usize,
}

/// One row of a sequence's scratch for [`Correction`].
pub(super) struct CorrectionScratch<B: Backend> {
    z: B::Tensor,
    z_normed: B::Tensor,
    e: B::Tensor,
    e_normed: B::Tensor,
    u: B::Tensor,
    g: B::Tensor,
    h: B::Tensor,
    act: B::Tensor,
    delta: B::Tensor,
    logits: B::Tensor,
}

impl<B: Backend> Correction<B> {
    pub(super) fn load(be: &B, tensors: &FileTensors, d: usize) -> Result<Self, ModelError> {
        let ff = Self::ff(tensors)?;
        let (d64, n) = (d as u64, CORRECTION);
        let load = |name, dims: &[u64]| tensors.weight(be, name, dims);
        Ok(Correction {
            hidden_norm: load(n[0], &[d64])?,
            embed_norm: load(n[1], &[d64])?,
            gate: load(n[2], &[2 * d64, ff as u64])?,
            up: load(n[3], &[2 * d64, ff as u64])?,
            down: load(n[4], &[ff as u64, d64])?,
            ff,
        })
    }

    /// The hidden width of the correction's feed-forward.
    fn ff(tensors: &FileTensors) -> Result<usize, ModelError> {
        tensors
            .peek("hidden_correction.down.weight")
            .map(|t| t.dims[0] as usize)
            .ok_or_else(|| ModelError::MissingTensor {
                name: "hidden_correction.down.weight".into(),
            })
    }

    /// Scratch for one sequence.
    pub(super) fn scratch(&self, be: &B, d: usize, n_vocab: usize) -> CorrectionScratch<B> {
        let ff = self.ff;
        CorrectionScratch {
            z: be.tensor(1, d),
            z_normed: be.tensor(1, d),
            e: be.tensor(1, d),
            e_normed: be.tensor(1, d),
            u: be.tensor(1, 2 * d),
            g: be.tensor(1, ff),
            h: be.tensor(1, ff),
            act: be.tensor(1, ff),
            delta: be.tensor(1, d),
            logits: be.tensor(1, n_vocab),
        }
    }

    /// Logits of block row `row` of `hidden` (final-normed) corrected by
    /// the embedding of `prev`, the token drafted at the row before:
    /// `head(z + down(silu(gate u) ⊙ up u))`, `u = [rms(z) ; rms(embed(prev))]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn row_logits(
        &self,
        s: &mut CorrectionScratch<B>,
        be: &B,
        hidden: &B::Tensor,
        row: usize,
        prev: u32,
        embd: &B::Weight,
        head: &B::Weight,
        eps: f32,
    ) -> Vec<f32> {
        be.embed(embd, &[prev], &mut s.e);
        self.correct(s, be, hidden, row, head, eps);
        be.read(&s.logits).await
    }

    /// [`Self::row_logits`] on the device: `prev` is the id in column 0 of
    /// row `row − 1` of `ids`, and the argmax of the corrected logits goes
    /// to row `row`, so each row's pick feeds the next without a readback.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn draft_row(
        &self,
        s: &mut CorrectionScratch<B>,
        be: &B,
        hidden: &B::Tensor,
        row: usize,
        embd: &B::Weight,
        head: &B::Weight,
        eps: f32,
        ids: &mut B::Tensor,
    ) {
        be.embed_from(embd, ids, row - 1, &mut s.e);
        self.correct(s, be, hidden, row, head, eps);
        be.argmax_to(&s.logits, ids, row, 0);
    }

    /// The corrected logits of `row` into `s.logits`, the predecessor's
    /// embedding being in `s.e`.
    fn correct(
        &self,
        s: &mut CorrectionScratch<B>,
        be: &B,
        hidden: &B::Tensor,
        row: usize,
        head: &B::Weight,
        eps: f32,
    ) {
        let d = be.shape(&s.z).1;
        be.copy_rows(hidden, row, &mut s.z, 0, 0, 1);
        be.rms_norm(&s.z, &self.hidden_norm, d, eps, &mut s.z_normed);
        be.rms_norm(&s.e, &self.embed_norm, d, eps, &mut s.e_normed);
        be.copy_rows(&s.z_normed, 0, &mut s.u, 0, 0, 1);
        be.copy_rows(&s.e_normed, 0, &mut s.u, 0, d, 1);
        be.matmul(&self.gate, &s.u, &mut s.g);
        be.matmul(&self.up, &s.u, &mut s.h);
        be.gated(GatedActivation::SwiGlu, &s.g, &s.h, &mut s.act);
        be.matmul(&self.down, &s.act, &mut s.delta);
        be.add(&mut s.z, &s.delta);
        be.matmul(head, &s.z, &mut s.logits);
    }
}
