//! Many greedy answers generated together: each new prompt is prefilled in
//! its own state, then every active sequence advances one token per
//! batched pass ([`Decoder::forward_batch`]), so each weight is read once
//! for all of them. A finished sequence frees its slot for the next prompt
//! (continuous batching). A row's values do not depend on the batch, so the
//! answers and taps are those of generating each prompt alone.

use super::forward_capturing;
use super::shard::Sequence;
use crate::load::Loaded;
use anyhow::Result;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{BatchState, DecoderState, LogitRows, Taps};
use half::f16;

/// A sequence being generated.
struct Active {
    prompt_index: usize,
    ids: Vec<u32>,
    prompt_len: usize,
    /// Taps of `ids`, row j = position j.
    taps: Vec<f16>,
    /// The target's greedy choice after `ids`, fed by the next pass.
    next: u32,
}

struct Slot<B: Backend> {
    state: DecoderState<B>,
    active: Option<Active>,
}

pub struct Generator<'a, B: Backend> {
    loaded: &'a Loaded<B>,
    n_predict: usize,
    slots: Vec<Slot<B>>,
    batch: BatchState<B>,
    /// Taps of a prefill chunk, and of a batched step (a row per slot).
    prefill_taps: Taps<B>,
    step_taps: Taps<B>,
    width: usize,
}

impl<'a, B: Backend> Generator<'a, B> {
    /// `parallel` sequences at once (fewer where the backend's tensors
    /// hold fewer rows), each of up to `n_ctx` positions.
    pub fn new(
        loaded: &'a Loaded<B>,
        taps: &[usize],
        parallel: usize,
        n_ctx: usize,
        n_predict: usize,
    ) -> Result<Self> {
        let dec = &loaded.decoder;
        let be = &*dec.backend;
        let batch = dec.new_batch(parallel, parallel);
        let parallel = batch.max_seqs().min(batch.max_rows());
        let prefill_rows = 64;
        let slots = (0..parallel)
            .map(|_| {
                Ok(Slot {
                    state: dec.try_new_state(n_ctx, prefill_rows)?,
                    active: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Generator {
            loaded,
            n_predict,
            slots,
            batch,
            prefill_taps: Taps::new(be, &dec.config, taps, prefill_rows)?,
            step_taps: Taps::new(be, &dec.config, taps, parallel)?,
            width: taps.len() * dec.config.n_embd,
        })
    }

    pub fn has_room(&self) -> bool {
        self.slots.iter().any(|s| s.active.is_none())
    }

    pub fn is_idle(&self) -> bool {
        self.slots.iter().all(|s| s.active.is_none())
    }

    /// Prefills `ids` (a rendered prompt) into a free slot. Call only when
    /// [`Self::has_room`].
    pub fn start(&mut self, prompt_index: usize, ids: Vec<u32>) -> Result<()> {
        let dec = &self.loaded.decoder;
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.active.is_none())
            .expect("a free slot");
        slot.state.truncate(0)?;
        let mut taps = Vec::with_capacity((ids.len() + self.n_predict) * self.width);
        for chunk in ids.chunks(slot.state.max_batch()) {
            forward_capturing(
                dec,
                &mut slot.state,
                chunk,
                LogitRows::Last,
                &mut self.prefill_taps,
                &mut taps,
            )?;
        }
        let next = pollster::block_on(dec.backend.argmax(slot.state.logits()))[0];
        slot.active = Some(Active {
            prompt_index,
            prompt_len: ids.len(),
            ids,
            taps,
            next,
        });
        Ok(())
    }

    /// One batched pass: every active sequence takes its next token. Returns
    /// the sequences this finished (an end-of-generation token, whose taps
    /// are kept so that row j is always position j, or `n_predict` tokens).
    pub fn step(&mut self) -> Result<Vec<Sequence>> {
        let dec = &self.loaded.decoder;
        let be = &*dec.backend;
        let fed: Vec<[u32; 1]> = self
            .slots
            .iter()
            .filter_map(|s| s.active.as_ref().map(|a| [a.next]))
            .collect();
        let mut parts: Vec<(&mut DecoderState<B>, &[u32])> = self
            .slots
            .iter_mut()
            .filter(|s| s.active.is_some())
            .map(|s| &mut s.state)
            .zip(fed.iter().map(|t| &t[..]))
            .collect();
        dec.forward_batch(&mut self.batch, &mut parts, Some(&mut self.step_taps))?;
        let taps = pollster::block_on(be.read(self.step_taps.output()));
        let greedy = pollster::block_on(be.argmax(self.batch.logits()));
        let mut finished = Vec::new();
        let active = self.slots.iter_mut().filter(|s| s.active.is_some());
        for (row, slot) in active.enumerate() {
            let a = slot.active.as_mut().expect("active");
            let token = a.next;
            a.ids.push(token);
            a.taps.extend(
                taps[row * self.width..(row + 1) * self.width]
                    .iter()
                    .map(|&v| f16::from_f32(v)),
            );
            a.next = greedy[row];
            let eog = self.loaded.tokenizer.is_eog(token);
            if eog || a.ids.len() - a.prompt_len >= self.n_predict {
                let a = slot.active.take().expect("active");
                finished.push(Sequence {
                    prompt_index: a.prompt_index,
                    ids: a.ids,
                    prompt_len: a.prompt_len,
                    finished: eog,
                    taps: a.taps,
                });
            }
        }
        Ok(finished)
    }
}
