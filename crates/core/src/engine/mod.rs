//! The step machine every front end drives: the CLI's `run` and `bench`,
//! the browser session and the server hold [`Sequence`]s and call
//! [`Engine::step`] until each is finished, reading tokens from the events.
//!
//! A step advances every active sequence once: a sequence whose prompt is
//! not in memory yet is prefilled (and emits its first token); one whose
//! policy drafts runs one speculative round on its own ([`round`]); the
//! rest take one plain step together, in one batched target pass where the
//! backend holds its tensors in host memory (each weight read once for all
//! of them, each row attending over its own sequence's memory, the same
//! logits as alone). Sequences may join and leave between steps.
//!
//! Where steps are batched, a sequence speculates only while it decodes
//! alone: a round serves one sequence while the others wait for it, and one
//! batched pass gives every sequence a token for about the cost of one
//! (measured with `examples/serve_vs_llamacpp.py`: Qwen2.5-Coder-0.5B with
//! its drafter at 4 and 8 clients streamed 33 tokens/s with rounds among
//! the batch against 66 and 91 without).
//!
//! Models are shared: the engine and every drafter refer to weights behind
//! `Arc`, and a sequence owns only what one request needs.

mod batch;
mod held;
mod memory;
mod round;
mod sequence;

pub use held::Held;
pub use memory::{Checkpoint, SequenceMemory};
pub use sequence::Sequence;

use crate::backend::Backend;
use crate::error::ModelError;
use crate::generate::StopReason;
use crate::model::{BatchState, Decoder, DecoderState, Taps};
use crate::sampling::{Sampler, TokenLogprobs};
use crate::speculative::{DraftPolicy, Drafter, RoundStats, SpecStats};
use std::sync::Arc;

/// What a step did for one sequence, in order.
#[derive(Debug)]
pub enum Event {
    /// A token, in output order (an end-of-generation token is not one).
    Token(u32),
    /// The log-probabilities of the token that follows, for a sequence
    /// made [`Sequence::with_logprobs`].
    Logprobs(TokenLogprobs),
    /// A speculative round's or a plain step's figures (sequences with a
    /// drafter only).
    Round(RoundStats),
    Finished(StopReason),
    /// The sequence failed and is finished; others go on.
    Failed(ModelError),
}

/// Steps sequences of one target model.
pub struct Engine<B: Backend> {
    target: Arc<Decoder<B>>,
    /// Activations of batched plain steps, sized to the most sequences
    /// seen in one.
    batch: Option<BatchState<B>>,
    /// Taps of batched plain steps, for the drafters that read them.
    batch_taps: Option<Taps<B>>,
    /// Batched target passes so far, and the sequence steps they carried.
    batched_passes: usize,
    batched_steps: usize,
    /// Whether sequences may speculate while others decode beside them.
    rounds_among_batch: bool,
}

impl<B: Backend> Engine<B> {
    pub fn new(target: Arc<Decoder<B>>) -> Self {
        Engine {
            target,
            batch: None,
            batch_taps: None,
            batched_passes: 0,
            batched_steps: 0,
            rounds_among_batch: false,
        }
    }

    /// Lets sequences speculate while others decode beside them (each
    /// round alone, the others batched): tests of the two interleaved.
    pub fn with_rounds_among_batch(mut self) -> Self {
        self.rounds_among_batch = true;
        self
    }

    /// Batched target passes so far, and the plain steps of sequences they
    /// carried (the rest stepped alone).
    pub fn batched(&self) -> (usize, usize) {
        (self.batched_passes, self.batched_steps)
    }

    pub fn target(&self) -> &Arc<Decoder<B>> {
        &self.target
    }

    /// Advances every sequence of `seqs` that is not finished by one step;
    /// returns the events of each, tagged with its index in `seqs`. An
    /// error of one sequence finishes it with [`Event::Failed`]; an error
    /// of a batched pass, which leaves every sequence in it as it was, is
    /// returned.
    pub async fn step(
        &mut self,
        seqs: &mut [Sequence<'_, B>],
    ) -> Result<Vec<(usize, Event)>, ModelError> {
        let target = self.target.clone();
        let active = seqs.iter().filter(|s| !s.is_finished()).count();
        let batching = active > 1 && target.backend.host_memory();
        let decoding = seqs.iter().filter(|s| s.is_decoding()).count();
        let no_rounds = batching && decoding > 1 && !self.rounds_among_batch;
        let mut events = Vec::new();
        let mut plain = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            if seq.is_finished() {
                continue;
            }
            if no_rounds {
                seq.plan_plain();
            }
            if batching && seq.takes_a_plain_step() {
                plain.push(i);
                continue;
            }
            step_alone(&target, seq, i, &mut events).await;
        }
        match plain[..] {
            [] => {}
            [i] => step_alone(&target, &mut seqs[i], i, &mut events).await,
            _ => self.plain_batch(seqs, &plain, &mut events).await?,
        }
        Ok(events)
    }
}

async fn step_alone<B: Backend>(
    target: &Decoder<B>,
    seq: &mut Sequence<'_, B>,
    index: usize,
    events: &mut Vec<(usize, Event)>,
) {
    let mut own = Vec::new();
    if let Err(e) = seq.step_alone(target, &mut own).await {
        seq.fail();
        own.push(Event::Failed(e));
    }
    events.extend(own.into_iter().map(|e| (index, e)));
}

/// Generates up to `max_tokens` tokens after `prompt` with speculative
/// decoding: one [`Sequence`] driven alone, on the caller's state, drafter,
/// policy and sampler. At temperature 0 the output is token-identical to
/// [`crate::generate::generate`]; at temperature > 0 it follows the
/// target's distribution, and a seed gives the text plain decoding gives.
/// `on_round` sees each round's statistics as it happens.
#[allow(clippy::too_many_arguments)]
pub async fn generate_speculative<'a, B: Backend>(
    target: &Decoder<B>,
    state: &'a mut DecoderState<B>,
    drafter: &'a mut dyn Drafter<B>,
    policy: &'a mut DraftPolicy,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &'a mut Sampler,
    is_eog: &'a dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
    on_round: &mut dyn FnMut(&RoundStats),
) -> Result<(Vec<u32>, StopReason, SpecStats), ModelError> {
    let mut seq = Sequence::new(
        Held::Borrowed(state),
        prompt,
        max_tokens,
        Held::Borrowed(sampler),
        is_eog,
    )
    .with_drafter(Held::Borrowed(drafter), Held::Borrowed(policy));
    let (tokens, reason) = seq.run_alone(target, on_token, on_round).await?;
    Ok((tokens, reason, seq.stats().clone()))
}
