//! Plain steps of several sequences in one target pass.

use super::sequence::{Phase, Sequence};
use super::{Engine, Event};
use crate::backend::{check_device, Backend};
use crate::error::ModelError;
use crate::model::{DecoderState, Taps};
use crate::sampling::TokenLogprobs;
use crate::speculative::RoundStats;
use web_time::Instant;

impl<B: Backend> Sequence<'_, B> {
    /// Whether its next step is a plain one (no draft this round), which
    /// the engine may batch with others'.
    pub(super) fn takes_a_plain_step(&mut self) -> bool {
        self.phase == Phase::Decode && self.plan() == 0
    }

    fn tap_layers(&self) -> Option<&[usize]> {
        self.spec.as_ref()?.taps.as_ref().map(Taps::layers)
    }
}

impl<B: Backend> Engine<B> {
    /// One plain step of each sequence at `chosen` (two or more), in one
    /// batched target pass. Sequences whose drafter reads other taps than
    /// the first such sequence step alone.
    pub(super) async fn plain_batch(
        &mut self,
        seqs: &mut [Sequence<'_, B>],
        chosen: &[usize],
        events: &mut Vec<(usize, Event)>,
    ) -> Result<(), ModelError> {
        let target = self.target.clone();
        let layers: Option<Vec<usize>> = chosen
            .iter()
            .find_map(|&i| seqs[i].tap_layers().map(<[usize]>::to_vec));
        let (together, alone): (Vec<usize>, Vec<usize>) = chosen.iter().partition(|&&i| {
            seqs[i]
                .tap_layers()
                .is_none_or(|l| Some(l) == layers.as_deref())
        });
        for i in alone {
            super::step_alone(&target, &mut seqs[i], i, events).await;
        }
        let n = together.len();
        if self.batch.as_ref().is_none_or(|b| b.max_seqs() < n) {
            self.batch = Some(target.new_batch(n, n));
        }
        // A backend whose largest tensor holds fewer rows takes them in
        // parts.
        let room = self
            .batch
            .as_ref()
            .map_or(1, |b| b.max_seqs().min(b.max_rows()));
        for part in together.chunks(room.max(1)) {
            if let [i] = part[..] {
                super::step_alone(&target, &mut seqs[i], i, events).await;
            } else {
                self.batch_part(seqs, part, layers.as_deref(), events)
                    .await?;
            }
        }
        Ok(())
    }

    /// One batched plain step of the sequences at `together` (two or
    /// more, within the batch's capacity), whose drafters read `layers`.
    async fn batch_part(
        &mut self,
        seqs: &mut [Sequence<'_, B>],
        together: &[usize],
        layers: Option<&[usize]>,
        events: &mut Vec<(usize, Event)>,
    ) -> Result<(), ModelError> {
        let target = self.target.clone();
        let be = &*target.backend;
        let n = together.len();
        let batch = self.batch.as_mut().expect("made by plain_batch");
        let taps = match layers {
            None => None,
            Some(l) => {
                if self
                    .batch_taps
                    .as_ref()
                    .is_none_or(|t| t.layers() != l || t.max_rows() < n)
                {
                    self.batch_taps = Some(Taps::new(be, &target.config, l, n)?);
                }
                self.batch_taps.as_mut()
            }
        };

        let t0 = Instant::now();
        let mut members: Vec<&mut Sequence<'_, B>> = seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| together.contains(i))
            .map(|(_, s)| s)
            .collect();
        let positions: Vec<usize> = members.iter().map(|s| s.state.len()).collect();
        {
            let mut parts: Vec<(&mut DecoderState<B>, &[u32])> = members
                .iter_mut()
                .map(|s| {
                    let Sequence { state, history, .. } = &mut **s;
                    let last = history.len() - 1;
                    (&mut **state, &history[last..])
                })
                .collect();
            target.forward_batch(batch, &mut parts, taps)?;
        }
        self.batched_passes += 1;
        self.batched_steps += n;
        let greedy = members
            .iter()
            .all(|s| s.sampler.params.picks_argmax() && s.logprobs.is_none());
        let mut logprobs: Vec<Vec<TokenLogprobs>> = vec![Vec::new(); n];
        let choices = if greedy {
            be.argmax(batch.logits()).await
        } else {
            let rows = be.read(batch.logits()).await;
            let width = rows.len() / n;
            let n_vocab = target.config.n_vocab;
            members
                .iter()
                .zip(rows.chunks_exact(width))
                .zip(&mut logprobs)
                .map(|((s, row), scored)| {
                    let row = &row[..n_vocab];
                    // As alone: a speculative sequence's plain step samples
                    // as its verifier would an empty draft.
                    let token = s.sampler.sample(row, &s.history);
                    if let Some(top) = s.logprobs {
                        scored.push(TokenLogprobs::from_logits(row, token, top));
                    }
                    token
                })
                .collect()
        };
        check_device(be)?;
        let seconds = t0.elapsed().as_secs_f64();

        let steps = members.iter_mut().zip(choices).zip(positions).zip(logprobs);
        for (row, (((seq, token), pos), scored)) in steps.enumerate() {
            let index = together[row];
            let mut own = Vec::new();
            if let Err(e) = observe_plain_step(
                seq,
                self.batch_taps.as_ref(),
                row,
                pos,
                seconds,
                be,
                &mut own,
            )
            .await
            {
                seq.fail();
                own.push(Event::Failed(e));
            } else {
                seq.emit(&[token], scored, &mut own);
            }
            events.extend(own.into_iter().map(|e| (index, e)));
        }
        Ok(())
    }
}

/// What a plain step of a speculative sequence records: the drafter sees
/// its row (and its taps), the policy the step's time.
async fn observe_plain_step<B: Backend>(
    seq: &mut Sequence<'_, B>,
    batch_taps: Option<&Taps<B>>,
    row: usize,
    pos: usize,
    seconds: f64,
    be: &B,
    events: &mut Vec<Event>,
) -> Result<(), ModelError> {
    let planned = seq.take_plan();
    let Some(spec) = seq.spec.as_mut() else {
        return Ok(());
    };
    if let (Some(own), Some(all)) = (spec.taps.as_mut(), batch_taps) {
        own.copy_row(be, all, row)?;
    }
    let last = *seq.history.last().expect("history holds the prompt");
    spec.drafter
        .observe(&[last], pos, spec.taps.as_ref().map(Taps::output))
        .await?;
    spec.drafter.rollback(seq.state.len())?;
    let round = RoundStats {
        verify_seconds: seconds,
        ..Default::default()
    };
    seq.record_round(planned, round, events);
    Ok(())
}
