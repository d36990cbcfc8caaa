//! Choosing tokens from logits. Besides `argmax_to`, every op has a
//! default: on the device from `argmax_to`, or on the host over
//! [`Device::read_blocking`] with the reference in [`crate::host_ops`] (a
//! backend with device kernels overrides these).

use super::{record, shapes_agree, Device};
use crate::host_ops;
use crate::sampling::SamplingParams;

#[allow(async_fn_in_trait)]
pub trait SamplingOps: Device {
    /// The index of the largest value of each row of `x`, written as f32
    /// down column `col` of `out` from row `row` (first on ties), without
    /// leaving the device: drafts and verify choices stay there until one
    /// readback per round. (Token ids are exact in f32 below 2^24.)
    fn argmax_to(&self, x: &Self::Tensor, out: &mut Self::Tensor, row: usize, col: usize);

    /// Index of the largest value of each row (first on ties). The default
    /// reads back [`Self::argmax_to`]'s column.
    async fn argmax(&self, x: &Self::Tensor) -> Vec<u32> {
        super::composed::note::<Self>("argmax");
        let mut ids = self.tensor(self.shape(x).0, 1);
        self.argmax_to(x, &mut ids, 0, 0);
        let ids = self.read(&ids).await;
        ids.into_iter().map(|v| v as u32).collect()
    }

    /// The `k` largest values of each row of `x` (`n x cols`, `k <= cols`),
    /// best first and the smaller index first on ties (NaN counting as −∞),
    /// into `values` and their column indices as f32 into `ids` (both
    /// `n x k`). [`host_ops::top_k`] is the reference and the default.
    fn top_k(&self, x: &Self::Tensor, k: usize, values: &mut Self::Tensor, ids: &mut Self::Tensor) {
        super::composed::note::<Self>("top_k");
        record(self, || {
            let (n, cols) = self.shape(x);
            let (vs, is) = (self.shape(values), self.shape(ids));
            shapes_agree(k <= cols && vs == (n, k) && is == (n, k), "top_k", || {
                format!("{k} of {n}x{cols} into {vs:?} and {is:?}")
            })?;
            let (v, i) = host_ops::top_k(&self.read_blocking(x)?, cols, k);
            self.write(values, &v);
            self.write(ids, &i);
            Ok(())
        });
    }

    /// The repetition penalty, in place, on the rows of logits `x` (`n x
    /// vocab`): row `r` penalizes each distinct token among the last
    /// `last_n` of `history ++ batch[1..=r]`, as
    /// [`crate::sampling::penalize`] does (positive logits divided by
    /// `penalty`, the others multiplied). `batch` is column `col` of a
    /// verify batch of f32 ids (row 0 its anchor, the last of `history`);
    /// `None` for one row of logits. [`host_ops::penalize_rows`] is the
    /// reference and the default.
    fn penalize(
        &self,
        x: &mut Self::Tensor,
        history: &[u32],
        batch: Option<(&Self::Tensor, usize)>,
        penalty: f32,
        last_n: usize,
    ) {
        super::composed::note::<Self>("penalize");
        record(self, || {
            let (n, cols) = self.shape(x);
            let ids: Vec<u32> = match batch {
                Some((b, col)) => {
                    let (b_rows, b_cols) = self.shape(b);
                    shapes_agree(col < b_cols && b_rows >= n, "penalize", || {
                        format!("column {col} of a {b_rows}x{b_cols} batch for {n} rows")
                    })?;
                    let all = self.read_blocking(b)?;
                    (0..n).map(|r| all[r * b_cols + col] as u32).collect()
                }
                None => {
                    shapes_agree(n <= 1, "penalize", || {
                        format!("{n} rows of logits need their batch")
                    })?;
                    Vec::new()
                }
            };
            let mut v = self.read_blocking(x)?;
            host_ops::penalize_rows(&mut v, cols, history, &ids, penalty, last_n);
            self.write(x, &v);
            Ok(())
        });
    }

    /// Seeded sampling of one token per row of logits `x` (`n x cols`), as
    /// f32 ids down column `col` of `out` from row `row`: row `r` draws
    /// [`sample_index`] over its candidates with the uniform
    /// [`seeded_uniform`]`(p.seed, counter + r)`. The candidates are the
    /// row's top-k ([`Self::top_k`], sorted) when `p.top_k > 0`, else the
    /// whole row in index order, where top-p does not apply: the draw
    /// follows [`crate::sampling::Sampler::distribution`] when
    /// [`crate::sampling::samples_on_device`] holds. `p.repeat_penalty` is
    /// ignored ([`Self::penalize`] applies it).
    /// [`host_ops::sample_rows`] is the reference and the default.
    ///
    /// [`sample_index`]: crate::sampling::sample_index
    /// [`seeded_uniform`]: crate::sampling::seeded_uniform
    fn sample_to(
        &self,
        x: &Self::Tensor,
        p: &SamplingParams,
        counter: u64,
        out: &mut Self::Tensor,
        row: usize,
        col: usize,
    ) {
        super::composed::note::<Self>("sample_to");
        record(self, || {
            let ((n, cols), (o_rows, o_cols)) = (self.shape(x), self.shape(out));
            shapes_agree(row + n <= o_rows && col < o_cols, "sample_to", || {
                format!("{n} rows into column {col} of a {o_rows}x{o_cols} tensor from row {row}")
            })?;
            let picks = host_ops::sample_rows(&self.read_blocking(x)?, cols, p, counter);
            let mut o = self.read_blocking(out)?;
            for (r, id) in picks.into_iter().enumerate() {
                o[(row + r) * o_cols + col] = id;
            }
            self.write(out, &o);
            Ok(())
        });
    }
}
