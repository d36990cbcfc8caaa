//! Embeddings and matrix products against resident weights.

use super::{ElementwiseOps, GatedActivation, Projection, RowNorm};

pub trait LinearOps: ElementwiseOps {
    /// `out[r] = table[ids[r]]` (rows of the embedding table, dequantized).
    fn embed(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Tensor);
    /// [`Self::embed`] of the ids in column 0 of rows `row0 .. row0 + n` of
    /// `ids` (as [`super::SamplingOps::argmax_to`] writes them), `n` being
    /// `out`'s rows.
    fn embed_from(
        &self,
        table: &Self::Weight,
        ids: &Self::Tensor,
        row0: usize,
        out: &mut Self::Tensor,
    );
    /// `out = x · Wᵀ`: x is `n x cols`, W is `rows x cols`, out `n x rows`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Tensor, out: &mut Self::Tensor);
    /// Adds a 1-D weight to every row.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);

    /// The projections of one input (q|k|v, gate|up): for each,
    /// `out = x · Wᵀ`, plus its bias if it has one. The default runs them
    /// one by one; a backend may prepare `x` once for all of them (a GPU
    /// quantizes it once) and add the bias as each product is stored.
    fn matmul_many(&self, x: &Self::Tensor, projections: &mut [Projection<'_, Self>]) {
        super::composed::note::<Self>("matmul_many");
        for p in projections {
            self.matmul(p.weight, x, p.out);
            if let Some(b) = p.bias {
                self.add_bias(p.out, b);
            }
        }
    }

    /// A gated feed-forward's first half, `out = act(x · W_gateᵀ) ⊙
    /// (x · W_upᵀ)`. The default runs both projections into `gate` and `up`
    /// ([`Self::matmul_many`]), then [`ElementwiseOps::gated`]; a backend
    /// may apply the activation as the up projection is stored (`up` then
    /// stays unused).
    #[allow(clippy::too_many_arguments)]
    fn gated_projection(
        &self,
        act: GatedActivation,
        x: &Self::Tensor,
        w_gate: &Self::Weight,
        w_up: &Self::Weight,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        super::composed::note::<Self>("gated_projection");
        self.matmul_many(
            x,
            &mut [
                Projection {
                    weight: w_gate,
                    bias: None,
                    out: gate,
                },
                Projection {
                    weight: w_up,
                    bias: None,
                    out: up,
                },
            ],
        );
        self.gated(act, gate, up, out);
    }

    /// [`Self::matmul_many`] of `norm.out = rms_norm(x) · norm.weight` (whole
    /// rows), after adding `norm.pending` to `x`. The default adds,
    /// normalizes, then projects; a backend may prepare the products' input
    /// as it normalizes (a GPU adds, normalizes and quantizes each row in
    /// one pass).
    fn normed_matmul_many(
        &self,
        x: &mut Self::Tensor,
        norm: RowNorm<'_, Self>,
        projections: &mut [Projection<'_, Self>],
    ) {
        super::composed::note::<Self>("normed_matmul_many");
        let out = norm_rows(self, x, norm);
        self.matmul_many(out, projections);
    }

    /// [`Self::gated_projection`] of `norm.out = rms_norm(x) · norm.weight`
    /// (whole rows), as [`Self::normed_matmul_many`] is to
    /// [`Self::matmul_many`].
    #[allow(clippy::too_many_arguments)]
    fn normed_gated_projection(
        &self,
        act: GatedActivation,
        x: &mut Self::Tensor,
        norm: RowNorm<'_, Self>,
        w_gate: &Self::Weight,
        w_up: &Self::Weight,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        super::composed::note::<Self>("normed_gated_projection");
        let normed = norm_rows(self, x, norm);
        self.gated_projection(act, normed, w_gate, w_up, gate, up, out);
    }

    /// `acc += x · Wᵀ`, a residual branch's output projection. The default
    /// computes the product in `scratch` and adds it; a backend may add it
    /// as the product is stored (the same sums: f32 addition commutes).
    fn matmul_accumulate(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        acc: &mut Self::Tensor,
        scratch: &mut Self::Tensor,
    ) {
        super::composed::note::<Self>("matmul_accumulate");
        self.matmul(w, x, scratch);
        self.add(acc, scratch);
    }
}

/// `norm`'s pending branch added to `x`, then `norm.out = rms_norm(x) ·
/// norm.weight` (whole rows): the default compositions' first half, and
/// what an override falls back to. Returns `norm.out`.
pub fn norm_rows<'a, B: ElementwiseOps + ?Sized>(
    be: &B,
    x: &mut B::Tensor,
    norm: RowNorm<'a, B>,
) -> &'a mut B::Tensor {
    if let Some(b) = norm.pending {
        be.add_normed(x, b.output, b.post_norm, b.eps, norm.out);
    }
    let cols = be.shape(x).1;
    be.rms_norm(x, norm.weight, cols, norm.eps, norm.out);
    norm.out
}
