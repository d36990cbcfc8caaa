//! `--draft`: building a drafter from a file or a name.

use crate::args::{f32_in, usize_in};
use crate::load::Loaded;
use anyhow::{Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::ModelConfig;
use blockdraft_core::sampling::Bounds;
use blockdraft_core::speculative::{DFlashModel, PolicyConfig, SharedDrafter};
use blockdraft_core::testing::{
    synthetic_dflash, synthetic_dflash_d2t, SyntheticDFlash, SyntheticDims,
};
use blockdraft_gguf::{GgmlType, GgufFile};
use std::sync::Arc;

/// Options of speculative decoding shared by `run` and `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// Drafter: a GGUF file (a DFlash drafter, or any model sharing the
    /// target's vocabulary), `ngram` for prompt lookup, or
    /// `dflash-random[:LAYERS[:HEAD_ROWS]]` (random weights, with a reduced
    /// head of HEAD_ROWS rows as trained drafters have; for benchmarks only).
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
    let drafter = if let Some(shape) = spec.strip_prefix("dflash-random") {
        let shape = RandomShape::parse(shape, target.decoder.config.n_vocab)
            .with_context(|| format!("`{spec}`: expected dflash-random[:LAYERS[:HEAD_ROWS]]"))?;
        let file = random_dflash(&target.decoder.config, shape);
        let model = DFlashModel::load(&file, &target.decoder)?;
        SharedDrafter::DFlash {
            model: Arc::new(model),
            p_min: 0.0,
        }
    } else {
        if !(0.0..=1.0).contains(&args.p_min) {
            anyhow::bail!("--p-min must be within 0..=1, got {}", args.p_min);
        }
        let file = GgufFile::open(std::path::Path::new(spec)).context(
            "cannot load drafter (`--draft` takes a drafter or draft-model GGUF, `ngram` or `dflash-random`)",
        )?;
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

/// The shape of a `dflash-random` drafter.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RandomShape {
    layers: usize,
    /// Rows of its own reduced head (`d2t`); `None`: the target's whole head.
    head_rows: Option<usize>,
}

impl RandomShape {
    /// Parses what follows `dflash-random`: empty, `:LAYERS` or
    /// `:LAYERS:HEAD_ROWS` (1..=n_vocab rows).
    fn parse(rest: &str, n_vocab: usize) -> Result<Self> {
        let mut shape = RandomShape {
            layers: 1,
            head_rows: None,
        };
        if rest.is_empty() {
            return Ok(shape);
        }
        let rest = rest.strip_prefix(':').context("unknown drafter")?;
        let mut fields = rest.split(':');
        let layers = fields.next().unwrap_or_default();
        shape.layers = layers
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .with_context(|| format!("LAYERS `{layers}` is not within 1..=64"))?;
        if let Some(rows) = fields.next() {
            let n = rows
                .parse()
                .ok()
                .filter(|n| (1..=n_vocab).contains(n))
                .with_context(|| format!("HEAD_ROWS `{rows}` is not within 1..={n_vocab}"))?;
            shape.head_rows = Some(n);
        }
        if let Some(extra) = fields.next() {
            anyhow::bail!("unexpected `:{extra}`");
        }
        Ok(shape)
    }
}

/// A random DFlash drafter shaped like a real one for `target`:
/// `shape.layers` target-sized layers, five taps spread over the depth,
/// block 16, Q8_0, and either the target's head or its own head over the
/// first `head_rows` target ids (as the reduced vocabularies of the
/// shipped drafters). Its drafts are noise; it exists to measure drafting
/// cost (`bench --forced-tau`).
fn random_dflash(target: &ModelConfig, shape: RandomShape) -> GgufFile {
    let n = target.n_layer as i32;
    let taps = (0..5).map(|i| 1 + i * (n - 3) / 4).collect();
    let spec = SyntheticDFlash {
        dims: SyntheticDims {
            n_layer: shape.layers,
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
    let model = match shape.head_rows {
        None => synthetic_dflash(&spec, 1),
        Some(rows) => {
            let d2t: Vec<i64> = (0..rows as i64).collect();
            synthetic_dflash_d2t(&spec, &d2t, 1)
        }
    };
    GgufFile::from_bytes(model.bytes).expect("the synthetic drafter is valid GGUF")
}

#[cfg(test)]
mod tests {
    use super::RandomShape;

    #[test]
    fn random_drafter_shapes_parse_and_refuse_nonsense() {
        let shape = |s| RandomShape::parse(s, 1000);
        let ok = |layers, head_rows| RandomShape { layers, head_rows };
        assert_eq!(shape("").unwrap(), ok(1, None));
        assert_eq!(shape(":2").unwrap(), ok(2, None));
        assert_eq!(shape(":1:256").unwrap(), ok(1, Some(256)));
        assert_eq!(shape(":1:1000").unwrap(), ok(1, Some(1000)));
        for bad in [
            "x", ":", ":0", ":65", ":1:0", ":1:1001", ":1:8:3", ":a:8", ":1:",
        ] {
            assert!(shape(bad).is_err(), "{bad} accepted");
        }
    }
}
