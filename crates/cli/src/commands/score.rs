//! `blockdraft score`: forced decoding of given token ids.

use crate::args::PenaltyArgs;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::LogitRows;
use blockdraft_core::sampling::{Sampler, SamplingParams};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON file holding an array of token ids, at most the model's
    /// trained context; `blockdraft tokenize -m M "text" > ids.json` makes one.
    #[arg(long = "tokens")]
    pub tokens: std::path::PathBuf,
    /// Score under `run`'s penalties: each row's log-probs are those of the
    /// penalized logits `run --temp 0` picks from after the same tokens.
    #[command(flatten)]
    pub penalties: PenaltyArgs,
}

/// Log-softmax of `logits` at `id`, computed in f64.
fn log_prob(logits: &[f32], id: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[id] as f64 - max - sum.ln()
}

pub fn run(args: Args) -> Result<()> {
    let raw = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("cannot read {}", args.tokens.display()))?;
    let ids: Vec<u32> = serde_json::from_str(&raw).with_context(|| {
        format!(
            "{} must hold a JSON array of token ids",
            args.tokens.display()
        )
    })?;
    if ids.len() < 2 {
        bail!("at least two tokens are needed to score, got {}", ids.len());
    }
    let sampler = Sampler::new(args.penalties.apply(SamplingParams::greedy()));
    with_backend(&args.model, Score { ids, sampler })
}

struct Score {
    ids: Vec<u32>,
    sampler: Sampler,
}

impl Job for Score {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()> {
        score(&self.ids, &self.sampler, loaded)
    }
}

fn score<B: Backend>(ids: &[u32], sampler: &Sampler, loaded: Loaded<B>) -> Result<()> {
    let dec = &loaded.decoder;
    let n_vocab = dec.config.n_vocab;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {bad} is outside the vocabulary of {n_vocab}");
    }
    let n_ctx = dec
        .config
        .context_size(ids.len(), None)
        .with_context(|| format!("cannot score {} token ids", ids.len()))?;
    let mut state = dec.try_new_state(n_ctx, 64)?;
    // Every row's logits are read: as many rows as the backend holds.
    let batch = state.logit_rows();
    let mut positions = Vec::with_capacity(ids.len() - 1);
    let mut nll = 0.0;
    // A bar (or, without a terminal, a line per tenth) once it takes a while.
    let mut progress =
        (ids.len() > 4 * batch).then(|| Progress::new("scoring", "tokens", ids.len() as u64));
    for (c, chunk) in ids.chunks(batch).enumerate() {
        dec.forward(&mut state, chunk, LogitRows::All, true, None)?;
        let mut logits = pollster::block_on(dec.backend.read(state.logits()));
        for (r, row) in logits.chunks_exact_mut(n_vocab).enumerate() {
            let at = c * batch + r;
            let Some(&next) = ids.get(at + 1) else {
                break;
            };
            if sampler.params.penalizes() {
                sampler.penalize(row, &ids[..=at]);
            }
            let lp = log_prob(row, next as usize);
            nll -= lp;
            let argmax = blockdraft_core::sampling::argmax(row);
            // The argmax's own log-prob: its margin over the given token.
            let argmax_lp = log_prob(row, argmax as usize);
            positions.push(json!({"argmax": argmax, "logprob": lp, "argmax_logprob": argmax_lp}));
        }
        if let Some(p) = &mut progress {
            p.set((c * batch + chunk.len()) as u64);
        }
    }
    if let Some(p) = progress {
        p.finish();
    }
    let n = positions.len();
    crate::out::println(
        json!({"tokens": ids, "positions": positions, "perplexity": (nll / n as f64).exp()}),
    )
}
