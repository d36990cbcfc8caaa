//! DFlash block drafter (v1): a few Qwen3-style layers that read hidden
//! states tapped from the target and draft a whole block in one
//! non-causal pass (spec: shared/spec/dflash-family.md §1–§3.2).
//!
//! Context path: for every committed target row, `c = RMSNorm(fc · taps)`
//! and each draft layer stores `K = rope(k_norm(W_k c))`, `V = W_v c` at the
//! row's target position. Block path: `[anchor, MASK × n]` at the next
//! positions runs through the layers attending to all context and the whole
//! block; row i ≥ 1 predicts the i-th token after the anchor.
//!
//! DFlash2 (tensor `selector_hidden.weight`) adds convolutions inside the
//! block path and a candidate selector (see [`super::dflash2`]).
//!
//! DFly (tensor `layer_fusion`) gives every draft layer its own context and
//! optionally corrects each block row by its predecessor (see
//! [`super::dfly`]).
//!
//! DSpark (tensor `markov_w1.weight`) biases each row by the token chosen
//! before it and may stop on a confidence head; with `sample_from_anchor`
//! the anchor row itself predicts (see [`super::dspark`]). A `d2t` tensor
//! (v1, DFlash2, DSpark) gives the drafter its own narrower head whose rows
//! map to target ids.
//!
//! A file is one [`DFlashVariant`], decided once from its tensors; the
//! shared weights and each sequence's scratch hold that variant's parts
//! only (`VariantWeights`, `VariantScratch`), so two variants' parts never
//! meet and every variant-specific step is one `match`.

use super::dflash2::{
    ConvHook, ConvScratch, Convs, DFlash2Config, DeviceSelector, DeviceSelectorScratch, Lattice,
    Selector,
};
use super::dfly::{Correction, CorrectionScratch, DFlyConfig, CORRECTION};
use super::dspark::{
    load_d2t, DSparkConfig, DeviceMarkov, DeviceMarkovScratch, MarkovHead, CONF_BIAS, CONF_WEIGHT,
};
use super::{Draft, Drafter};
use crate::backend::{Backend, RopeParams, WeightRole};
use crate::error::ModelError;
use crate::model::{
    Architecture, Decoder, DecoderState, FileTensors, LayerHook, LogitRows, ModelConfig,
};
use crate::sampling::argmax;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

/// DFlash-specific metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DFlashConfig {
    /// Target tap ids, +1-shifted (`n_layer` = pre-final-norm output).
    pub target_layers: Vec<usize>,
    pub block_size: usize,
    pub mask_token: u32,
    /// Block rows attend causally (off for DFlash).
    pub causal: bool,
    /// The variant, with what it adds to DFlash v1.
    pub variant: DFlashVariant,
    /// Reduced vocabulary: draft head row → target token id.
    pub d2t: Option<Vec<u32>>,
}

/// The DFlash-family variants; each adds to v1's context and block paths.
/// The tensors decide which one a file is, once, in [`DFlashConfig::from_gguf`].
#[derive(Clone, Debug, PartialEq)]
pub enum DFlashVariant {
    /// DFlash v1: the shared context and one non-causal block pass.
    V1,
    /// Convolutions in the block path and a candidate selector
    /// (tensor `selector_hidden.weight`).
    DFlash2(DFlash2Config),
    /// Per-layer contexts and an optional predecessor correction (tensor
    /// `layer_fusion`).
    DFly(DFlyConfig),
    /// A Markov bias from the previous token and an optional confidence
    /// stop (tensor `markov_w1.weight`).
    DSpark(DSparkConfig),
}

impl DFlashVariant {
    /// The variant's name, as errors give it.
    pub fn name(&self) -> &'static str {
        match self {
            DFlashVariant::V1 => "DFlash v1",
            DFlashVariant::DFlash2(_) => "DFlash2",
            DFlashVariant::DFly(_) => "DFly",
            DFlashVariant::DSpark(_) => "DSpark",
        }
    }

    pub fn dflash2(&self) -> Option<&DFlash2Config> {
        match self {
            DFlashVariant::DFlash2(c) => Some(c),
            _ => None,
        }
    }

    pub fn dfly(&self) -> Option<&DFlyConfig> {
        match self {
            DFlashVariant::DFly(c) => Some(c),
            _ => None,
        }
    }

    pub fn dspark(&self) -> Option<&DSparkConfig> {
        match self {
            DFlashVariant::DSpark(c) => Some(c),
            _ => None,
        }
    }
}

fn reject(reason: impl Into<String>) -> ModelError {
    ModelError::Usage(format!("DFlash drafter: {}", reason.into()))
}

impl DFlashConfig {
    /// Reads and checks the `dflash.*` keys against the target.
    pub fn from_gguf(file: &GgufFile, target: &ModelConfig) -> Result<Self, ModelError> {
        Self::read(&FileTensors::new(file), target)
    }

