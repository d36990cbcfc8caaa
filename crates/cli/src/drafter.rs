//! `--draft`: building a drafter from a file or a name.

use crate::args::{f32_in, usize_in};
use crate::load::{open_gguf, Loaded};
use anyhow::{Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::ModelConfig;
use blockdraft_core::sampling::Bounds;
use blockdraft_core::speculative::{DFlashModel, PolicyConfig, SharedDrafter};
use blockdraft_core::testing::{synthetic_dflash, SyntheticDFlash, SyntheticDims};
use blockdraft_gguf::{GgmlType, GgufFile};
use std::sync::Arc;

/// Options of speculative decoding shared by `run` and `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// Drafter: a GGUF file (a DFlash drafter, or any model sharing the
    /// target's vocabulary), `ngram` for prompt lookup, or
    /// `dflash-random[:LAYERS]` (random weights; for benchmarks only).
    #[arg(long = "draft")]
    pub draft: Option<String>,
    /// Most tokens drafted per round (1..=64).
    #[arg(long = "draft-max", default_value_t = 8, requires = "draft",
          value_parser = usize_in(PolicyConfig::LENGTHS))]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified (1..=--draft-max).
    #[arg(long = "draft-min", default_value_t = 1, requires = "draft",
          value_parser = usize_in(PolicyConfig::LENGTHS))]
    pub draft_min: usize,
    /// DFlash: stop a draft at the first token whose probability is below this.
    #[arg(long = "p-min", default_value_t = 0.0, requires = "draft",
          value_parser = f32_in(Bounds { lo: 0.0, hi: 1.0 }))]
    pub p_min: f32,
    /// Always draft --draft-max tokens instead of adapting the length to measured costs.
    #[arg(long = "fixed-draft", requires = "draft")]
    pub fixed_draft: bool,
}

impl DraftArgs {
    /// Refuses lengths that would silently turn speculation off; warns
    /// about --p-min where the drafter named has no probabilities to cut.
    pub fn check(&self) -> Result<()> {
        let no_p_min = |d: &str| d == "ngram" || d.starts_with("dflash-random");
        if self.p_min > 0.0 && self.draft.as_deref().is_some_and(no_p_min) {
            crate::out::warn("--p-min applies to DFlash drafter files only; ignored");
        }
        self.policy()
            .check()
            .map_err(|e| anyhow::anyhow!("--draft-min/--draft-max: {e}"))
    }

    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            n_max: self.draft_max,
            n_min: self.draft_min,
            adaptive: !self.fixed_draft,
        }
    }
}

/// The drafter named by `args.draft` for `target`, its weights loaded
/// once for every sequence that uses it, and warmed up.
pub fn shared<B: Backend>(args: &DraftArgs, target: &Loaded<B>) -> Result<SharedDrafter<B>> {
    let Some(spec) = args.draft.as_deref() else {
        return Ok(SharedDrafter::None);
    };
    if spec == "ngram" {
        return Ok(SharedDrafter::Ngram);
    }
    let drafter = if let Some(layers) = spec.strip_prefix("dflash-random") {
        let layers = match layers.strip_prefix(':') {
            Some(n) => n
                .parse()
                .with_context(|| format!("`{spec}`: expected dflash-random:LAYERS"))?,
            None if layers.is_empty() => 1,
            None => anyhow::bail!("unknown drafter `{spec}`"),
        };
        let file = random_dflash(&target.decoder.config, layers);
        let model = DFlashModel::load(&file, &target.decoder)?;
        SharedDrafter::DFlash {
            model: Arc::new(model),
            p_min: 0.0,
        }
    } else {
        if !(0.0..=1.0).contains(&args.p_min) {
            anyhow::bail!("--p-min must be within 0..=1, got {}", args.p_min);
        }
        let file = open_gguf(std::path::Path::new(spec))?;
        let mut drafter = SharedDrafter::from_gguf(&file, &target.decoder)
            .with_context(|| format!("cannot load drafter {spec}"))?;
        if let SharedDrafter::DFlash { p_min, .. } = &mut drafter {
            *p_min = args.p_min;
        }
        drafter
    };
    pollster::block_on(drafter.warm_up()).context("the drafter's warm-up pass failed")?;
    Ok(drafter)
}

/// A random DFlash drafter shaped like a real one for `target`: `layers`
/// target-sized layers, five taps spread over the depth, block 16, Q8_0.
/// Its drafts are noise; it exists to measure drafting cost (`bench
/// --forced-tau`).
fn random_dflash(target: &ModelConfig, layers: usize) -> GgufFile {
    let n = target.n_layer as i32;
    let taps = (0..5).map(|i| 1 + i * (n - 3) / 4).collect();
    let spec = SyntheticDFlash {
        dims: SyntheticDims {
            n_layer: layers,
            n_embd: target.n_embd,
            n_head: target.n_head,
            n_head_kv: target.n_head_kv,
            head_dim: target.head_dim,
            n_ff: target.n_ff,
            n_vocab: target.n_vocab,
            window: 0,
        },
        target_layers: taps,
        block_size: 16,
        mask_token: 0,
        matrix_type: GgmlType::Q8_0,
    };
    GgufFile::from_bytes(synthetic_dflash(&spec, 1).bytes)
        .expect("the synthetic drafter is valid GGUF")
}
