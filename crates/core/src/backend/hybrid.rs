//! Ops of hybrid (Qwen3.5-family) blocks: the gated DeltaNet's causal
//! convolution and delta rule, and gated attention's head split and
//! sigmoid gate. [`crate::host_ops`] holds the reference of each.
//!
//! A backend that does not implement them keeps the defaults, which
//! record [`BackendError::Unsupported`]; [`HybridOps::runs_hybrid_blocks`]
//! lets a loader refuse a hybrid model up front instead.

use super::{BackendError, DeltaNetParams, Device};

pub trait HybridOps: Device {
    /// Whether this backend implements every op of the family.
    fn runs_hybrid_blocks(&self) -> bool {
        false
    }

    /// Causal depthwise convolution of `x` (`n x c`) continued from
    /// `state` (`(k − 1) x c`: the inputs before row 0, oldest first), then
    /// SiLU into `out` (`n x c`); `state` becomes the last `k − 1` inputs.
    /// `weight` is a `{k, c}` tensor: channel `ch`'s taps at `ch·k..`, the
    /// last one applied to the newest row.
    fn causal_conv_silu(
        &self,
        x: &Self::Tensor,
        weight: &Self::Weight,
        state: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        let _ = (x, weight, state, out);
        unsupported(self, "causal_conv_silu");
    }

    /// The gated delta rule over the rows of `x` (`n x p.input_dim()`:
    /// queries, keys, values), in order, from `state` (`p.state_shape()`)
    /// to the state after the last row. Per row and value head `h` (key
    /// head `h mod n_k_heads`): `q`, `k` L2-normalised (floor `eps`) and
    /// `q /= √k_dim`; decay `g = softplus(alpha[h] + dt_bias[h]) · a[h]`,
    /// `β = sigmoid(beta[h])`; with the head's state `S` (`k_dim x v_dim`):
    /// `S ← e^g·S`, `d = β·(v − Sᵀk)`, `S ← S + k·dᵀ`, output row `Sᵀq`
    /// into `out` (`n x n_v_heads·v_dim`).
    /// `alpha` and `beta` are `n x n_v_heads`; `dt_bias` and `a` hold
    /// `n_v_heads` values. The state before the first row is `from`'s
    /// where given (which is left as it is), else `state`'s own: a
    /// checkpointed state is read without being copied.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        x: &Self::Tensor,
        alpha: &Self::Tensor,
        beta: &Self::Tensor,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
        from: Option<&Self::Tensor>,
        state: &mut Self::Tensor,
        out: &mut Self::Tensor,
        p: DeltaNetParams,
    ) {
        let _ = (x, alpha, beta, dt_bias, a, from, state, out, p);
        unsupported(self, "gated_delta_rule");
    }

    /// Splits each `2·d`-wide head of `x`'s rows into its first half
    /// (`first`) and its second (`second`): gated attention's queries and
    /// gates, which `attn_q` yields interleaved head by head.
    fn split_heads(
        &self,
        x: &Self::Tensor,
        d: usize,
        first: &mut Self::Tensor,
        second: &mut Self::Tensor,
    ) {
        let _ = (x, d, first, second);
        unsupported(self, "split_heads");
    }

    /// `x *= sigmoid(gate)`, element by element.
    fn sigmoid_mul(&self, x: &mut Self::Tensor, gate: &Self::Tensor) {
        let _ = (x, gate);
        unsupported(self, "sigmoid_mul");
    }
}

fn unsupported<B: Device + ?Sized>(be: &B, op: &str) {
    be.record_error(BackendError::Unsupported {
        what: format!("{op} (hybrid model blocks) on {}", be.name()),
    });
}