    /// [`Self::from_gguf`], taking the tensors it reads (`layer_fusion`,
    /// `d2t`) from `tensors`.
    fn read(tensors: &FileTensors, target: &ModelConfig) -> Result<Self, ModelError> {
        let file = tensors.file();
        let md = file.metadata();
        let arch = md.get_str("general.architecture")?;
        if arch != "dflash" {
            return Err(reject(format!(
                "general.architecture is `{arch}`, expected `dflash`"
            )));
        }
        if md.contains_key("dflash.hyper_connection_count") {
            return Err(reject("DSpark-DSV4 drafters are not supported"));
        }
        // PrismML's GIDD DSpark adds a log-SNR embedding to the block rows;
        // running such a file without it would draft from the wrong inputs.
        if md.opt_bool("dflash.log_snr_conditioning")? == Some(true) {
            let (lo, hi) = (
                md.opt_f32("dflash.min_log_snr")?,
                md.opt_f32("dflash.max_log_snr")?,
            );
            let valid = matches!((lo, hi), (Some(lo), Some(hi)) if lo.is_finite() && hi.is_finite() && lo < hi);
            return Err(reject(if valid {
                "log-SNR conditioned DSpark drafters (dflash.log_snr_conditioning) are not supported".to_string()
            } else {
                format!("dflash.log_snr_conditioning requires finite min_log_snr < max_log_snr, got {lo:?} and {hi:?}")
            }));
        }
        // DFly first: its own rejections of d2t and markov_w1 say more.
        let is_dfly = file.tensor("layer_fusion").is_some();
        let is_dspark = !is_dfly && file.tensor("markov_w1.weight").is_some();
        // Without DFly's fusion there is no correction to run; on a Markov
        // head it would not even be clear what to run.
        if is_dspark && CORRECTION.iter().any(|n| file.tensor(n).is_some()) {
            return Err(reject("DSpark drafter (tensor `markov_w1.weight`) carries a predecessor correction (`hidden_correction.*`), which needs DFly's fusion (`layer_fusion`); supporting the lineage properly would mean deciding how a markov bias and a predecessor correction compose on the same block, which is not something to guess at"));
        }
        if !is_dfly && !is_dspark && md.opt_bool("dflash.has_confidence_head")? == Some(true) {
            return Err(reject("metadata declares a confidence head, but markov_w1.weight is missing: the file would load as plain DFlash and read drafts one row late"));
        }
        let layers = md
            .opt_i32_array("dflash.target_layers")?
            .ok_or_else(|| reject("DFlash model requires 'target_layers' in GGUF metadata"))?;
        if layers.is_empty() {
            return Err(reject("`dflash.target_layers` is empty"));
        }
        let mut target_layers = Vec::with_capacity(layers.len());
        for l in layers {
            match usize::try_from(l) {
                Ok(l) if l <= target.n_layer => target_layers.push(l),
                _ => {
                    return Err(reject(format!(
                        "target layer {l} is outside the target's 0..={} (ids are +1-shifted; {} = final pre-norm output)",
                        target.n_layer, target.n_layer
                    )))
                }
            }
        }
        let mask = match (
            md.opt_u64("tokenizer.ggml.mask_token_id")?,
            md.opt_u64("dflash.mask_token_id")?,
        ) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) => return Err(reject("no mask token (`tokenizer.ggml.mask_token_id`)")),
        };
        if mask >= target.n_vocab as u64 {
            return Err(reject(format!(
                "mask token {mask} is outside the target vocabulary of {}",
                target.n_vocab
            )));
        }
        // Before the generic block-size check: DFlash2 has no default.
        let variant = if is_dfly {
            DFlashVariant::DFly(
                DFlyConfig::from_gguf(tensors, target_layers.len()).map_err(reject)?,
            )
        } else if is_dspark {
            DFlashVariant::DSpark(DSparkConfig::from_gguf(file)?)
        } else if file.tensor("selector_hidden.weight").is_some() {
            let n_embd = md
                .opt_usize("dflash.embedding_length")?
                .unwrap_or(target.n_embd);
            DFlashVariant::DFlash2(DFlash2Config::from_gguf(file, n_embd).map_err(reject)?)
        } else {
            DFlashVariant::V1
        };
        // DFly's own check rejected d2t above.
        let d2t =
            match (file.tensor("d2t"), file.tensor("output.weight")) {
                (None, _) => None,
                (Some(_), None) => return Err(reject(
                    "tensor `d2t` needs the drafter's own `output.weight` {n_embd, n_vocab_draft}",
                )),
                (Some(_), Some(head)) => {
                    let rows = head.dims.get(1).copied().unwrap_or(0) as usize;
                    Some(load_d2t(tensors, rows, target.n_vocab)?)
                }
            };
        let block_size = md.opt_u64("dflash.block_size")?.unwrap_or(16) as usize;
        if block_size < 2 {
            return Err(reject(format!(
                "block size {block_size} leaves no room for a draft"
            )));
        }
        let causal = md.opt_bool("dflash.attention.causal")?.unwrap_or(false);
        Ok(DFlashConfig {
            target_layers,
            block_size,
            mask_token: mask as u32,
            causal,
            variant,
            d2t,
        })
    }

    /// Tensors the variant may carry without reading them. Only DSpark's
    /// confidence head declared absent: PrismML's loader requires
    /// `conf_proj` on every DSpark file, so such files still ship it.
    pub fn known_optional(&self) -> &'static [&'static str] {
        match &self.variant {
            DFlashVariant::DSpark(ds) if ds.has_confidence_head == Some(false) => {
                &[CONF_WEIGHT, CONF_BIAS]
            }
            _ => &[],
        }
    }

    /// First block row that predicts: 0 for anchor-first DSpark, else 1.
    pub fn first_row(&self) -> usize {
        match &self.variant {
            DFlashVariant::DSpark(d) if d.sample_from_anchor => 0,
            _ => 1,
        }
    }
}

