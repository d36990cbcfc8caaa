//! Proposers: everything that drafts tokens for the target to verify.
//!
//! One interface serves block drafters (DFlash), a classic draft model and
//! n-gram prompt lookup, so the engine, verifier and policy are shared.

mod dflash;
mod dflash2;
mod dfly;
mod draft_model;
mod dspark;
mod ngram;
mod oracle;
mod shared;

pub use dflash::{DFlashConfig, DFlashDrafter, DFlashModel, DFlashVariant};
pub use dflash2::{DFlash2Config, Lattice};
pub use dfly::DFlyConfig;
pub use draft_model::{DraftModelDrafter, CATCH_UP_WINDOW};
pub use ngram::NgramDrafter;
pub use oracle::{error_rate_for_tau, ForcedDrafter, OracleDrafter};
pub use shared::SharedDrafter;

use crate::backend::Backend;
use crate::error::ModelError;

/// Tokens proposed for one round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    /// The drafter's most likely tokens, at any temperature: the verifier
    /// accepts by matching the target's samples ([`super::verifier`]).
    pub tokens: Vec<u32>,
}

/// `propose` and `observe` may read back from the device, so they are
/// async; their futures need not be `Send` (wasm's are not).
#[async_trait::async_trait(?Send)]
pub trait Drafter<B: Backend>: Send {
    /// Short name for statistics (`dflash`, `draft-model`, `ngram`).
    fn kind(&self) -> &'static str;

    /// Target layers whose hidden states the drafter consumes (see
    /// [`crate::model::Taps`]); empty when it needs none.
    fn tap_layers(&self) -> &[usize] {
        &[]
    }

    /// Most tokens one round can draft (a block drafter's block size − 1).
    fn max_draft(&self) -> usize {
        usize::MAX
    }

    /// Called after every target forward pass with the rows that are now
    /// committed: their tokens, first position and (when [`Self::tap_layers`]
    /// is non-empty) the captured hidden states, of which the first
    /// `tokens.len()` rows are used. Drafters without per-position state
    /// ignore it.
    async fn observe(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        taps: Option<&B::Tensor>,
    ) -> Result<(), ModelError> {
        let _ = (tokens, pos0, taps);
        Ok(())
    }

    /// Brings the drafter's own cache up to date with `history` before a
    /// draft, short of the last few tokens that a draft processes anyway,
    /// feeding at most `most` of the tokens it is behind (oldest first);
    /// returns how many tokens it processed. The engine times this apart
    /// from drafting: a drafter that was idle while speculation was off
    /// pays once for every token it missed, which says nothing about what
    /// its drafts cost.
    fn catch_up(&mut self, history: &[u32], most: usize) -> Result<usize, ModelError> {
        let _ = (history, most);
        Ok(0)
    }

    /// Tokens a full [`Self::catch_up`] would process now, where the drafter
    /// can catch up in parts (a draft model's prefill): the engine then
    /// drafts only once it is 0, and feeds the catch-up in parts the
    /// policy can afford ([`super::DraftPolicy::catch_up_allowance`]). 0
    /// for a drafter whose catch-up is one cheap step.
    fn lag(&self, history: &[u32]) -> usize {
        let _ = history;
        0
    }

    /// Drafts up to `n_max` tokens following `history` (every committed
    /// token; the last one is not yet in the target's cache): its most
    /// likely ones, at any temperature.
    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError>;

    /// Greedy drafting that never leaves the device: drafts up to `n_max`
    /// tokens after `history` as f32 ids down column 0 of `round` from row
    /// 1 (the engine then writes the anchor, the last token of `history`,
    /// to row 0; a drafter whose picks chain may write it there first) and
    /// returns how many. `None` when this drafter needs the host (the
    /// engine then calls [`Self::propose`]). At temperature > 0 (on a
    /// device backend) the engine accepts them by matching the target's
    /// samples.
    fn propose_on_device(
        &mut self,
        history: &[u32],
        n_max: usize,
        round: &mut B::Tensor,
    ) -> Result<Option<usize>, ModelError> {
        let _ = (history, n_max, round);
        Ok(None)
    }

    /// Forgets everything about positions from `len` on.
    fn rollback(&mut self, len: usize) -> Result<(), ModelError> {
        let _ = len;
        Ok(())
    }
}
