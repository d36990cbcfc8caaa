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

impl<B: Backend> Drafter<B> for OracleDrafter {
    fn kind(&self) -> &'static str {
        "oracle"
    }

    fn observe(&mut self, _: &[u32], _: usize, _: Option<&B::Tensor>) -> Result<(), ModelError> {
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        n_max: usize,
        _: Option<&mut crate::sampling::Sampler>,
    ) -> Result<Draft, ModelError> {
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
        Ok(Draft {
            tokens,
            probs: None,
        })
    }

    fn rollback(&mut self, _: usize) {}
}
