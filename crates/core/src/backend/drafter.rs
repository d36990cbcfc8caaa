//! Ops only some drafter variants use (DFlash2's convolution and selector,
//! DFly's tap fusion). The host-composed defaults run over
//! [`Device::read_blocking`] with the reference in [`crate::host_ops`].

use super::{record, shapes_agree, ConvParams, Device};
use crate::host_ops;

pub trait DrafterOps: Device {
    /// Grouped dynamic depthwise convolution over the rows of `x` (`n x d`),
    /// one block whose row `i` is time step `i`:
    /// `out[i][c] = Σ_t (base[s·T + t][c] + dynamic[i][(s·T + t)·d/G + c/G]) · x[i − t][c]`
    /// for `t < T`, with rows before 0 taken as zero (taps never leave the
    /// block). `base` is `2T x d`, `dynamic` is `n x 2T·d/G`.
    fn grouped_conv(
        &self,
        x: &Self::Tensor,
        base: &Self::Tensor,
        dynamic: &Self::Tensor,
        p: ConvParams,
        out: &mut Self::Tensor,
    );

    /// `out[r][c] += Σ_j w[j] · x[r][j·d + c]` for `d` = `out`'s columns, in
    /// order of `j`: a weighted sum of the `d`-wide column slices of `x`
    /// (`n x w.len()·d`), DFly's per-layer fusion of the raw taps.
    /// [`host_ops::add_slices`] is the reference and the default.
    fn add_slices(&self, x: &Self::Tensor, w: &[f32], out: &mut Self::Tensor) {
        super::composed::note::<Self>("add_slices");
        record(self, || {
            let ((n, cols), (o_rows, d)) = (self.shape(x), self.shape(out));
            shapes_agree(n == o_rows && cols == w.len() * d, "add_slices", || {
                format!("{n}x{cols} in {} slices into {o_rows}x{d}", w.len())
            })?;
            let mut o = self.read_blocking(out)?;
            host_ops::add_slices(&self.read_blocking(x)?, w, &mut o, d);
            self.write(out, &o);
            Ok(())
        });
    }

    /// DFlash2's greedy candidate-selector walk (spec §3.3) over one block of
    /// `n` rows with `K` candidates each, row 0 being the anchor's. Row
    /// `r >= 1` scores its candidates `c` after the predecessor `p` as
    /// `unary[r][c] + Σ_j (pred[p][j] · gates[r][j]) · succ[r·K + c][j]`
    /// and takes the best (first on ties); `p` is row 0 of `pred` (the
    /// anchor's codebook row) for `r = 1`, else `(r − 1)·K + best[r − 1]`.
    /// `cand[r][best]` (an f32 id) is written to `out[r][col]` for every
    /// `r >= 1`. `gates` is `n x R`, `pred` and `succ` are `n·K x R`,
    /// `unary` and `cand` `n x K`. [`host_ops::selector_walk`] is the
    /// reference and the default.
    #[allow(clippy::too_many_arguments)]
    fn selector_walk(
        &self,
        gates: &Self::Tensor,
        pred: &Self::Tensor,
        succ: &Self::Tensor,
        unary: &Self::Tensor,
        cand: &Self::Tensor,
        out: &mut Self::Tensor,
        col: usize,
    ) {
        super::composed::note::<Self>("selector_walk");
        record(self, || {
            let ((n, r), k) = (self.shape(gates), self.shape(unary).1);
            let (o_rows, o_cols) = self.shape(out);
            shapes_agree(
                self.shape(pred) == (n * k, r)
                    && self.shape(succ) == (n * k, r)
                    && self.shape(unary) == (n, k)
                    && self.shape(cand) == (n, k)
                    && n <= o_rows
                    && col < o_cols,
                "selector_walk",
                || format!("{n} rows of {k} candidates, rank {r}, into {o_rows}x{o_cols}"),
            )?;
            let read = |t| self.read_blocking(t);
            let walk = host_ops::selector_walk(
                &read(gates)?,
                &read(pred)?,
                &read(succ)?,
                &read(unary)?,
                &read(cand)?,
                n,
                k,
                r,
            );
            let mut o = read(out)?;
            for (i, id) in walk.into_iter().enumerate() {
                o[(1 + i) * o_cols + col] = id;
            }
            self.write(out, &o);
            Ok(())
        });
    }
}
