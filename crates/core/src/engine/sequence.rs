//! One request: what it owns (target memory, drafter and its memory, taps,
//! samplers, policy, stop state, statistics), and how it advances by one
//! step on its own.

use super::{Event, Held};
use crate::backend::{check_device, Backend};
use crate::error::ModelError;
use crate::generate::{next_token, prefill, GenerationStats, StopReason};
use crate::model::{Decoder, DecoderState, LogitRows, Taps};
use crate::sampling::{samples_on_device, Sampler, TokenLogprobs};
use crate::speculative::{DraftPolicy, Drafter, SpecStats};
use web_time::Instant;

/// Where a sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The prompt is not in the target's memory yet.
    Prefill,
    Decode,
    Finished(StopReason),
}

/// What speculation adds to a sequence.
pub(super) struct Speculation<'a, B: Backend> {
    pub(super) drafter: Held<'a, dyn Drafter<B> + 'a>,
    pub(super) policy: Held<'a, DraftPolicy>,
    /// The target's hidden states the drafter reads, from the last pass.
    pub(super) taps: Option<Taps<B>>,
    /// Whether rounds keep their ids on the device (one readback each).
    pub(super) on_device: bool,
    /// Device rounds: column 0 the verify batch, column 1 the target's
    /// choices; and the anchor written into it.
    pub(super) round: Option<(B::Tensor, B::Tensor)>,
}

/// One request's generation: create it, hand it to
/// [`super::Engine::step`] (with others) until it is finished, read its
/// tokens from the events. Creating one uploads no weights: it allocates
/// its own memory (or borrows the caller's) and refers to shared models.
pub struct Sequence<'a, B: Backend> {
    pub(super) state: Held<'a, DecoderState<B>>,
    pub(super) sampler: Held<'a, Sampler>,
    pub(super) spec: Option<Speculation<'a, B>>,
    is_eog: Box<dyn Fn(u32) -> bool + 'a>,
    /// The prompt, then every token emitted.
    pub(super) history: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    pub(super) phase: Phase,
    /// The draft length the policy chose for the next round, when the
    /// engine asked before stepping ([`Self::plan`]).
    planned: Option<usize>,
    pub(super) stats: SpecStats,
    decode_started: Option<Instant>,
    /// One sampled id, read back from the device.
    picked: Option<B::Tensor>,
    /// How many alternatives each token's [`Event::Logprobs`] lists;
    /// `None`: no log-probabilities.
    pub(super) logprobs: Option<usize>,
}

impl<'a, B: Backend> Sequence<'a, B> {
    /// Plain decoding of up to `max_tokens` tokens after `prompt` (appended
    /// to what `state` already holds), chosen by `sampler`, stopping before
    /// a token `is_eog` accepts.
    pub fn new(
        state: Held<'a, DecoderState<B>>,
        prompt: &[u32],
        max_tokens: usize,
        sampler: Held<'a, Sampler>,
        is_eog: impl Fn(u32) -> bool + 'a,
    ) -> Self {
        Sequence {
            state,
            sampler,
            spec: None,
            is_eog: Box::new(is_eog),
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            max_tokens,
            phase: if max_tokens == 0 {
                Phase::Finished(StopReason::Length)
            } else {
                Phase::Prefill
            },
            planned: None,
            stats: SpecStats {
                prompt_tokens: prompt.len(),
                ..Default::default()
            },
            decode_started: None,
            picked: None,
            logprobs: None,
        }
    }

