//! A drafter that knows the answer: it proposes a given continuation (the
//! target's own greedy output), corrupting each token with a chosen
//! probability. For benchmarks that measure the engine's overhead at a
//! forced acceptance length, and for tests that need every draft accepted
//! (error rate 0) or none (error rate 1). Not for real generation.

use super::{Draft, Drafter};
use crate::backend::Backend;
use crate::error::ModelError;
use crate::sampling::Rng;

pub struct OracleDrafter {
    /// The full sequence the target will produce: prompt + continuation.
    sequence: Vec<u32>,
    error_rate: f64,
    n_vocab: u32,
    rng: Rng,
}

impl OracleDrafter {
    pub fn new(sequence: Vec<u32>, error_rate: f64, n_vocab: usize, seed: u64) -> Self {
        OracleDrafter {
            sequence,
            error_rate,
            n_vocab: n_vocab as u32,
            rng: Rng::new(seed),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl<B: Backend> Drafter<B> for OracleDrafter {
    fn kind(&self) -> &'static str {
        "oracle"
    }

    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError> {
        let from = history.len().min(self.sequence.len());
        let to = (from + n_max).min(self.sequence.len());
        let tokens = self.sequence[from..to]
            .iter()
            .map(|&t| {
                if self.rng.next_f64() < self.error_rate {
                    (t + 1) % self.n_vocab
                } else {
                    t
                }
            })
            .collect();
        Ok(Draft { tokens })
    }
}

/// Runs a real drafter for its cost but proposes the oracle's tokens, so a
/// benchmark sees the true draft time at a chosen acceptance length.
pub struct ForcedDrafter<B: Backend> {
    pub inner: Box<dyn Drafter<B>>,
    pub oracle: OracleDrafter,
}

#[async_trait::async_trait(?Send)]
impl<B: Backend> Drafter<B> for ForcedDrafter<B> {
    fn kind(&self) -> &'static str {
        "forced"
    }

    fn tap_layers(&self) -> &[usize] {
        self.inner.tap_layers()
    }

    fn max_draft(&self) -> usize {
        self.inner.max_draft()
    }

    async fn observe(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        taps: Option<&B::Tensor>,
    ) -> Result<(), ModelError> {
        self.inner.observe(tokens, pos0, taps).await
    }

    fn catch_up(&mut self, history: &[u32], most: usize) -> Result<usize, ModelError> {
        self.inner.catch_up(history, most)
    }

    fn lag(&self, history: &[u32]) -> usize {
        self.inner.lag(history)
    }

    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError> {
        self.inner.propose(history, n_max).await?;
        Drafter::<B>::propose(&mut self.oracle, history, n_max).await
    }

    fn rollback(&mut self, len: usize) -> Result<(), ModelError> {
        self.inner.rollback(len)
    }
}

/// The per-token error rate at which drafts of `k` tokens give an expected
/// `tau` (accepted + 1) per round: solves `1 + Σ_{j=1..k} (1−e)^j = tau`.
pub fn error_rate_for_tau(tau: f64, k: usize) -> f64 {
    let expected = |e: f64| 1.0 + (1..=k).map(|j| (1.0 - e).powi(j as i32)).sum::<f64>();
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if expected(mid) > tau {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_rate_matches_the_requested_tau() {
        let e = error_rate_for_tau(4.0, 7);
        let tau = 1.0 + (1..=7).map(|j| (1.0 - e).powi(j)).sum::<f64>();
        assert!((tau - 4.0).abs() < 1e-9);
        assert!(
            error_rate_for_tau(8.0, 7) < 1e-9,
            "tau = k + 1 needs no errors"
        );
        assert!(
            error_rate_for_tau(1.0, 7) > 1.0 - 1e-9,
            "tau = 1 needs every token wrong"
        );
    }
}
