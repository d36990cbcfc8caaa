//! The KV cache's appends and attention over it.

use super::{AttentionMask, AttentionParams, ElementwiseOps};

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