    /// Reports each token's log-probability and the `top` most likely
    /// tokens of its row (at most [`crate::sampling::MAX_TOP_LOGPROBS`]) as
    /// an [`Event::Logprobs`] before its [`Event::Token`]. Every row is
    /// then read back to the host (no device-resident rounds); the tokens
    /// are the same.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top.min(crate::sampling::MAX_TOP_LOGPROBS));
        self
    }

    /// Speculative decoding with `drafter` under `policy`: at temperature
    /// 0 the tokens are those of plain decoding, above it they follow the
    /// target's distribution, and a seed gives the text plain decoding
    /// gives.
    pub fn with_drafter(
        mut self,
        drafter: Held<'a, dyn Drafter<B> + 'a>,
        policy: Held<'a, DraftPolicy>,
    ) -> Self {
        self.stats.drafter = drafter.kind().to_string();
        self.spec = Some(Speculation {
            drafter,
            policy,
            taps: None,
            on_device: false,
            round: None,
        });
        self
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished(_))
    }

    /// Why it finished, once it has.
    pub fn finish_reason(&self) -> Option<StopReason> {
        match self.phase {
            Phase::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// The tokens emitted so far.
    pub fn tokens(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    /// The target memory and the tokens this sequence was given and made
    /// (its prompt, then its output; the memory holds the first
    /// `state.len()` of them after what it held before): what a server
    /// keeps to reuse a prompt's prefix.
    pub fn into_memory(self) -> (Held<'a, DecoderState<B>>, Vec<u32>) {
        (self.state, self.history)
    }

    /// Statistics so far (speculative fields stay 0 without a drafter).
    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    /// The same figures as plain decoding reports them.
    pub fn plain_stats(&self) -> GenerationStats {
        GenerationStats {
            prompt_tokens: self.stats.prompt_tokens,
            generated_tokens: self.stats.generated_tokens,
            prefill_seconds: self.stats.prefill_seconds,
            decode_seconds: self.stats.decode_seconds,
        }
    }

    /// Ends it at the caller's request (a stop string, a client gone):
    /// nothing more is computed for it.
    pub fn stop(&mut self) {
        if !self.is_finished() {
            self.close(StopReason::Caller);
        }
    }

    fn close(&mut self, reason: StopReason) {
        self.phase = Phase::Finished(reason);
        self.stats.generated_tokens = self.tokens().len();
        if let Some(t) = self.decode_started {
            self.stats.decode_seconds = t.elapsed().as_secs_f64();
        }
    }

    /// Emits `tokens` in order (each after its log-probabilities, where
    /// `logprobs` has them), finishing before an end-of-generation token or
    /// after the last one `max_tokens` allows.
    pub(super) fn emit(
        &mut self,
        tokens: &[u32],
        logprobs: Vec<TokenLogprobs>,
        events: &mut Vec<Event>,
    ) {
        let mut logprobs = logprobs.into_iter();
        for &t in tokens {
            let scored = logprobs.next();
            if (self.is_eog)(t) {
                self.close(StopReason::EndOfGeneration);
                events.push(Event::Finished(StopReason::EndOfGeneration));
                return;
            }
            self.history.push(t);
            events.extend(scored.map(Event::Logprobs));
            events.push(Event::Token(t));
            if self.tokens().len() >= self.max_tokens {
                self.close(StopReason::Length);
                events.push(Event::Finished(StopReason::Length));
                return;
            }
        }
    }

    /// Records a round that asked the drafter for `requested` tokens (0: a
    /// plain step): the policy learns from it, the statistics count it,
    /// and the caller sees it.
    pub(super) fn record_round(
        &mut self,
        requested: usize,
        round: crate::speculative::RoundStats,
        events: &mut Vec<Event>,
    ) {
        if let Some(spec) = self.spec.as_mut() {
            spec.policy.record(requested, &round);
        }
        self.stats.record_round(&round);
        events.push(Event::Round(round));
    }

    /// Ends it after an error of its own (the caller gets the error).
    pub(super) fn fail(&mut self) {
        self.close(StopReason::Caller);
    }

    /// The draft length of the next round (0: a plain step), asked of the
    /// policy once per round and bounded by the tokens left, the memory's
    /// room and the rows a verify pass may hold.
    pub(super) fn plan(&mut self) -> usize {
        if let Some(k) = self.planned {
            return k;
        }
        let left = self.max_tokens.saturating_sub(self.tokens().len() + 1);
        let room = self
            .state
            .kv
            .capacity()
            .saturating_sub(self.state.len() + 1);
        let rows = self.state.logit_rows() - 1;
        let k = match &mut self.spec {
            None => 0,
            Some(s) => {
                let lag = s.drafter.lag(&self.history);
                s.policy.set_round_context(left + 1, lag);
                s.policy
                    .next_len(s.drafter.max_draft())
                    .min(left)
                    .min(room)
                    .min(rows)
            }
        };
        self.planned = Some(k);
        k
    }

    /// Plans this round plain, without asking the policy, unless it is
    /// planned already.
    pub(super) fn plan_plain(&mut self) {
        if self.phase == Phase::Decode {
            self.planned.get_or_insert(0);
        }
    }

    /// Whether the prompt is in memory and tokens are being decoded.
    pub(super) fn is_decoding(&self) -> bool {
        self.phase == Phase::Decode
    }

    /// Takes the plan of this round (planning it now if the engine did
    /// not), so that the next round asks the policy again.
    pub(super) fn take_plan(&mut self) -> usize {
        let k = self.plan();
        self.planned = None;
        k
    }

    /// Advances by one step on its own: the prefill and first token, one
    /// plain step, or one speculative round.
    pub(crate) async fn step_alone(
        &mut self,
        target: &Decoder<B>,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        match self.phase {
            Phase::Finished(_) => Ok(()),
            Phase::Prefill => self.prefill(target, events).await,
            Phase::Decode if self.spec.is_none() => self.plain_step(target, events).await,
            Phase::Decode => self.round(target, events).await,
        }
    }

    /// The prompt in chunks of the state's batch (the drafter sees each
    /// chunk's rows), and the first token from its last row.
    async fn prefill(
        &mut self,
        target: &Decoder<B>,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        let be = &*target.backend;
        let t0 = Instant::now();
        let prompt = &self.history[..self.prompt_len];
        match &mut self.spec {
            None => prefill(target, &mut self.state, prompt)?,
            Some(spec) => {
                if prompt.is_empty() {
                    return Err(ModelError::Usage("the prompt is empty".into()));
                }
                let state = &mut *self.state;
                spec.taps = match spec.drafter.tap_layers() {
                    [] => None,
                    layers => Some(Taps::new(be, &target.config, layers, state.max_batch())?),
                };
                let chunks: Vec<&[u32]> = prompt.chunks(state.max_batch()).collect();
                for (i, chunk) in chunks.iter().enumerate() {
                    let pos = state.len();
                    let logits = if i + 1 == chunks.len() {
                        LogitRows::Last
                    } else {
                        LogitRows::None
                    };
                    target.forward(state, chunk, logits, true, spec.taps.as_mut())?;
                    spec.drafter
                        .observe(chunk, pos, spec.taps.as_ref().map(Taps::output))
                        .await?;
                }
                // Rounds of drafters that can draft on the device keep every
                // id there. At temperature > 0 the greedy drafts are then
                // accepted by target-sample matching, worth it only where
                // readbacks cost something.
                let p = &self.sampler.params;
                spec.on_device = samples_on_device(p)
                    && (p.is_greedy() || !be.host_memory())
                    && self.logprobs.is_none();
                if spec.on_device {
                    spec.round = Some((be.tensor(state.max_batch(), 2), be.tensor(1, 1)));
                }
            }
        }
        let (first, logprobs) = self.choose(target).await;
        check_device(be)?;
        self.stats.prefill_seconds = t0.elapsed().as_secs_f64();
        self.decode_started = Some(Instant::now());
        self.phase = Phase::Decode;
        self.emit(&[first], logprobs, events);
        Ok(())
    }

    /// One token without a drafter: the last token through the target, the
    /// next one chosen from its logits.
    async fn plain_step(
        &mut self,
        target: &Decoder<B>,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        let be = &*target.backend;
        let last = *self.history.last().expect("history holds the prompt");
        target.forward(&mut self.state, &[last], LogitRows::Last, true, None)?;
        let (token, logprobs) = self.choose(target).await;
        check_device(be)?;
        self.emit(&[token], logprobs, events);
        Ok(())
    }

    /// The token after the history from the state's last row of logits,
    /// with its log-probabilities when the sequence reports them.
    async fn choose(&mut self, target: &Decoder<B>) -> (u32, Vec<TokenLogprobs>) {
        let be = &*target.backend;
        let Some(top) = self.logprobs else {
            let picked = self.picked.get_or_insert_with(|| be.tensor(1, 1));
            let token = next_token(be, &mut self.state, &self.sampler, &self.history, picked).await;
            return (token, Vec::new());
        };
        let rows = be.read(self.state.logits()).await;
        let row = &rows[..target.config.n_vocab];
        let token = self.sampler.sample(row, &self.history);
        (token, vec![TokenLogprobs::from_logits(row, token, top)])
    }

    /// Drives it alone to the end: `on_token` sees each token and returns
    /// `false` to stop (it is not asked again), `on_round` each round's
    /// figures. Returns the tokens `on_token` saw and why it stopped.
    pub async fn run_alone(
        &mut self,
        target: &Decoder<B>,
        on_token: &mut dyn FnMut(u32) -> bool,
        on_round: &mut dyn FnMut(&crate::speculative::RoundStats),
    ) -> Result<(Vec<u32>, StopReason), ModelError> {
        let mut out = Vec::new();
        let mut events = Vec::new();
        loop {
            if let Some(reason) = self.finish_reason() {
                self.stats.generated_tokens = out.len();
                return Ok((out, reason));
            }
            if let Err(e) = self.step_alone(target, &mut events).await {
                self.fail();
                return Err(e);
            }
            for event in events.drain(..) {
                match event {
                    Event::Token(t) => {
                        out.push(t);
                        if !on_token(t) {
                            self.stop();
                            self.stats.generated_tokens = out.len();
                            return Ok((out, StopReason::Caller));
                        }
                    }
                    Event::Round(r) => on_round(&r),
                    Event::Logprobs(_) | Event::Finished(_) => {}
                    Event::Failed(e) => return Err(e),
                }
            }
        }
    }
}
