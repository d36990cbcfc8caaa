//! `gen-data --replay`: responses from a sequences file (as
//! `training/sequences.py` exports them) instead of generated ones; their
//! taps come from batched forward passes (about twice generation's speed).

use super::forward_capturing;
use super::shard::{Manifest, Sequence};
use crate::load::Loaded;
use anyhow::{bail, ensure, Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{DecoderState, LogitRows, Taps};
use half::f16;
use std::collections::HashMap;
use std::path::Path;

/// One sequence of a `--replay` file.
#[derive(serde::Deserialize)]
pub struct Replayed {
    pub prompt_index: usize,
    pub prompt_len: usize,
    pub finished: bool,
    pub ids: Vec<u32>,
}

/// The first line of a `--replay` file: the manifest of the data it came from.
#[derive(serde::Deserialize)]
struct ReplayHeader {
    manifest: Manifest,
}

/// The sequences of a `--replay` file, by prompt index, after checking that
/// they were made from this model, chat template, system message, prompts
/// file and KV cache type (the taps and limits may differ: that is what a
/// replay is for).
pub fn read_replay(path: &Path, manifest: &Manifest) -> Result<HashMap<usize, Replayed>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header: ReplayHeader = lines
        .next()
        .and_then(|(_, l)| serde_json::from_str(l).ok())
        .with_context(|| {
            format!(
                "{}: the first line is not {{\"manifest\": ...}} (make the file with training/sequences.py)",
                path.display()
            )
        })?;
    let (theirs, ours) = (
        serde_json::to_value(&header.manifest)?,
        serde_json::to_value(manifest)?,
    );
    for key in [
        "model_name",
        "architecture",
        "n_vocab",
        "template_hash",
        "system",
        "prompts_hash",
        "kv_type",
    ] {
        if theirs.get(key) != ours.get(key) {
            bail!(
                "{} was made with {key} = {}, this run has {key} = {}",
                path.display(),
                theirs[key],
                ours[key]
            );
        }
    }
    let mut out = HashMap::new();
    for (i, line) in lines {
        let r: Replayed = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: expected {{\"prompt_index\", \"prompt_len\", \"finished\", \"ids\"}}",
                path.display(),
                i + 1
            )
        })?;
        ensure!(
            r.prompt_len < r.ids.len() && r.ids.iter().all(|&t| (t as usize) < manifest.n_vocab),
            "{} line {}: no response after the prompt, or an id beyond the vocabulary",
            path.display(),
            i + 1
        );
        if out.insert(r.prompt_index, r).is_some() {
            bail!(
                "{} line {}: a second sequence for one prompt",
                path.display(),
                i + 1
            );
        }
    }
    Ok(out)
}

/// How far replayed responses follow this target's own greedy choices.
#[derive(Default)]
pub struct ReplayStats {
    pub tokens: usize,
    pub differing: usize,
}

impl ReplayStats {
    /// Near-ties may flip between machines whose kernels sum in another
    /// order; more than this share of differing tokens means the file was
    /// made by another model (or with sampling), and its taps would teach
    /// a drafter another target.
    const MAX_DIFFERING: f64 = 0.02;

    /// Fails where more than the tolerated share (and more than one token)
    /// differs; checked before each shard is written, so a shard of
    /// another model's answers is never written.
    pub fn check(&self, path: &Path) -> Result<()> {
        let tolerated = (Self::MAX_DIFFERING * self.tokens as f64).max(1.0);
        if self.differing as f64 > tolerated {
            bail!(
                "{}: {} of {} replayed response tokens are not this target's greedy choice; \
                 was it made by another model?",
                path.display(),
                self.differing,
                self.tokens
            );
        }
        Ok(())
    }
}

/// A sequence from a `--replay` file with the taps of every position,
/// captured by forward passes over it in batches; the logits of every row
/// check that the response is this target's greedy answer.
pub fn replayed<B: Backend>(
    loaded: &Loaded<B>,
    state: &mut DecoderState<B>,
    taps: &mut Taps<B>,
    prompt_index: usize,
    seq: &Replayed,
    stats: &mut ReplayStats,
) -> Result<Sequence> {
    let dec = &loaded.decoder;
    let be = &*dec.backend;
    let mut rows: Vec<f16> =
        Vec::with_capacity(seq.ids.len() * taps.layers().len() * dec.config.n_embd);
    let batch = state.logit_rows();
    for (c, chunk) in seq.ids.chunks(batch).enumerate() {
        forward_capturing(dec, state, chunk, LogitRows::All, taps, &mut rows)?;
        let greedy = pollster::block_on(be.argmax(state.logits()));
        let start = c * batch;
        for (j, &next) in greedy.iter().enumerate() {
            let pos = start + j + 1; // the token this row predicts
            if pos >= seq.prompt_len && pos < seq.ids.len() {
                stats.tokens += 1;
                stats.differing += (seq.ids[pos] != next) as usize;
            }
        }
    }
    Ok(Sequence {
        prompt_index,
        ids: seq.ids.clone(),
        prompt_len: seq.prompt_len,
        finished: seq.finished,
        taps: rows,
    })
}