/// Weights of the context path.
struct ContextWeights<B: Backend> {
    fc: B::Weight,
    /// `enc.output_norm`, or DFly's `context_norm`.
    norm: B::Weight,
}

/// Scratch tensors of the context path.
struct ContextScratch<B: Backend> {
    /// Row capacity.
    rows: usize,
    projected: B::Tensor,
    c: B::Tensor,
    k: B::Tensor,
    k_normed: B::Tensor,
    v: B::Tensor,
}

/// What a variant adds to the shared weights.
enum VariantWeights<B: Backend> {
    V1,
    DFlash2(V2<B>),
    DFly {
        /// The predecessor correction, when the file has it.
        correction: Option<Correction<B>>,
    },
    DSpark {
        /// The Markov (and confidence) head.
        markov: MarkovHead,
        /// The Markov chain on the device, when its weights can live there
        /// and the head is the full vocabulary.
        device: Option<DeviceMarkov<B>>,
    },
}

/// A sequence's scratch for its variant.
enum VariantScratch<B: Backend> {
    V1,
    DFlash2(V2Scratch<B>),
    DFly {
        /// Every layer's context, `[rows × L·d]` layer-major per row.
        contexts: B::Tensor,
        /// One layer's fused (not yet normed) context.
        fused: B::Tensor,
        correction: Option<CorrectionScratch<B>>,
    },
    DSpark {
        device: Option<DeviceMarkovScratch<B>>,
    },
}

/// DFlash2's weights beyond the layers.
struct V2<B: Backend> {
    convs: Convs<B>,
    selector: Selector<B>,
    /// The walk without a readback; `None` where it cannot match the host's.
    device: Option<DeviceSelector<B>>,
}

/// A sequence's scratch for [`V2`].
struct V2Scratch<B: Backend> {
    convs: ConvScratch<B>,
    gates: B::Tensor,
    device: Option<DeviceSelectorScratch<B>>,
}

/// A DFlash-family drafter's weights, loaded once per file and shared
/// (behind an `Arc`) by every sequence that drafts with it: a new
/// [`DFlashDrafter`] allocates its caches and scratch, and uploads nothing.
pub struct DFlashModel<B: Backend> {
    pub config: DFlashConfig,
    decoder: Decoder<B>,
    ctx: ContextWeights<B>,
    variant: VariantWeights<B>,
}

impl<B: Backend> DFlashModel<B> {
    /// Loads a drafter's weights for `target` (which lends its embeddings
    /// and head when the drafter has none). A tensor in the file that the
    /// detected variant does not read (bar [`DFlashConfig::known_optional`])
    /// is a [`ModelError::UnusedTensors`].
    pub fn load(file: &GgufFile, target: &Decoder<B>) -> Result<Self, ModelError> {
        let mut tensors = FileTensors::with_role(file, WeightRole::Proposer);
        let config = DFlashConfig::read(&tensors, &target.config)?;
        let mut mcfg =
            ModelConfig::from_metadata_with_vocab(file.metadata(), target.config.n_vocab)?;
        if let Some(d2t) = &config.d2t {
            mcfg.n_vocab_head = d2t.len();
        }
        debug_assert_eq!(mcfg.arch, Architecture::DFlash);
        if mcfg.n_embd != target.config.n_embd {
            return Err(reject(format!(
                "n_embd {} differs from the target's {}",
                mcfg.n_embd, target.config.n_embd
            )));
        }
        if mcfg.n_vocab != target.config.n_vocab {
            return Err(reject(format!(
                "vocabulary {} differs from the target's {}",
                mcfg.n_vocab, target.config.n_vocab
            )));
        }
        let be = target.backend.clone();
        let decoder =
            Decoder::load_with_config(mcfg, &mut tensors, Some(target), be.clone(), &mut |_| {})?;
        let d = decoder.config.n_embd as u64;
        let width = config.target_layers.len() as u64 * d;
        let load = |name: &str, dims: &[u64]| tensors.weight(&*be, name, dims);
        let norm = match config.variant {
            DFlashVariant::DFly(_) => "context_norm.weight",
            _ => "enc.output_norm.weight",
        };
        let ctx = ContextWeights {
            fc: load("fc.weight", &[width, d])?,
            norm: load(norm, &[d])?,
        };
        let c = &decoder.config;
        let variant = match &config.variant {
            DFlashVariant::V1 => VariantWeights::V1,
            DFlashVariant::DFlash2(v2) => VariantWeights::DFlash2(V2 {
                convs: Convs::load(&*be, &tensors, v2, c.n_layer, c.n_embd)?,
                selector: Selector::load(&*be, &tensors, v2, c.n_embd, c.n_vocab)?,
                device: match config.d2t {
                    None => DeviceSelector::load(&*be, &tensors, v2, c.n_vocab)?,
                    Some(_) => None,
                },
            }),
            DFlashVariant::DFly(f) => VariantWeights::DFly {
                correction: match f.hidden_correction {
                    true => Some(Correction::load(&*be, &tensors, c.n_embd)?),
                    false => None,
                },
            },
            DFlashVariant::DSpark(ds) => VariantWeights::DSpark {
                markov: MarkovHead::load(&tensors, ds, c.n_embd, c.n_vocab, c.n_vocab_head)?,
                device: match config.d2t {
                    None => DeviceMarkov::load(&*be, &tensors, ds, c.n_vocab)?,
                    Some(_) => None,
                },
            },
        };
        // Every tensor accounted for: one the variant never reads (another
        // variant's, a stale or a misnamed one) would silently make the
        // drafter something other than what was exported.
        let unused: Vec<String> = tensors
            .untaken()
            .into_iter()
            .filter(|n| !config.known_optional().contains(&n.as_str()))
            .collect();
        if !unused.is_empty() {
            return Err(ModelError::UnusedTensors {
                variant: config.variant.name(),
                names: unused,
            });
        }
        Ok(DFlashModel {
            config,
            decoder,
            ctx,
            variant,
        })
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.decoder.config
    }

