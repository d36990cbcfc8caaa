//! The speculative round loop, generic over backend and drafter.

use super::policy::DraftPolicy;
use super::proposer::Drafter;
use super::verifier::{verify_by_matching, verify_greedy, verify_rejection, Verdict};
use crate::backend::{check_device, Backend};
use crate::error::ModelError;
use crate::generate::{next_token, penalize, StopReason};
use crate::model::{Decoder, DecoderState, LogitRows, Taps};
use crate::sampling::{argmax, samples_on_device, Distribution, Sampler};
use web_time::Instant;

/// One round, as reported to the caller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundStats {
    pub drafted: usize,
    pub accepted: usize,
    /// Tokens the drafter caught up on before drafting, and the time it
    /// took ([`super::Drafter::catch_up`]).
    pub caught_up: usize,
    pub catch_up_seconds: f64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Whether the policy drafted to explore ([`DraftPolicy::probing`]).
    pub probe: bool,
}

/// Totals of a speculative generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    pub drafter: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Verify passes that carried a draft.
    pub rounds: usize,
    /// Target passes without a draft (policy off, or nothing proposed).
    pub plain_steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Per draft slot: how often it was verified and accepted.
    pub slot_tried: Vec<usize>,
    pub slot_accepted: Vec<usize>,
    /// Drafting, catch-up excluded.
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Tokens the drafter caught up on, and the time it took.
    pub caught_up: usize,
    pub catch_up_seconds: f64,
    /// Rounds the policy drafted to explore, the tokens they committed and
    /// their draft and verify time (catch-up excluded).
    pub probes: usize,
    pub probe_tokens: usize,
    pub probe_seconds: f64,
}

impl SpecStats {
    /// τ: tokens committed per speculative round (accepted + 1).
    pub fn tau(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }

    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            return 0.0;
        }
        self.accepted as f64 / self.drafted as f64
    }

    /// Tokens per second after the first token.
    pub fn decode_tokens_per_second(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds
        } else {
            0.0
        }
    }

    /// Seconds the probes lost against plain steps of `plain_step` seconds
    /// (negative where they won), catch-up excluded.
    pub fn probe_loss_seconds(&self, plain_step: f64) -> f64 {
        self.probe_seconds - self.probe_tokens as f64 * plain_step
    }

    fn record_round(&mut self, r: &RoundStats) {
        if r.drafted == 0 {
            self.plain_steps += 1;
        } else {
            self.rounds += 1;
        }
        self.drafted += r.drafted;
        self.accepted += r.accepted;
        self.draft_seconds += r.draft_seconds;
        self.verify_seconds += r.verify_seconds;
        self.caught_up += r.caught_up;
        self.catch_up_seconds += r.catch_up_seconds;
        if r.probe {
            self.probes += 1;
            self.probe_tokens += r.accepted + 1;
            self.probe_seconds += r.draft_seconds + r.verify_seconds;
        }
        if self.slot_tried.len() < r.drafted {
            self.slot_tried.resize(r.drafted, 0);
            self.slot_accepted.resize(r.drafted, 0);
        }
        for i in 0..r.drafted.min(r.accepted + 1) {
            self.slot_tried[i] += 1;
            if i < r.accepted {
                self.slot_accepted[i] += 1;
            }
        }
    }
}

/// The sampler's choice for every verify row, as the verifier needs it.
async fn accept<B: Backend>(
    be: &B,
    logits: &B::Tensor,
    history: &[u32],
    draft: &super::Draft,
    sampler: &mut Sampler,
    n_vocab: usize,
) -> Verdict {
    let penalized = sampler.params.repeat_penalty != 1.0;
    if sampler.params.is_greedy() && !penalized {
        return verify_greedy(&be.argmax(logits).await, &draft.tokens);
    }
    let rows = be.read(logits).await;
    let mut ctx = history.to_vec();
    let mut choices = Vec::new();
    let mut dists: Vec<Distribution> = Vec::new();
    for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
        let mut row = row.to_vec();
        sampler.penalize(&mut row, &ctx);
        if sampler.params.is_greedy() {
            choices.push(argmax(&row));
        } else {
            dists.push(sampler.distribution(&row));
        }
        if let Some(&d) = draft.tokens.get(i) {
            ctx.push(d);
        }
    }
    if sampler.params.is_greedy() {
        return verify_greedy(&choices, &draft.tokens);
    }
    match &draft.probs {
        Some(q) => verify_rejection(&dists, &draft.tokens, q, &mut sampler.rng),
        None => verify_by_matching(&dists, &draft.tokens, &mut sampler.rng),
    }
}

