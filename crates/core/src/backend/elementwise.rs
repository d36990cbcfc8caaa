//! Row-wise and element-wise ops: norms, rotary embedding, activations,
//! row copies.

use super::{Device, GatedActivation, RopeParams};

pub trait ElementwiseOps: Device {
    /// RMS norm of every `group`-wide slice of each row, times `weight` (length `group`).
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Weight,
        group: usize,
        eps: f32,
        out: &mut Self::Tensor,
    );
    /// `x += rms_norm(y) · weight` over whole rows: a residual branch's
    /// output added through its post-norm (Gemma 3). The default normalizes
    /// into `scratch` (`y`'s shape), then adds; a backend may do both in
    /// one pass.
    fn add_normed(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        weight: &Self::Weight,
        eps: f32,
        scratch: &mut Self::Tensor,
    ) {
        super::composed::note::<Self>("add_normed");
        let cols = self.shape(y).1;
        self.rms_norm(y, weight, cols, eps, scratch);
        self.add(x, scratch);
    }
    /// In-place rotary embedding; row `i` has position `pos0 + i`.
    fn rope(&self, x: &mut Self::Tensor, pos0: usize, p: RopeParams);
    /// Rotates a layer's queries and keys, rows at positions `pos0..`
    /// (`q_p` and `k_p` differ in their head counts only). The default
    /// runs [`Self::rope`] on each; a backend may do both in one pass.
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        pos0: usize,
        q_p: RopeParams,
        k_p: RopeParams,
    ) {
        super::composed::note::<Self>("rope_qk");
        self.rope(q, pos0, q_p);
        self.rope(k, pos0, k_p);
    }
    /// `out = act(gate) * up`.
    fn gated(
        &self,
        act: GatedActivation,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    );
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Tensor, s: f32);
    /// NaN becomes 0 and values beyond `±limit` (infinities included) are
    /// clamped to it.
    fn clamp_finite(&self, x: &mut Self::Tensor, limit: f32);
    /// `x = cap · tanh(x / cap)` (final logit softcapping).
    fn softcap(&self, x: &mut Self::Tensor, cap: f32);
    /// Copies `n_rows` whole rows of `src` (from `src_row`) into `dst`
    /// at row `dst_row`, column `dst_col`. Used for KV appends, tap capture
    /// and row selection.
    fn copy_rows(
        &self,
        src: &Self::Tensor,
        src_row: usize,
        dst: &mut Self::Tensor,
        dst_row: usize,
        dst_col: usize,
        n_rows: usize,
    );
}