    /// One whole draft from a context of one zero row, on a throwaway
    /// drafter: what a first draft does for the first time (weights paged
    /// in and repacked, pipelines built) belongs to loading, as the
    /// target's warm-up pass does, not to the first probe, whose cost the
    /// policy charges against speculation (on SmolLM2 it was 1.5 plain
    /// steps against a warm draft's 0.15).
    pub async fn warm_up(self: &Arc<Self>) -> Result<(), ModelError> {
        let block = self.config.block_size;
        let width = self.config.target_layers.len() * self.decoder.config.n_embd;
        let taps = self.decoder.backend.tensor(1, width);
        let mut drafter = DFlashDrafter::new(self.clone(), block + 2, block);
        drafter.observe(&[0], 0, Some(&taps)).await?;
        drafter.propose(&[0], block).await?;
        Ok(())
    }
}

/// One sequence's DFlash drafter: the shared weights ([`DFlashModel`]),
/// and the sequence's own context cache, pending taps and scratch.
pub struct DFlashDrafter<B: Backend> {
    model: Arc<DFlashModel<B>>,
    scratch: ContextScratch<B>,
    state: DecoderState<B>,
    variant: VariantScratch<B>,
    /// The anchor id (1 x 1) for the chains drafted on the device.
    anchor: B::Tensor,
    /// Taps observed but not injected yet: while speculation is off the
    /// target's rows are only copied here, and injected in one batch when
    /// a draft needs them (see [`Self::inject_pending`]).
    pending: Pending<B>,
    /// Stop drafting at the first row whose top probability (DSpark: whose
    /// confidence) is below this.
    pub p_min: f32,
}

impl<B: Backend> DFlashDrafter<B> {
    /// A drafter for one sequence of the target whose cache holds `n_ctx`
    /// positions, injecting up to `max_batch` context rows at once.
    pub fn new(model: Arc<DFlashModel<B>>, n_ctx: usize, max_batch: usize) -> Self {
        let be = &*model.decoder.backend;
        let c = &model.decoder.config;
        let rows = max_batch.max(1);
        let scratch = ContextScratch {
            rows,
            projected: be.tensor(rows, c.n_embd),
            c: be.tensor(rows, c.n_embd),
            k: be.tensor(rows, c.kv_dim()),
            k_normed: be.tensor(rows, c.kv_dim()),
            v: be.tensor(rows, c.kv_dim()),
        };
        let max_block = model.config.block_size.max(rows);
        let state = model.decoder.new_state(n_ctx, max_block);
        let variant = match &model.variant {
            VariantWeights::V1 => VariantScratch::V1,
            VariantWeights::DFlash2(v2) => VariantScratch::DFlash2(V2Scratch {
                convs: v2.convs.scratch(be, c.n_embd, max_block),
                gates: be.tensor(max_block, v2.selector.rank()),
                device: v2.device.as_ref().map(|d| d.scratch(be, max_block)),
            }),
            VariantWeights::DFly { correction } => VariantScratch::DFly {
                contexts: be.tensor(rows, c.n_layer * c.n_embd),
                fused: be.tensor(rows, c.n_embd),
                correction: correction
                    .as_ref()
                    .map(|cr| cr.scratch(be, c.n_embd, c.n_vocab)),
            },
            VariantWeights::DSpark { device, .. } => VariantScratch::DSpark {
                device: device.as_ref().map(|m| m.scratch(be, c.n_vocab)),
            },
        };
        let width = model.config.target_layers.len() * c.n_embd;
        let pending = Pending {
            taps: Some(be.tensor(rows, width)),
            pos0: 0,
            rows: 0,
            drafted: false,
        };
        DFlashDrafter {
            anchor: be.tensor(1, 1),
            pending,
            scratch,
            state,
            variant,
            p_min: 0.0,
            model,
        }
    }