/// Generates up to `max_tokens` tokens after `prompt` with speculative
/// decoding. At temperature 0 the output is token-identical to
/// [`crate::generate::generate`]; at temperature > 0 it follows the
/// target's distribution. `draft_sampler` (a separate RNG stream) lets
/// drafters sample at temperature > 0. `on_round` sees each round's
/// statistics as it happens.
#[allow(clippy::too_many_arguments)]
pub async fn generate_speculative<B: Backend>(
    target: &Decoder<B>,
    state: &mut DecoderState<B>,
    drafter: &mut dyn Drafter<B>,
    policy: &mut DraftPolicy,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    draft_sampler: &mut Sampler,
    is_eog: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
    on_round: &mut dyn FnMut(&RoundStats),
) -> Result<(Vec<u32>, StopReason, SpecStats), ModelError> {
    let be = &*target.backend;
    let cfg = &target.config;
    let mut stats = SpecStats {
        drafter: drafter.kind().to_string(),
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let mut out = Vec::new();
    if max_tokens == 0 {
        return Ok((out, StopReason::Length, stats));
    }
    if prompt.is_empty() {
        return Err(ModelError::Usage("the prompt is empty".into()));
    }
    let mut taps = match drafter.tap_layers() {
        [] => None,
        layers => Some(Taps::new(be, cfg, layers, state.max_batch())?),
    };

    // Prefill; the drafter sees every chunk's rows.
    let t0 = Instant::now();
    let chunks: Vec<&[u32]> = prompt.chunks(state.max_batch()).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let pos = state.len();
        let logits = if i + 1 == chunks.len() {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        target.forward(state, chunk, logits, true, taps.as_mut())?;
        drafter
            .observe(chunk, pos, taps.as_ref().map(Taps::output))
            .await?;
    }
    let mut history = prompt.to_vec();
    let mut picked = be.tensor(1, 1);
    let first = next_token(be, state, sampler, &history, &mut picked).await;
    check_device(be)?;
    stats.prefill_seconds = t0.elapsed().as_secs_f64();

    // Rounds of drafters that can draft on the device keep every id there:
    // column 0 of `round` holds the verify batch [anchor, drafts], column 1
    // the target's choices (argmax, or a seeded sample), and it is the
    // round's one readback. At temperature > 0 the greedy drafts are then
    // accepted by target-sample matching, worth it only where readbacks
    // cost something.
    let on_device =
        samples_on_device(&sampler.params) && (sampler.params.is_greedy() || !be.host_memory());
    let mut round = be.tensor(state.max_batch(), 2);
    let mut anchor = be.tensor(1, 1);

    let t_decode = Instant::now();
    let mut pending = vec![first];
    let reason = 'outer: loop {
        for t in pending.drain(..) {
            if is_eog(t) {
                break 'outer StopReason::EndOfGeneration;
            }
            out.push(t);
            history.push(t);
            if !on_token(t) {
                break 'outer StopReason::Caller;
            }
            if out.len() >= max_tokens {
                break 'outer StopReason::Length;
            }
        }
        let pos = state.len();
        let room = state.kv.capacity().saturating_sub(pos + 1);
        let want = policy
            .next_len(drafter.max_draft())
            .min(max_tokens - out.len() - 1)
            .min(room)
            .min(state.logit_rows() - 1);

        let last = *history.last().expect("history holds the prompt");
        let tc = Instant::now();
        let caught_up = if want > 0 {
            drafter.catch_up(&history)?
        } else {
            0
        };
        let catch_up_seconds = tc.elapsed().as_secs_f64();
        let td = Instant::now();
        let device_draft = if !on_device {
            None
        } else if want == 0 {
            Some(0)
        } else if want >= policy.config.n_min.max(1) {
            be.reshape(&mut round, want + 1, 2);
            drafter
                .propose_on_device(&history, want, &mut round)?
                .filter(|&n| n >= policy.config.n_min && n <= want)
        } else {
            None
        };
        let (batch, draft, verdict, draft_seconds, tv) = if let Some(n) = device_draft {
            // On a backend that records and submits at the readback, the
            // draft's execution time lands in the verify time: the policy
            // then sees drafting as nearly free and verify as dearer, which
            // errs towards shorter drafts.
            let draft_seconds = td.elapsed().as_secs_f64();
            let tv = Instant::now();
            be.write(&mut anchor, &[last as f32]);
            be.copy_rows(&anchor, 0, &mut round, 0, 0, 1);
            target.forward_device(state, &round, 0, n + 1, LogitRows::All, true, taps.as_mut())?;
            penalize(
                be,
                state.logits_mut(),
                &history,
                Some((&round, 0)),
                &sampler.params,
            );
            if sampler.params.is_greedy() {
                be.argmax_to(state.logits(), &mut round, 0, 1);
            } else {
                // The row at position q draws the number of (seed, q): a
                // row after the first mismatch decided nothing, so its
                // number is still fresh when q is drawn again next round,
                // and the output is the target's whatever the drafts.
                let p = &sampler.params;
                be.sample_to(state.logits(), p, pos as u64, &mut round, 0, 1);
            }
            be.reshape(&mut round, n + 1, 2);
            let ids: Vec<u32> = be.read(&round).await.iter().map(|&v| v as u32).collect();
            let batch: Vec<u32> = ids.iter().step_by(2).copied().collect();
            let choices: Vec<u32> = ids.iter().skip(1).step_by(2).copied().collect();
            let draft = super::Draft {
                tokens: batch[1..].to_vec(),
                probs: None,
            };
            let verdict = verify_greedy(&choices, &draft.tokens);
            (batch, draft, verdict, draft_seconds, tv)
        } else {
            let mut draft = if want > 0 {
                let s = (!sampler.params.is_greedy()).then_some(&mut *draft_sampler);
                drafter.propose(&history, want, s).await?
            } else {
                Default::default()
            };
            draft.tokens.truncate(want);
            if let Some(p) = draft.probs.as_mut() {
                p.truncate(want);
            }
            if draft.tokens.len() < policy.config.n_min {
                draft = Default::default();
            }
            let draft_seconds = td.elapsed().as_secs_f64();

            let tv = Instant::now();
            let mut batch = Vec::with_capacity(draft.tokens.len() + 1);
            batch.push(last);
            batch.extend_from_slice(&draft.tokens);
            target.forward(state, &batch, LogitRows::All, true, taps.as_mut())?;
            let verdict = accept(be, state.logits(), &history, &draft, sampler, cfg.n_vocab).await;
            (batch, draft, verdict, draft_seconds, tv)
        };
        check_device(be)?;
        state.truncate(pos + 1 + verdict.accepted);
        drafter
            .observe(
                &batch[..1 + verdict.accepted],
                pos,
                taps.as_ref().map(Taps::output),
            )
            .await?;
        drafter.rollback(state.len());
        let verify_seconds = tv.elapsed().as_secs_f64();

        let round = RoundStats {
            drafted: draft.tokens.len(),
            accepted: verdict.accepted,
            caught_up,
            catch_up_seconds,
            draft_seconds,
            verify_seconds,
            probe: !draft.tokens.is_empty() && policy.probing(),
        };
        policy.record(want, &round);
        stats.record_round(&round);
        on_round(&round);
        pending = verdict.tokens;
    };
    stats.generated_tokens = out.len();
    stats.decode_seconds = t_decode.elapsed().as_secs_f64();
    Ok((out, reason, stats))
}
