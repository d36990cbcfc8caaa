//! A classic draft model: a smaller model of the same vocabulary decodes
//! the draft token by token.

use super::{Draft, Drafter};
use crate::backend::Backend;
use crate::engine::{Checkpoint, SequenceMemory};
use crate::error::ModelError;
use crate::model::{Decoder, DecoderState, LogitRows};
use std::sync::Arc;

/// Most tokens one catch-up feeds: after a long gap (speculation off) the
/// model skips to the last this many committed tokens, so that a probe
/// costs a bounded prefill however long it was off.
pub const CATCH_UP_WINDOW: usize = 16;

pub struct DraftModelDrafter<B: Backend> {
    model: Arc<Decoder<B>>,
    state: DecoderState<B>,
    /// Committed tokens skipped by catch-ups: cache position p holds the
    /// token at history index p + skipped (the model sees the window right
    /// after what it saw before the gap).
    skipped: usize,
    /// Whether the first catch-up (of the prompt) is complete: until then
    /// it goes on over one batch of the prompt, in the parts the policy
    /// affords, rather than skipping to a gap's window.
    primed: bool,
    /// Where the drafts of the last proposal began.
    drafting: Option<Checkpoint>,
}

impl<B: Backend> DraftModelDrafter<B> {
    /// Fails unless `model` shares the target's vocabulary size.
    pub fn new(
        model: Arc<Decoder<B>>,
        target_vocab: usize,
        n_ctx: usize,
    ) -> Result<Self, ModelError> {
        if model.config.n_vocab != target_vocab {
            return Err(ModelError::Usage(format!(
                "the draft model's vocabulary ({}) differs from the target's ({target_vocab})",
                model.config.n_vocab
            )));
        }
        let state = model.new_state(n_ctx, 256);
        Ok(DraftModelDrafter {
            model,
            state,
            skipped: 0,
            primed: false,
            drafting: None,
        })
    }

    /// How many tokens of `history` the cache holds, not counting drafts
    /// at or beyond `history.len() − 1`.
    fn seen_len(&self, history: &[u32]) -> usize {
        (self.state.len() + self.skipped).min(history.len().saturating_sub(1))
    }

    /// Forgets the cached drafts beyond [`Self::seen_len`].
    fn forget_drafts(&mut self, history: &[u32]) -> Result<(), ModelError> {
        let seen = self.seen_len(history);
        self.rewind(seen.saturating_sub(self.skipped))
    }

    /// Goes back to `len` positions: for a hybrid draft model, within the
    /// rows drafted since [`Self::drafting`]'s checkpoint.
    fn rewind(&mut self, len: usize) -> Result<(), ModelError> {
        match self.drafting.take() {
            Some(at) if len >= at.len() => self.state.commit(at, len - at.len()),
            _ => self.state.truncate(len),
        }
    }

    /// The committed tokens before `upto` that this model has not seen, at
    /// most the last `window` of them, as a range of `history`.
    fn unseen(&self, history: &[u32], upto: usize, window: usize) -> std::ops::Range<usize> {
        let seen = self.seen_len(history);
        if upto <= seen {
            return seen..seen;
        }
        seen.max(upto - window.min(upto))..upto
    }

    /// Feeds `range` of `history` (from [`Self::unseen`], drafts
    /// forgotten), at most `most` tokens of it, oldest first; returns how
    /// many it fed.
    fn feed(
        &mut self,
        history: &[u32],
        range: std::ops::Range<usize>,
        most: usize,
    ) -> Result<usize, ModelError> {
        let seen = self.state.len() + self.skipped;
        self.skipped += range.start - seen.min(range.start);
        let to = range.end.min(range.start.saturating_add(most));
        for chunk in history[range.start..to].chunks(self.state.max_batch()) {
            self.model
                .forward(&mut self.state, chunk, LogitRows::Last, true, None)?;
        }
        Ok(to - range.start)
    }

    /// Where a catch-up feeds up to, and over how wide a window.
    fn catch_up_span(&self, history: &[u32]) -> (usize, usize) {
        let upto = history
            .len()
            .saturating_sub(2)
            .min(self.state.kv.capacity());
        let window = if self.primed {
            CATCH_UP_WINDOW
        } else {
            self.state.max_batch()
        };
        (upto, window)
    }

    /// Feeds every committed token this model has not seen, leaving the
    /// logits of the last one; returns how many tokens may be drafted.
    fn feed_unseen(&mut self, history: &[u32], n_max: usize) -> Result<usize, ModelError> {
        let n_ctx = self.state.kv.capacity();
        let n_max = n_max.min(n_ctx.saturating_sub(history.len()));
        if n_max > 0 {
            self.forget_drafts(history)?;
            let range = self.unseen(history, history.len(), usize::MAX);
            self.feed(history, range, usize::MAX)?;
            self.primed = true;
            // The drafts are taken back at the next round.
            self.drafting = Some(self.state.checkpoint());
        }
        Ok(n_max)
    }
}

#[async_trait::async_trait(?Send)]
impl<B: Backend> Drafter<B> for DraftModelDrafter<B> {
    fn kind(&self) -> &'static str {
        "draft-model"
    }

    /// Feeds all but the last two committed tokens, at most the last
    /// [`CATCH_UP_WINDOW`] of them: a round after a fully accepted one
    /// leaves the model two behind, and its draft takes both in one batch,
    /// so a steady round's cost stays in the draft. The first catch-up
    /// reads up to one batch of the prompt, whose context a draft model's
    /// acceptance rests on, in as many parts as the policy needs to afford
    /// it.
    fn catch_up(&mut self, history: &[u32], most: usize) -> Result<usize, ModelError> {
        let (upto, window) = self.catch_up_span(history);
        self.forget_drafts(history)?;
        let range = self.unseen(history, upto, window);
        let fed = self.feed(history, range.clone(), most)?;
        if fed == range.len() {
            self.primed = true;
        }
        Ok(fed)
    }

    fn lag(&self, history: &[u32]) -> usize {
        let (upto, window) = self.catch_up_span(history);
        self.unseen(history, upto, window).len()
    }

    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError> {
        let n_max = self.feed_unseen(history, n_max)?;
        if n_max == 0 {
            return Ok(Draft::default());
        }
        let be = &*self.model.backend;
        let mut tokens = Vec::with_capacity(n_max);
        loop {
            let next = be.argmax(self.state.logits()).await[0];
            tokens.push(next);
            if tokens.len() == n_max {
                break;
            }
            self.model
                .forward(&mut self.state, &[next], LogitRows::Last, true, None)?;
        }
        Ok(Draft { tokens })
    }

    fn propose_on_device(
        &mut self,
        history: &[u32],
        n_max: usize,
        round: &mut B::Tensor,
    ) -> Result<Option<usize>, ModelError> {
        let n = self.feed_unseen(history, n_max)?;
        if n == 0 {
            return Ok(None);
        }
        // Each draft is embedded straight from the row its argmax went to.
        for i in 1..=n {
            self.model
                .backend
                .argmax_to(self.state.logits(), round, i, 0);
            if i < n {
                self.model.forward_device(
                    &mut self.state,
                    round,
                    i,
                    1,
                    LogitRows::Last,
                    true,
                    None,
                )?;
            }
        }
        Ok(Some(n))
    }

    fn rollback(&mut self, len: usize) -> Result<(), ModelError> {
        self.rewind(len.saturating_sub(self.skipped))
    }
}