    /// Loads the weights ([`DFlashModel::load`]) for this one drafter; a
    /// front end that drafts for many sequences loads them once and calls
    /// [`Self::new`] per sequence.
    pub fn load(
        file: &GgufFile,
        target: &Decoder<B>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Self, ModelError> {
        let model = Arc::new(DFlashModel::load(file, target)?);
        Ok(Self::new(model, n_ctx, max_batch))
    }

    /// The shared weights.
    pub fn model(&self) -> &Arc<DFlashModel<B>> {
        &self.model
    }

    pub fn config(&self) -> &DFlashConfig {
        &self.model.config
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.model.decoder.config
    }

    /// Writes the context K/V of the first `n` rows of `taps` (the target's
    /// tapped hidden states, `[rows × T·d]`) at positions `pos0..pos0 + n`.
    pub async fn inject(
        &mut self,
        taps: &B::Tensor,
        pos0: usize,
        n: usize,
    ) -> Result<(), ModelError> {
        self.inject_pending()?;
        self.inject_rows(taps, pos0, n)
    }

    /// Keeps the first `n` rows of `taps` (positions `pos0..pos0 + n`) for
    /// a later injection: a plain step's rows then cost one copy, not a
    /// context projection of one row, and a probe injects the whole gap in
    /// one batch.
    fn defer(&mut self, taps: &B::Tensor, pos0: usize, n: usize) -> Result<(), ModelError> {
        let p = &self.pending;
        if p.rows > 0 && (pos0 != p.pos0 + p.rows || p.rows + n > self.scratch.rows) {
            self.inject_pending()?;
        }
        let (rows, width) = self.model.decoder.backend.shape(taps);
        if n > rows || n > self.scratch.rows {
            return Err(ModelError::Usage(format!(
                "DFlash context of {n} rows from taps of {rows} rows (scratch holds {})",
                self.scratch.rows
            )));
        }
        let p = &mut self.pending;
        let buf = p.taps.as_mut().expect("pending taps are put back");
        if p.rows == 0 {
            p.pos0 = pos0;
        }
        let be = &*self.model.decoder.backend;
        be.reshape(buf, self.scratch.rows, width);
        be.copy_rows(taps, 0, buf, p.rows, 0, n);
        p.rows += n;
        Ok(())
    }

    /// Injects the rows [`Self::defer`] kept; returns how many.
    fn inject_pending(&mut self) -> Result<usize, ModelError> {
        let rows = std::mem::take(&mut self.pending.rows);
        if rows == 0 {
            return Ok(0);
        }
        let mut taps = self.pending.taps.take().expect("pending taps are put back");
        let width = self.model.decoder.backend.shape(&taps).1;
        self.model.decoder.backend.reshape(&mut taps, rows, width);
        let result = self.inject_rows(&taps, self.pending.pos0, rows);
        self.pending.taps = Some(taps);
        result.map(|()| rows)
    }

    fn inject_rows(&mut self, taps: &B::Tensor, pos0: usize, n: usize) -> Result<(), ModelError> {
        let be = &*self.model.decoder.backend;
        let cfg = &self.model.decoder.config;
        let (rows, width) = be.shape(taps);
        let capacity = self.scratch.rows;
        if n > rows
            || rows > capacity
            || width != self.model.config.target_layers.len() * cfg.n_embd
        {
            return Err(ModelError::Usage(format!(
                "DFlash context injection of {n} rows from taps of shape {rows}x{width} (scratch holds {capacity} rows)"
            )));
        }
        self.state.truncate(pos0)?;
        if self.state.len() != pos0 {
            return Err(ModelError::Usage(format!(
                "DFlash context injection at position {pos0}, but the drafter holds only {} positions",
                self.state.len()
            )));
        }
        self.state.kv.reserve(pos0 + n)?;
        let s = &mut self.scratch;
        for t in [&mut s.projected, &mut s.c] {
            be.reshape(t, rows, cfg.n_embd);
        }
        for t in [&mut s.k, &mut s.k_normed, &mut s.v] {
            be.reshape(t, rows, cfg.kv_dim());
        }
        // Rows beyond `n` (rejected drafts) are projected too but never stored.
        be.matmul(&self.model.ctx.fc, taps, &mut s.projected);
        let mut dfly = match (&self.model.config.variant, &mut self.variant) {
            (
                DFlashVariant::DFly(f),
                VariantScratch::DFly {
                    contexts, fused, ..
                },
            ) => {
                be.reshape(contexts, rows, cfg.n_layer * cfg.n_embd);
                be.reshape(fused, rows, cfg.n_embd);
                Some((f, contexts, fused))
            }
            _ => {
                be.rms_norm(
                    &s.projected,
                    &self.model.ctx.norm,
                    cfg.n_embd,
                    cfg.rms_eps,
                    &mut s.c,
                );
                None
            }
        };
        for (il, lw) in self.model.decoder.weights.layers.iter().enumerate() {
            let Some(aw) = lw.attention() else {
                return Err(ModelError::Usage(
                    "a DFlash drafter's layers are attention blocks".into(),
                ));
            };
            // DFly: this layer's context is the shared projection (before
            // any norm) plus its own mix of the raw taps.
            if let Some((f, wide, fused)) = dfly.as_mut() {
                be.copy_rows(&s.projected, 0, fused, 0, 0, rows);
                be.add_slices(taps, &f.fusion[il], fused);
                be.rms_norm(
                    fused,
                    &self.model.ctx.norm,
                    cfg.n_embd,
                    cfg.rms_eps,
                    &mut s.c,
                );
                be.copy_rows(&s.c, 0, wide, 0, il * cfg.n_embd, rows);
            }
            be.matmul(&aw.wk, &s.c, &mut s.k);
            be.matmul(&aw.wv, &s.c, &mut s.v);
            let k = match &aw.k_norm {
                Some(kn) => {
                    be.rms_norm(&s.k, kn, cfg.head_dim, cfg.rms_eps, &mut s.k_normed);
                    &mut s.k_normed
                }
                None => &mut s.k,
            };
            let base = if cfg.swa_layers[il] {
                cfg.rope_base_swa
            } else {
                cfg.rope_base
            };
            let rope = RopeParams {
                style: cfg.rope_style,
                n_head: cfg.n_head_kv,
                head_dim: cfg.head_dim,
                n_rot: cfg.n_rot,
                base,
            };
            be.rope(k, pos0, rope);
            let (kc, vc) = self.state.kv.layer_mut(il);
            be.append_kv(k, &s.v, kc, vc, pos0, n);
        }
        self.state.kv.set_len(pos0 + n);
        Ok(())
    }

    /// The contexts of the last injection, `[rows × width]` (DFly: every
    /// layer's, layer-major within a row; otherwise the single shared one).
    pub async fn contexts(&self) -> Vec<f32> {
        let contexts = match &self.variant {
            VariantScratch::DFly { contexts, .. } => contexts,
            _ => &self.scratch.c,
        };
        self.model.decoder.backend.read(contexts).await
    }

    /// Final-normed hidden rows of the last block (what the head and DFly's
    /// correction read), `[rows × d]`.
    pub async fn block_hidden(&self) -> Vec<f32> {
        self.model
            .decoder
            .backend
            .read(self.state.normed_hidden())
            .await
    }

    /// Base logits (before DFly's correction or DSpark's Markov bias) over
    /// the target vocabulary of the block drafting `n` tokens at the next
    /// position: `[anchor, MASK × n]`, rows 0..=n, row 0 not a prediction;
    /// for anchor-first DSpark `[anchor, MASK × (n − 1)]`, rows 0..n, all
    /// predictions. DFlash2 logits carry the target's output transforms.
    /// With `d2t` the draft rows are scattered into a −inf row.
    pub async fn block_logits(&mut self, anchor: u32, n: usize) -> Result<Vec<f32>, ModelError> {
        let rows = self.block_forward(anchor, n)?;
        let mut logits = self.model.decoder.backend.read(self.state.logits()).await;
        if let DFlashVariant::DFlash2(v2) = &self.model.config.variant {
            v2.transform_logits(&mut logits);
        }
        if let Some(d2t) = &self.model.config.d2t {
            let n_vocab = self.model.decoder.config.n_vocab;
            let mut wide = vec![f32::NEG_INFINITY; rows * n_vocab];
            for (src, dst) in logits
                .chunks_exact(d2t.len())
                .zip(wide.chunks_exact_mut(n_vocab))
            {
                for (&l, &t) in src.iter().zip(d2t) {
                    dst[t as usize] = l;
                }
            }
            logits = wide;
        }
        Ok(logits)
    }

    /// Runs the block drafting `n` tokens (see [`Self::block_logits`]),
    /// leaving its raw logits on the device; returns its row count.
    fn block_forward(&mut self, anchor: u32, n: usize) -> Result<usize, ModelError> {
        self.inject_pending()?;
        let first = self.model.config.first_row();
        let rows = (n.min(self.max_draft()) + first).max(1);
        let pos = self.state.len();
        // The whole trained block runs whatever the draft's length, as in
        // training: its masks attend to each other, and a shorter block
        // changes what every row sees (Qwen2.5-Coder-0.5B's drafter on 12
        // held-out code prompts, first-slot acceptance drafting one token:
        // 0.418 with a 2-row block, 0.438 with all 8). Only the drafting
        // rows reach the head. Near the end of the context, what fits.
        let room = self.state.kv.capacity().saturating_sub(pos);
        let block_rows = (self.max_draft() + first).min(room).max(rows);
        let mut block = vec![self.model.config.mask_token; block_rows];
        block[0] = anchor;
        let mut conv_hook = match (&self.model.variant, &mut self.variant) {
            (VariantWeights::DFlash2(w), VariantScratch::DFlash2(s)) => Some(ConvHook {
                convs: &w.convs,
                scratch: &mut s.convs,
            }),
            _ => None,
        };
        let hook = conv_hook.as_mut().map(|h| h as &mut dyn LayerHook<B>);
        let result = self.model.decoder.forward_hooked(
            &mut self.state,
            &block,
            LogitRows::First(rows),
            self.model.config.causal,
            None,
            hook,
        );
        // The block's own K/V never outlive the round.
        self.state.truncate(pos)?;
        result?;
        Ok(rows)
    }

    /// Whether the greedy draft can stay on the device: every variant's
    /// chain can (argmax rows, DFly's correction, DSpark's Markov head,
    /// DFlash2's selector walk), but not reduced heads (their ids need the
    /// `d2t` map) nor early stops (`p_min`), whose draft length the host
    /// must know before verifying.
    fn drafts_on_device(&self) -> bool {
        self.model.config.d2t.is_none()
            && self.p_min <= 0.0
            && match (&self.model.variant, &self.variant) {
                (VariantWeights::DFlash2(v2), _) => v2.device.is_some(),
                (_, VariantScratch::DSpark { device }) => device.is_some(),
                _ => true,
            }
    }

    /// Runs the block and drafts its prediction rows in order, `pick`
    /// choosing each row's token from its logits (`None` stops). With DFly's
    /// correction row i's logits are corrected by the token picked at row
    /// i − 1 (the anchor for row 1); with DSpark's Markov head they are
    /// biased by the argmax of the row before (the anchor for the first
    /// prediction row), and with `p_min > 0` the draft stops at the first
    /// row whose confidence is below it. The rows are thus sequential.
    /// Returns the tokens and the logits of the rows up to the last drafted.
    pub async fn draft_block(
        &mut self,
        anchor: u32,
        n: usize,
        pick: &mut dyn FnMut(&[f32]) -> Option<u32>,
    ) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        let mut logits = self.block_logits(anchor, n).await?;
        let n_vocab = self.model.decoder.config.n_vocab;
        let eps = self.model.decoder.config.rms_eps;
        let first = self.model.config.first_row();
        let markov = match &self.model.variant {
            VariantWeights::DSpark { markov, .. } => Some(markov),
            _ => None,
        };
        if markov.is_some_and(|m| self.p_min > 0.0 && !m.has_confidence()) {
            return Err(reject(
                "DSpark draft has no confidence head: please set p_min 0",
            ));
        }
        let hidden = match markov {
            Some(_) if self.p_min > 0.0 => self.block_hidden().await,
            _ => Vec::new(),
        };
        let d = self.model.decoder.config.n_embd;
        let mut tokens = Vec::new();
        let mut prev = anchor;
        for i in first..logits.len() / n_vocab {
            let row = &mut logits[i * n_vocab..(i + 1) * n_vocab];
            if let (
                VariantWeights::DFly {
                    correction: Some(c),
                },
                VariantScratch::DFly {
                    correction: Some(cs),
                    ..
                },
            ) = (&self.model.variant, &mut self.variant)
            {
                let w = &self.model.decoder.weights;
                row.copy_from_slice(
                    &c.row_logits(
                        cs,
                        &*self.model.decoder.backend,
                        self.state.normed_hidden(),
                        i,
                        prev,
                        &w.tok_embd,
                        w.head(),
                        eps,
                    )
                    .await,
                );
            }
            let mut next = None;
            if let Some(m) = markov {
                if self.p_min > 0.0 {
                    let conf = m.confidence(&hidden[i * d..(i + 1) * d], prev);
                    if conf.is_some_and(|c| c < self.p_min) {
                        break;
                    }
                }
                m.add_bias(row, prev, self.model.config.d2t.as_deref());
                // The chain is greedy at any temperature (llama.cpp's graph).
                next = Some(argmax(row));
            }
            match pick(row) {
                Some(t) => {
                    tokens.push(t);
                    prev = next.unwrap_or(t);
                }
                None => break,
            }
        }
        logits.truncate((first + tokens.len()).max(1) * n_vocab);
        Ok((tokens, logits))
    }

