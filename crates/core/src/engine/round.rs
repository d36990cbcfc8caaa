//! One speculative round of one sequence: the drafter catches up and
//! drafts, the target verifies the draft in one pass, the verdict's rows
//! are committed to both memories. A draft of 0 tokens is a plain step
//! through the same path, so the drafter observes every committed row.

use super::memory::SequenceMemory;
use super::sequence::Sequence;
use super::Event;
use crate::backend::{check_device, Backend};
use crate::error::ModelError;
use crate::generate::penalize;
use crate::model::{Decoder, LogitRows, Taps};
use crate::sampling::TokenLogprobs;
use crate::speculative::verifier::{verdict_from_rows, verify_greedy, Verdict};
use crate::speculative::{Draft, RoundStats};
use web_time::Instant;

impl<B: Backend> Sequence<'_, B> {
    pub(super) async fn round(
        &mut self,
        target: &Decoder<B>,
        events: &mut Vec<Event>,
    ) -> Result<(), ModelError> {
        let be = &*target.backend;
        let mut want = self.take_plan();
        let spec = self.spec.as_mut().expect("a round needs a drafter");
        let state = &mut *self.state;
        let sampler = &mut *self.sampler;
        let history = &self.history;
        let n_min = spec.policy.config.n_min;
        let at = state.checkpoint();
        let pos = at.len();
        let last = *history.last().expect("history holds the prompt");

        let tc = Instant::now();
        // A drafter that catches up in parts drafts once it is caught up;
        // until then its round is a plain step.
        let caught_up = match spec.drafter.lag(history) {
            _ if want == 0 => 0,
            0 => spec.drafter.catch_up(history, usize::MAX)?,
            lag => {
                let most = spec.policy.catch_up_allowance(lag);
                let fed = spec.drafter.catch_up(history, most)?;
                if fed < lag {
                    want = 0;
                }
                fed
            }
        };
        let catch_up_seconds = tc.elapsed().as_secs_f64();
        let td = Instant::now();
        let mut logprobs = Vec::new();
        let device_draft = match &mut spec.round {
            None => None,
            Some(_) if want == 0 => Some(0),
            Some((round, _)) if want >= n_min.max(1) => {
                be.reshape(round, want + 1, 2);
                spec.drafter
                    .propose_on_device(history, want, round)?
                    .filter(|&n| n >= n_min && n <= want)
            }
            Some(_) => None,
        };
        let (batch, draft, verdict, draft_seconds, tv) = if let Some(n) = device_draft {
            // On a backend that records and submits at the readback, the
            // draft's execution time lands in the verify time: the policy
            // then sees drafting as nearly free and verify as dearer, which
            // errs towards shorter drafts.
            let draft_seconds = td.elapsed().as_secs_f64();
            let tv = Instant::now();
            let (round, anchor) = spec.round.as_mut().expect("device rounds have tensors");
            be.write(anchor, &[last as f32]);
            be.copy_rows(anchor, 0, round, 0, 0, 1);
            target.forward_device(
                state,
                round,
                0,
                n + 1,
                LogitRows::All,
                true,
                spec.taps.as_mut(),
            )?;
            penalize(
                be,
                state.logits_mut(),
                history,
                Some((&*round, 0)),
                &sampler.params,
            );
            if sampler.params.is_greedy() {
                be.argmax_to(state.logits(), round, 0, 1);
            } else {
                // The row at position q draws the number of (seed, q): a
                // row after the first mismatch decided nothing, so its
                // number is still fresh when q is drawn again next round,
                // and the output is the target's whatever the drafts.
                let p = &sampler.params;
                be.sample_to(state.logits(), p, pos as u64, round, 0, 1);
            }
            be.reshape(round, n + 1, 2);
            let ids: Vec<u32> = be.read(round).await.iter().map(|&v| v as u32).collect();
            let batch: Vec<u32> = ids.iter().step_by(2).copied().collect();
            let choices: Vec<u32> = ids.iter().skip(1).step_by(2).copied().collect();
            let draft = Draft {
                tokens: batch[1..].to_vec(),
            };
            let verdict = verify_greedy(&choices, &draft.tokens);
            (batch, draft, verdict, draft_seconds, tv)
        } else {
            let mut draft = if want > 0 {
                spec.drafter.propose(history, want).await?
            } else {
                Default::default()
            };
            draft.tokens.truncate(want);
            if draft.tokens.len() < n_min {
                draft = Default::default();
            }
            let draft_seconds = td.elapsed().as_secs_f64();

            let tv = Instant::now();
            let mut batch = Vec::with_capacity(draft.tokens.len() + 1);
            batch.push(last);
            batch.extend_from_slice(&draft.tokens);
            target.forward(state, &batch, LogitRows::All, true, spec.taps.as_mut())?;
            let n_vocab = target.config.n_vocab;
            let verdict = match self.logprobs {
                None => {
                    verdict_on_host(be, state.logits(), history, &draft, sampler, n_vocab).await
                }
                Some(top) => {
                    let rows = be.read(state.logits()).await;
                    let verdict = verdict_from_rows(&rows, n_vocab, history, &draft, sampler);
                    logprobs = rows
                        .chunks_exact(n_vocab)
                        .zip(&verdict.tokens)
                        .map(|(row, &t)| TokenLogprobs::from_logits(row, t, top))
                        .collect();
                    verdict
                }
            };
            (batch, draft, verdict, draft_seconds, tv)
        };
        check_device(be)?;
        state.commit(at, 1 + verdict.accepted)?;
        spec.drafter
            .observe(
                &batch[..1 + verdict.accepted],
                pos,
                spec.taps.as_ref().map(Taps::output),
            )
            .await?;
        spec.drafter.rollback(state.len())?;
        let verify_seconds = tv.elapsed().as_secs_f64();

        let round = RoundStats {
            drafted: draft.tokens.len(),
            accepted: verdict.accepted,
            caught_up,
            catch_up_seconds,
            draft_seconds,
            verify_seconds,
            probe: !draft.tokens.is_empty() && spec.policy.probing(),
        };
        self.record_round(want, round, events);
        self.emit(&verdict.tokens, logprobs, events);
        Ok(())
    }
}

/// The verdict on `draft` from the verify pass's `logits`: the argmax rows
/// alone where greedy decoding needs nothing else, otherwise every row read
/// back and chosen as the sampler says.
pub(super) async fn verdict_on_host<B: Backend>(
    be: &B,
    logits: &B::Tensor,
    history: &[u32],
    draft: &Draft,
    sampler: &crate::sampling::Sampler,
    n_vocab: usize,
) -> Verdict {
    if sampler.params.picks_argmax() {
        return verify_greedy(&be.argmax(logits).await, &draft.tokens);
    }
    verdict_from_rows(&be.read(logits).await, n_vocab, history, draft, sampler)
}
