//! The KV cache's appends and attention over it.

use super::{AttentionMask, AttentionParams, AttentionStep, ElementwiseOps, HeadNorms};

pub trait AttentionOps: ElementwiseOps {
    /// Appends a layer's `n` key and value rows to its caches at `row`.
    /// The default runs [`ElementwiseOps::copy_rows`] on each; a backend
    /// may do both in one pass.
    fn append_kv(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        k_cache: &mut Self::Tensor,
        v_cache: &mut Self::Tensor,
        row: usize,
        n: usize,
    ) {
        self.copy_rows(k, 0, k_cache, row, 0, n);
        self.copy_rows(v, 0, v_cache, row, 0, n);
    }
    /// A layer's whole attention step for the `n` rows of `q` at positions
    /// `step.mask.q_pos0 ..`: normalizes each head of `q` and `k` where
    /// `head_norms` says, rotates them, scales `q` where asked, appends the
    /// `n` rows of `k` and `v` to the caches there and attends over them
    /// into `out`. `q`, `k` and the norms' outputs hold unspecified values
    /// afterwards. The default runs [`ElementwiseOps::rms_norm`],
    /// [`ElementwiseOps::rope_qk`], [`ElementwiseOps::scale`],
    /// [`Self::append_kv`] and [`Self::attention`]; a backend may do it in
    /// one pass (a GPU's workgroups normalize and rotate what they read and
    /// take the rows' own keys and values from `k` and `v` rather than the
    /// cache).
    fn attention_step(
        &self,
        (q, k, v): (&mut Self::Tensor, &mut Self::Tensor, &Self::Tensor),
        (k_cache, v_cache): (&mut Self::Tensor, &mut Self::Tensor),
        step: AttentionStep,
        head_norms: Option<HeadNorms<'_, Self>>,
        out: &mut Self::Tensor,
    ) {
        super::composed::note::<Self>("attention_step");
        attention_step_by_parts(self, (q, k, v), (k_cache, v_cache), step, head_norms, out);
    }

    /// Scaled-dot-product attention of `q` (`n x n_head*head_dim`) over the
    /// cached keys/values (`capacity x n_head_kv*head_dim`), grouped-query.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut Self::Tensor,
    );
}

/// [`AttentionOps::attention_step`] by its parts: head norms, rope, scale,
/// append and attention. The default composition, and what an override
/// falls back to for the steps its single pass does not take.
pub fn attention_step_by_parts<B: AttentionOps + ?Sized>(
    be: &B,
    (mut q, mut k, v): (&mut B::Tensor, &mut B::Tensor, &B::Tensor),
    (k_cache, v_cache): (&mut B::Tensor, &mut B::Tensor),
    step: AttentionStep,
    head_norms: Option<HeadNorms<'_, B>>,
    out: &mut B::Tensor,
) {
    if let Some(h) = head_norms {
        let head_dim = step.params.head_dim;
        be.rms_norm(q, h.q_weight, head_dim, h.eps, h.q_out);
        be.rms_norm(k, h.k_weight, head_dim, h.eps, h.k_out);
        (q, k) = (h.q_out, h.k_out);
    }
    let pos0 = step.mask.q_pos0;
    be.rope_qk(q, k, pos0, step.q_rope, step.k_rope);
    if let Some(s) = step.q_scale {
        be.scale(q, s);
    }
    let n = be.shape(q).0;
    be.append_kv(k, v, k_cache, v_cache, pos0, n);
    be.attention(q, k_cache, v_cache, step.mask, step.params, out);
}