    /// DFlash2: runs the block and returns the selector's candidates of
    /// rows 1..=n. `None` for a v1 drafter.
    pub async fn block_lattice(
        &mut self,
        anchor: u32,
        n: usize,
    ) -> Result<Option<Lattice>, ModelError> {
        if !matches!(self.model.variant, VariantWeights::DFlash2(_)) {
            return Ok(None);
        }
        let logits = self.block_logits(anchor, n).await?;
        let be = &*self.model.decoder.backend;
        let (VariantWeights::DFlash2(v2), VariantScratch::DFlash2(scratch)) =
            (&self.model.variant, &mut self.variant)
        else {
            unreachable!("a DFlash2 drafter has DFlash2 scratch");
        };
        let hidden = self.state.normed_hidden();
        let rows = be.shape(hidden).0;
        let rank = v2.selector.rank();
        be.reshape(&mut scratch.gates, rows, rank);
        be.matmul(&v2.selector.hidden, hidden, &mut scratch.gates);
        let gates = be.read(&scratch.gates).await;
        let n_vocab = self.model.decoder.config.n_vocab;
        Ok(Some(v2.selector.lattice(
            &logits[n_vocab..],
            &gates[rank..],
            n_vocab,
        )))
    }

    /// DSpark's confidence of block row `row` (of the last block) given the
    /// token `prev` chosen before it; `None` without a confidence head.
    pub async fn confidence(&self, row: usize, prev: u32) -> Option<f32> {
        let VariantWeights::DSpark { markov, .. } = &self.model.variant else {
            return None;
        };
        let d = self.model.decoder.config.n_embd;
        let h = self.block_hidden().await;
        markov.confidence(&h[row * d..(row + 1) * d], prev)
    }

    /// DFlash2's greedy walk over `lattice` from `anchor` (no p_min stop
    /// when `p_min` is 0); empty for a v1 drafter.
    pub fn walk(&self, lattice: &Lattice, anchor: u32, p_min: f32) -> Vec<u32> {
        match &self.model.variant {
            VariantWeights::DFlash2(v2) => v2.selector.walk(lattice, anchor, p_min),
            _ => Vec::new(),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl<B: Backend> Drafter<B> for DFlashDrafter<B> {
    fn kind(&self) -> &'static str {
        "dflash"
    }

    fn tap_layers(&self) -> &[usize] {
        &self.model.config.target_layers
    }

    fn max_draft(&self) -> usize {
        // A block's logits must fit the backend's largest tensor too.
        let rows = self.model.config.block_size.min(self.state.logit_rows());
        rows.saturating_sub(self.model.config.first_row())
    }

    async fn observe(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        taps: Option<&B::Tensor>,
    ) -> Result<(), ModelError> {
        let taps =
            taps.ok_or_else(|| ModelError::Usage("DFlash needs the target's taps".into()))?;
        // After a draft the rows go in at once, as part of the round; a
        // plain step's are kept for the next draft.
        if std::mem::take(&mut self.pending.drafted) {
            self.inject(taps, pos0, tokens.len()).await
        } else {
            self.defer(taps, pos0, tokens.len())
        }
    }

    /// Injects the context rows observed since the last draft: after a
    /// gap, its whole catch-up in one batch.
    fn catch_up(&mut self, _history: &[u32], _most: usize) -> Result<usize, ModelError> {
        self.inject_pending()
    }

    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError> {
        let Some(&anchor) = history.last() else {
            return Ok(Draft::default());
        };
        self.inject_pending()?;
        self.pending.drafted = true;
        let n = n_max.min(self.max_draft()).min(
            self.state
                .kv
                .capacity()
                .saturating_sub(self.state.len() + self.model.config.first_row()),
        );
        if n == 0 {
            return Ok(Draft::default());
        }
        if let Some(lattice) = self.block_lattice(anchor, n).await? {
            return Ok(Draft {
                tokens: self.walk(&lattice, anchor, self.p_min),
            });
        }
        // DSpark stops on its confidence head inside the walk instead.
        let p_min = if matches!(self.model.variant, VariantWeights::DSpark { .. }) {
            0.0
        } else {
            self.p_min
        };
        let pick = &mut |row: &[f32]| {
            let best = argmax(row);
            (p_min <= 0.0 || top_probability(row, best) >= p_min).then_some(best)
        };
        let (tokens, _) = self.draft_block(anchor, n, pick).await?;
        Ok(Draft { tokens })
    }

    fn propose_on_device(
        &mut self,
        history: &[u32],
        n_max: usize,
        round: &mut B::Tensor,
    ) -> Result<Option<usize>, ModelError> {
        let Some(&anchor) = history.last() else {
            return Ok(None);
        };
        if !self.drafts_on_device() {
            return Ok(None);
        }
        self.inject_pending()?;
        self.pending.drafted = true;
        let first = self.model.config.first_row();
        let n = n_max.min(self.max_draft()).min(
            self.state
                .kv
                .capacity()
                .saturating_sub(self.state.len() + first),
        );
        if n == 0 {
            return Ok(None);
        }
        self.block_forward(anchor, n)?;
        let be = &*self.model.decoder.backend;
        // The chains start from the anchor in row 0.
        be.write(&mut self.anchor, &[anchor as f32]);
        be.copy_rows(&self.anchor, 0, round, 0, 0, 1);
        let (logits, hidden) = (self.state.logits(), self.state.normed_hidden());
        let w = &self.model.decoder.weights;
        let eps = self.model.decoder.config.rms_eps;
        let model = &*self.model;
        match (&model.variant, &mut self.variant) {
            (
                VariantWeights::DFlash2(V2 {
                    device: Some(device),
                    selector,
                    ..
                }),
                VariantScratch::DFlash2(V2Scratch {
                    device: Some(s), ..
                }),
            ) => device.walk(s, be, &selector.hidden, logits, hidden, &self.anchor, round),
            (
                VariantWeights::DFly {
                    correction: Some(c),
                },
                VariantScratch::DFly {
                    correction: Some(s),
                    ..
                },
            ) => {
                for row in 1..=n {
                    c.draft_row(s, be, hidden, row, &w.tok_embd, w.head(), eps, round);
                }
            }
            (
                VariantWeights::DSpark {
                    device: Some(m), ..
                },
                VariantScratch::DSpark { device: Some(s) },
            ) => {
                // Prediction row `first + i` drafts the token of round row i + 1.
                for i in 0..n {
                    m.draft_row(s, be, logits, first + i, i + 1, round);
                }
            }
            _ => {
                // Rows 1..=n of the block predict the drafts; row 0 (the
                // anchor's own prediction) is put back to the anchor.
                be.argmax_to(logits, round, 0, 0);
                be.copy_rows(&self.anchor, 0, round, 0, 0, 1);
            }
        }
        Ok(Some(n))
    }

    fn rollback(&mut self, len: usize) -> Result<(), ModelError> {
        self.state.truncate(len)?;
        let p = &mut self.pending;
        p.rows = p.rows.min(len.saturating_sub(p.pos0));
        Ok(())
    }
}

/// Taps kept for a later injection: `rows` rows from position `pos0`.
struct Pending<B: Backend> {
    /// `None` only while they are being injected.
    taps: Option<B::Tensor>,
    pos0: usize,
    rows: usize,
    /// Whether a draft was made since the last observed rows.
    drafted: bool,
}

/// Softmax probability of `row[best]`.
fn top_probability(row: &[f32], best: u32) -> f32 {
    let m = row[best as usize];
    1.0 / row.iter().map(|&l| (l - m).exp()).sum::<f32>()
}
