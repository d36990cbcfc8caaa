//! One decoder for every supported architecture, driven by GGUF metadata.

mod config;
mod hybrid;
mod weights;

pub use config::{Architecture, DeltaNetConfig, ModelConfig};
pub use hybrid::{RecurrentMemory, MAX_ROLLBACK_ROWS};
mod streamed;

pub use streamed::{StreamedModel, StreamingLoad};
pub use weights::{
    AttentionWeights, Borrowed, DecoderWeights, DeltaNetWeights, FileTensors, LayerWeights, Mixer,
    TensorLoader, TensorSource,
};

use crate::backend::{
    tensor_bytes, AttentionMask, AttentionParams, AttentionStep, Backend, BackendError,
    GatedActivation, HeadNorms, KvType, MemoryLimits, PendingBranch, Projection, RopeParams,
    RowNorm, WeightRole,
};
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use blockdraft_gguf::GgufFile;
use hybrid::HybridScratch;
use std::sync::Arc;

fn projection<'a, B: Backend>(
    weight: &'a B::Weight,
    bias: Option<&'a B::Weight>,
    out: &'a mut B::Tensor,
) -> Projection<'a, B> {
    Projection { weight, bias, out }
}

/// Largest magnitude a tapped feature keeps (the f16 range).
pub const TAP_LIMIT: f32 = 65504.0;

/// Which rows of a forward pass produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    None,
    /// Only the last row (prefill, plain decoding).
    Last,
    /// Every row (verification of a drafted block, scoring).
    All,
    /// The first rows, as many as given (a block drafter's drafting rows;
    /// the rest of its block shapes them but is not read).
    First(usize),
}

/// Hidden states to capture during a forward pass: the input of each listed
/// block, where `n_layer` means the output of the last block before the
/// final norm. Captured rows are concatenated per token in list order, so
/// row `r` of `out` is `[h_{l0}(r) | h_{l1}(r) | ...]`, with NaN set to 0
/// and magnitudes clamped to [`TAP_LIMIT`].
pub struct Taps<B: Backend> {
    layers: Vec<usize>,
    out: B::Tensor,
    n_embd: usize,
    max_rows: usize,
}

impl<B: Backend> Taps<B> {
    pub fn new(
        backend: &B,
        cfg: &ModelConfig,
        layers: &[usize],
        max_rows: usize,
    ) -> Result<Self, ModelError> {
        if let Some(&l) = layers.iter().find(|&&l| l > cfg.n_layer) {
            return Err(ModelError::TapOutOfRange {
                layer: l,
                n_layer: cfg.n_layer,
            });
        }
        let out = backend.tensor(max_rows, layers.len().max(1) * cfg.n_embd);
        Ok(Taps {
            layers: layers.to_vec(),
            out,
            n_embd: cfg.n_embd,
            max_rows,
        })
    }

    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// The captured rows of the last forward pass (`n x layers·n_embd`).
    pub fn output(&self) -> &B::Tensor {
        &self.out
    }

    /// Most rows of one pass.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Takes row `row` of `from`'s last pass as this one's only row (a
    /// sequence's share of a batched pass).
    pub fn copy_row(&mut self, backend: &B, from: &Taps<B>, row: usize) -> Result<(), ModelError> {
        if from.layers != self.layers || from.n_embd != self.n_embd {
            return Err(ModelError::Usage(
                "taps of other layers cannot be copied".into(),
            ));
        }
        self.prepare(backend, 1)?;
        backend.copy_rows(&from.out, row, &mut self.out, 0, 0, 1);
        Ok(())
    }

    /// Shapes the output for `n` rows.
    fn prepare(&mut self, backend: &B, n: usize) -> Result<(), ModelError> {
        let width = self.layers.len().max(1) * self.n_embd;
        if n > self.max_rows {
            return Err(ModelError::Usage(format!(
                "taps hold {} rows, the forward pass has {n}",
                self.max_rows
            )));
        }
        backend.reshape(&mut self.out, n, width);
        Ok(())
    }

    fn capture(&mut self, backend: &B, layer: usize, h: &B::Tensor, n: usize) {
        for (slot, _) in self.layers.iter().enumerate().filter(|(_, &l)| l == layer) {
            backend.copy_rows(h, 0, &mut self.out, 0, slot * self.n_embd, n);
        }
    }
}

/// The token ids of a forward pass: from the host, or in a device tensor.
enum TokenInput<'a, B: Backend> {
    Host(&'a [u32]),
    Device {
        ids: &'a B::Tensor,
        row0: usize,
        n: usize,
    },
}

/// Where a [`LayerHook`] sees a layer's activations (`n x n_embd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookPoint {
    /// The attention-normed input, before Q/K/V.
    AttnInput,
    /// The attention output projection, before the residual add.
    AttnOutput,
    /// The FFN-normed input, before gate/up.
    FfnInput,
    /// The FFN down projection, before the residual add.
    FfnOutput,
}

/// Rewrites activations in place inside the layer loop; lets a drafter
/// (DFlash2's convolutions) reuse the decoder without its own loop.
pub trait LayerHook<B: Backend> {
    fn apply(&mut self, be: &B, layer: usize, point: HookPoint, x: &mut B::Tensor);
}

/// A loaded decoder: config, resident weights, backend.
pub struct Decoder<B: Backend> {
    pub config: ModelConfig,
    pub weights: DecoderWeights<B>,
    pub backend: Arc<B>,
    /// How the states it makes store keys and values ([`Self::with_kv_type`]).
    kv_type: KvType,
}

impl<B: Backend> Decoder<B> {
    /// Loads the decoder in `file` onto `backend`; `on_progress` receives
    /// the bytes loaded so far.
    pub fn load(
        file: &GgufFile,
        backend: Arc<B>,
        on_progress: &mut dyn FnMut(u64),
    ) -> Result<Self, ModelError> {
        Self::load_as(file, backend, WeightRole::Target, on_progress)
    }

    /// [`Self::load`] with its weights made resident for `role` (a draft
    /// model's: [`WeightRole::Proposer`]).
    pub fn load_as(
        file: &GgufFile,
        backend: Arc<B>,
        role: WeightRole,
        on_progress: &mut dyn FnMut(u64),
    ) -> Result<Self, ModelError> {
        let config = ModelConfig::from_metadata(file.metadata())?;
        // Refused before anything is loaded, rather than aborting midway.
        let weight_bytes = file.tensors().iter().map(|t| t.n_bytes).sum();
        backend
            .memory_limits()
            .check_bytes("the model's weights", weight_bytes)?;
        let mut tensors = FileTensors::with_role(file, role);
        let decoder = Self::load_with_config(config, &mut tensors, None, backend, on_progress)?;
        // Unlike a drafter's, a model's file may hold tensors that serve
        // another use (an MTP layer for self-speculation): noted, not refused.
        let ignored = tensors.untaken();
        if !ignored.is_empty() {
            log::debug!(
                "{} tensor(s) of the model are not used: {}",
                ignored.len(),
                ignored.join(", ")
            );
        }
        Ok(decoder)
    }

    /// Loads with an explicit config from `source`; embeddings and head
    /// missing there are the ones of `borrow_from` (a drafter's target).
    pub fn load_with_config(
        config: ModelConfig,
        source: &mut dyn TensorSource<B>,
        borrow_from: Option<&Decoder<B>>,
        backend: Arc<B>,
        on_progress: &mut dyn FnMut(u64),
    ) -> Result<Self, ModelError> {
        if config.is_hybrid() && !backend.runs_hybrid_blocks() {
            return Err(ModelError::Backend(BackendError::Unsupported {
                what: format!(
                    "{} models (gated-DeltaNet blocks) on {}: use the CPU backend",
                    config.arch.name(),
                    backend.name()
                ),
            }));
        }
        let mut loader = TensorLoader {
            source,
            backend: &*backend,
            on_progress,
            loaded_bytes: 0,
            borrow_from: borrow_from.map(|t| Borrowed {
                config: &t.config,
                weights: &t.weights,
            }),
        };
        let weights = DecoderWeights::load(&config, &mut loader)?;
        // An upload the device refused (out of memory) shows up here.
        crate::backend::check_device(&*backend)?;
        Ok(Decoder {
            config,
            weights,
            backend,
            kv_type: KvType::DEFAULT,
        })
    }

    /// States made from now on store their keys and values as `ty`.
    pub fn with_kv_type(mut self, ty: KvType) -> Self {
        self.kv_type = ty;
        self
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    /// A fresh sequence state holding `n_ctx` positions and forward passes of
    /// up to `max_batch` rows (fewer where the backend's tensors cannot hold
    /// that many: see [`DecoderState::max_batch`] and
    /// [`DecoderState::logit_rows`]).
    pub fn new_state(&self, n_ctx: usize, max_batch: usize) -> DecoderState<B> {
        let rows = PassRows::new::<B>(&self.config, self.backend.memory_limits(), max_batch);
        DecoderState::new(&*self.backend, &self.config, n_ctx, rows, self.kv_type)
    }

    /// One forward pass of one token, read back: the costs of a first pass
    /// (paging the weights in, the CPU backend's repacking, a GPU's shader
    /// compilation) paid here, so that front ends report them apart from
    /// the prefill of the first prompt.
    pub async fn warm_up(&self) -> Result<(), ModelError> {
        let mut state = self.try_new_state(1, 1)?;
        self.forward(&mut state, &[0], LogitRows::Last, true, None)?;
        self.backend.argmax(state.logits()).await;
        Ok(())
    }

    /// Activations for [`Self::forward_batch`] passes of up to `max_rows`
    /// rows (fewer where the backend's tensors hold fewer) from up to
    /// `max_seqs` sequences.
    pub fn new_batch(&self, max_rows: usize, max_seqs: usize) -> BatchState<B> {
        let be = &*self.backend;
        let rows = PassRows::new::<B>(&self.config, be.memory_limits(), max_rows.max(max_seqs));
        let max_seqs = max_seqs.clamp(1, rows.logit_rows);
        BatchState {
            scratch: Scratch::new(be, &self.config, rows.max_batch),
            logits: be.tensor(max_seqs, self.config.n_vocab_head),
            max_rows: rows.max_batch,
            max_seqs,
        }
    }

    /// [`Self::new_state`] for sizes a user chose: refused with
    /// [`ModelError::MemoryLimit`] where the backend cannot hold it (use
    /// [`ModelConfig::context_size`] for `n_ctx` first).
    pub fn try_new_state(
        &self,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<DecoderState<B>, ModelError> {
        let limits = self.backend.memory_limits();
        let rows = PassRows::new::<B>(&self.config, limits, max_batch);
        let sizes = DecoderState::<B>::sizes(&self.config, n_ctx, rows, self.kv_type);
        limits.check(&format!("a context of {n_ctx} positions"), &sizes)?;
        Ok(DecoderState::new(
            &*self.backend,
            &self.config,
            n_ctx,
            rows,
            self.kv_type,
        ))
    }

    /// Runs `tokens` through the decoder at the next positions of `state`,
    /// appending their keys/values to its cache. `causal = false` lets the
    /// rows of this call see each other in both directions.
    pub fn forward(
        &self,
        state: &mut DecoderState<B>,
        tokens: &[u32],
        logits: LogitRows,
        causal: bool,
        taps: Option<&mut Taps<B>>,
    ) -> Result<(), ModelError> {
        self.forward_hooked(state, tokens, logits, causal, taps, None)
    }

    /// [`Self::forward`] with `hook` applied at every [`HookPoint`].
    pub fn forward_hooked(
        &self,
        state: &mut DecoderState<B>,
        tokens: &[u32],
        logits: LogitRows,
        causal: bool,
        taps: Option<&mut Taps<B>>,
        hook: Option<&mut dyn LayerHook<B>>,
    ) -> Result<(), ModelError> {
        self.check_tokens(tokens)?;
        self.forward_input(state, TokenInput::Host(tokens), logits, causal, taps, hook)
    }

    /// [`Self::forward`] of `n` tokens whose ids are on the device, in
    /// column 0 of rows `row0..row0 + n` of `ids` (as
    /// [`crate::backend::SamplingOps::argmax_to`] writes them): drafted tokens are verified
    /// without a readback.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_device(
        &self,
        state: &mut DecoderState<B>,
        ids: &B::Tensor,
        row0: usize,
        n: usize,
        logits: LogitRows,
        causal: bool,
        taps: Option<&mut Taps<B>>,
    ) -> Result<(), ModelError> {
        let input = TokenInput::Device { ids, row0, n };
        self.forward_input(state, input, logits, causal, taps, None)
    }

    fn forward_input(
        &self,
        state: &mut DecoderState<B>,
        tokens: TokenInput<'_, B>,
        logits: LogitRows,
        causal: bool,
        mut taps: Option<&mut Taps<B>>,
        hook: Option<&mut dyn LayerHook<B>>,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let be = &*self.backend;
        let n = match tokens {
            TokenInput::Host(t) => t.len(),
            TokenInput::Device { n, .. } => n,
        };
        if n == 0 || n > state.max_batch {
            return Err(ModelError::Usage(format!(
                "a forward pass takes 1..={} tokens, got {n}",
                state.max_batch
            )));
        }
        let logit_rows = match logits {
            LogitRows::None => 0,
            LogitRows::Last => 1,
            LogitRows::All => n,
            LogitRows::First(m) => m.min(n),
        };
        if logit_rows > state.logit_rows {
            return Err(ModelError::Usage(format!(
                "a forward pass with logits for its rows takes at most {} of them on this backend \
                 (as many rows of the {}-entry vocabulary as its largest tensor holds), got {logit_rows}",
                state.logit_rows, cfg.n_vocab_head
            )));
        }
        if let Some(t) = taps.as_deref_mut() {
            t.prepare(be, n)?;
        }
        let pos0 = state.kv.len();
        state.kv.reserve(pos0 + n)?;
        if let Some(rec) = &state.recurrent {
            rec.check_pass(n)?;
        }
        self.settle(state)?;
        let s = &mut state.scratch;
        s.shape(be, n, cfg);
        match tokens {
            TokenInput::Host(t) => be.embed(&self.weights.tok_embd, t, &mut s.x),
            TokenInput::Device { ids, row0, .. } => {
                be.embed_from(&self.weights.tok_embd, ids, row0, &mut s.x)
            }
        }
        let (kv, mut rec) = (&mut state.kv, state.recurrent.as_mut());
        self.layers(
            s,
            n,
            taps,
            hook,
            &mut |il, s| match (&mut rec, &mut s.hybrid) {
                (Some(rec), Some(hs)) if cfg.recurrent_layers[il] => self.recur(il, hs, rec),
                _ => self.attend(il, s.attention_tensors(), kv, pos0, causal),
            },
        )?;
        state.kv.set_len(pos0 + n);
        if let Some(rec) = &mut state.recurrent {
            rec.passed(n, true);
        }
        let (s, out) = (&mut state.scratch, &mut state.logits);
        match logits {
            LogitRows::None => {}
            LogitRows::Last => self.head(s, &[n - 1], out),
            LogitRows::All | LogitRows::First(_) => {
                self.head(s, &(0..logit_rows).collect::<Vec<_>>(), out)
            }
        }
        Ok(())
    }

    /// One forward pass over several sequences at once: `parts[i].1` runs
    /// at the next positions of `parts[i].0`, its rows stacked after those
    /// of the parts before it, so that every weight is read once for all
    /// of them while each row attends over its own sequence's cache. A
    /// row's values are those of a pass over its sequence alone (the
    /// kernels do not mix rows). `batch` ([`Self::new_batch`]) holds the
    /// stacked activations and receives the logits of the last row of each
    /// part, in part order; `taps` capture every stacked row.
    pub fn forward_batch(
        &self,
        batch: &mut BatchState<B>,
        parts: &mut [(&mut DecoderState<B>, &[u32])],
        mut taps: Option<&mut Taps<B>>,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let be = &*self.backend;
        let n: usize = parts.iter().map(|(_, t)| t.len()).sum();
        if n == 0 || n > batch.max_rows || parts.len() > batch.max_seqs {
            return Err(ModelError::Usage(format!(
                "a batched pass takes 1..={} rows of at most {} sequences, got {n} rows of {}",
                batch.max_rows,
                batch.max_seqs,
                parts.len()
            )));
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut ids = Vec::with_capacity(n);
        for (state, tokens) in parts.iter() {
            if tokens.is_empty() || tokens.len() > state.max_batch {
                return Err(ModelError::Usage(format!(
                    "each sequence of a batched pass takes 1..={} tokens, got {}",
                    state.max_batch,
                    tokens.len()
                )));
            }
            self.check_tokens(tokens)?;
            state.kv.reserve(state.kv.len() + tokens.len())?;
            if let Some(rec) = &state.recurrent {
                rec.check_pass(tokens.len())?;
            }
            starts.push(ids.len());
            ids.extend_from_slice(tokens);
        }
        if let Some(t) = taps.as_deref_mut() {
            t.prepare(be, n)?;
        }
        for (state, _) in parts.iter_mut() {
            self.settle(state)?;
        }
        let s = &mut batch.scratch;
        s.shape(be, n, cfg);
        be.embed(&self.weights.tok_embd, &ids, &mut s.x);
        self.layers(s, n, taps, None, &mut |il, s| {
            if let (true, Some(hs)) = (cfg.recurrent_layers[il], s.hybrid.as_mut()) {
                for ((state, tokens), &row) in parts.iter_mut().zip(&starts) {
                    // The part's rows through its own state.
                    let m = tokens.len();
                    let (Some(rec), Some(own), Some(dn)) = (
                        state.recurrent.as_mut(),
                        state.scratch.hybrid.as_mut(),
                        cfg.delta_net.as_ref(),
                    ) else {
                        continue;
                    };
                    own.shape(be, m, cfg, dn);
                    be.copy_rows(&hs.mix_in, row, &mut own.mix_in, 0, 0, m);
                    be.copy_rows(&hs.alpha, row, &mut own.alpha, 0, 0, m);
                    be.copy_rows(&hs.beta, row, &mut own.beta, 0, 0, m);
                    self.recur(il, own, rec);
                    be.copy_rows(&own.out, 0, &mut hs.out, row, 0, m);
                }
                return;
            }
            let all = s.attention_tensors();
            for ((state, tokens), &row) in parts.iter_mut().zip(&starts) {
                // The part's rows, through its own scratch: rope at its
                // positions, appended to its cache, attended over it.
                let m = tokens.len();
                let own = &mut state.scratch;
                own.shape(be, m, cfg);
                be.copy_rows(all.q, row, &mut own.q, 0, 0, m);
                be.copy_rows(all.k, row, &mut own.k, 0, 0, m);
                be.copy_rows(all.v, row, &mut own.v, 0, 0, m);
                let pos0 = state.kv.len();
                self.attend(il, own.attention_tensors(), &mut state.kv, pos0, true);
                be.copy_rows(&own.attn, 0, all.attn, row, 0, m);
            }
        })?;
        for (state, tokens) in parts.iter_mut() {
            let len = state.kv.len() + tokens.len();
            state.kv.set_len(len);
            if let Some(rec) = &mut state.recurrent {
                rec.passed(tokens.len(), true);
            }
        }
        let last: Vec<usize> = parts
            .iter()
            .zip(&starts)
            .map(|((_, t), &row)| row + t.len() - 1)
            .collect();
        self.head(&mut batch.scratch, &last, &mut batch.logits);
        Ok(())
    }

    /// Fails on the first id beyond the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        match tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange {
                id,
                n_vocab: self.config.n_vocab,
            }),
            None => Ok(()),
        }
    }

    /// The layer loop over the `n` rows of `s.x`, from the embedded tokens
    /// to the last block's output; `mix` runs what depends on the
    /// sequences the rows belong to: for an attention block, turning `q`,
    /// `k`, `v` into `attn` (rope, cache append and attention); for a
    /// gated-DeltaNet block, the convolution and delta rule over the
    /// sequence's recurrent state.
    fn layers(
        &self,
        s: &mut Scratch<B>,
        n: usize,
        mut taps: Option<&mut Taps<B>>,
        mut hook: Option<&mut dyn LayerHook<B>>,
        mix: &mut dyn FnMut(usize, &mut Scratch<B>),
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let be = &*self.backend;
        let w = &self.weights;
        if let Some(scale) = cfg.embedding_scale {
            be.scale(&mut s.x, scale);
        }
        // A branch output in `s.o` still to go through its post-norm into
        // `s.x`: the next norm's pass adds it (one pass, not two).
        let mut pending: Option<&B::Weight> = None;
        for (il, lw) in w.layers.iter().enumerate() {
            if let Some(t) = taps.as_deref_mut().filter(|t| t.layers.contains(&il)) {
                self.add_pending(s, pending.take());
                t.capture(be, il, &s.x, n);
            }
            pending = match &lw.mixer {
                Mixer::Attention(aw) => {
                    self.attention_block(il, lw, aw, s, pending, hook.as_deref_mut(), mix)?
                }
                Mixer::DeltaNet(dw) => {
                    self.delta_net_block(il, lw, dw, s, pending, hook.as_deref_mut(), mix)?
                }
            };
            // Feed-forward.
            let norm = RowNorm {
                weight: &lw.ffn_norm,
                eps: cfg.rms_eps,
                out: &mut s.xn,
                pending: self.pending_branch(&s.o, pending.take()),
            };
            if let Some(h) = hook.as_deref_mut() {
                let xn = crate::backend::norm_rows(be, &mut s.x, norm);
                h.apply(be, il, HookPoint::FfnInput, xn);
                be.gated_projection(
                    cfg.activation,
                    xn,
                    &lw.w_gate,
                    &lw.w_up,
                    &mut s.gate,
                    &mut s.up,
                    &mut s.hidden,
                );
            } else {
                be.normed_gated_projection(
                    cfg.activation,
                    &mut s.x,
                    norm,
                    &lw.w_gate,
                    &lw.w_up,
                    &mut s.gate,
                    &mut s.up,
                    &mut s.hidden,
                );
            }
            let residual = Residual {
                x: &mut s.x,
                o: &mut s.o,
                xn: &mut s.xn,
            };
            let down = (&lw.w_down, lw.post_ffn_norm.as_ref());
            pending = self.add_branch(
                il,
                HookPoint::FfnOutput,
                down,
                &s.hidden,
                residual,
                hook.as_deref_mut(),
            );
        }
        self.add_pending(s, pending);
        if let Some(t) = taps {
            t.capture(be, cfg.n_layer, &s.x, n);
            // Drafters read taps as f16-range features: a "massive
            // activation" or a NaN must not poison their context.
            be.clamp_finite(&mut t.out, TAP_LIMIT);
        }
        Ok(())
    }

    /// Normed input of layer `il`'s mixer into `projections` (`x` first
    /// taking in `pending`), with `hook` seeing the normed rows where there
    /// is one.
    #[allow(clippy::too_many_arguments)]
    fn mixer_input(
        &self,
        il: usize,
        lw: &LayerWeights<B>,
        (x, xn): (&mut B::Tensor, &mut B::Tensor),
        pending: Option<PendingBranch<'_, B>>,
        hook: Option<&mut (dyn LayerHook<B> + '_)>,
        projections: &mut [Projection<'_, B>],
    ) {
        let (cfg, be) = (&self.config, &*self.backend);
        let norm = RowNorm {
            weight: &lw.attn_norm,
            eps: cfg.rms_eps,
            out: xn,
            pending,
        };
        if let Some(h) = hook {
            let xn = crate::backend::norm_rows(be, x, norm);
            h.apply(be, il, HookPoint::AttnInput, xn);
            be.matmul_many(xn, projections);
        } else {
            be.normed_matmul_many(x, norm, projections);
        }
    }

    /// `pending` (a post-norm weight whose branch output is `output`) as
    /// the next norm takes it in.
    fn pending_branch<'a>(
        &self,
        output: &'a B::Tensor,
        pending: Option<&'a B::Weight>,
    ) -> Option<PendingBranch<'a, B>> {
        pending.map(|post_norm| PendingBranch {
            output,
            post_norm,
            eps: self.config.rms_eps,
        })
    }

    /// Adds `pending`'s branch output (in `s.o`) to `s.x` on its own, where
    /// `s.x` is read before a norm could take it in.
    fn add_pending(&self, s: &mut Scratch<B>, pending: Option<&B::Weight>) {
        if let Some(pn) = pending {
            let be = &*self.backend;
            be.add_normed(&mut s.x, &s.o, pn, self.config.rms_eps, &mut s.xn);
        }
    }

    /// An attention block's mixer: projections, (gated attention: the
    /// gates split off), `mix` (q/k norms, rope, attention), gates, output
    /// projection. Returns the post-norm its output still needs
    /// ([`Self::add_branch`]).
    #[allow(clippy::too_many_arguments)]
    fn attention_block<'w>(
        &'w self,
        il: usize,
        lw: &'w LayerWeights<B>,
        aw: &AttentionWeights<B>,
        s: &mut Scratch<B>,
        pending: Option<&B::Weight>,
        mut hook: Option<&mut (dyn LayerHook<B> + '_)>,
        mix: &mut dyn FnMut(usize, &mut Scratch<B>),
    ) -> Result<Option<&'w B::Weight>, ModelError> {
        let (cfg, be) = (&self.config, &*self.backend);
        let mut gated = match (cfg.gated_attention, s.hybrid.as_mut()) {
            (false, _) => None,
            (true, Some(hs)) => Some(hs),
            (true, None) => return Err(missing_scratch()),
        };
        let q_out = match gated {
            Some(ref mut hs) => &mut hs.q_full,
            None => &mut s.q,
        };
        let mut qkv = [
            projection(&aw.wq, aw.bq.as_ref(), q_out),
            projection(&aw.wk, aw.bk.as_ref(), &mut s.k),
            projection(&aw.wv, aw.bv.as_ref(), &mut s.v),
        ];
        let pending = self.pending_branch(&s.o, pending);
        let (x, xn) = (&mut s.x, &mut s.xn);
        self.mixer_input(il, lw, (x, xn), pending, hook.as_deref_mut(), &mut qkv);
        if let Some(hs) = s.hybrid.as_mut().filter(|_| cfg.gated_attention) {
            be.split_heads(&hs.q_full, cfg.head_dim, &mut s.q, &mut hs.q_gate);
        }
        mix(il, s);
        if let Some(hs) = s.hybrid.as_ref().filter(|_| cfg.gated_attention) {
            be.sigmoid_mul(&mut s.attn, &hs.q_gate);
        }
        let residual = Residual {
            x: &mut s.x,
            o: &mut s.o,
            xn: &mut s.xn,
        };
        let wo = (&aw.wo, lw.post_attn_norm.as_ref());
        Ok(self.add_branch(il, HookPoint::AttnOutput, wo, &s.attn, residual, hook))
    }

    /// A gated-DeltaNet block's mixer: projections, `mix` (convolution
    /// and delta rule), gated norm, output projection. Returns the post-norm
    /// its output still needs ([`Self::add_branch`]).
    #[allow(clippy::too_many_arguments)]
    fn delta_net_block<'w>(
        &'w self,
        il: usize,
        lw: &'w LayerWeights<B>,
        dw: &'w DeltaNetWeights<B>,
        s: &mut Scratch<B>,
        pending: Option<&B::Weight>,
        mut hook: Option<&mut (dyn LayerHook<B> + '_)>,
        mix: &mut dyn FnMut(usize, &mut Scratch<B>),
    ) -> Result<Option<&'w B::Weight>, ModelError> {
        let (cfg, be) = (&self.config, &*self.backend);
        let (Some(hs), Some(dn)) = (s.hybrid.as_mut(), cfg.delta_net.as_ref()) else {
            return Err(missing_scratch());
        };
        let mut projections = [
            projection(&dw.w_qkv, None, &mut hs.mix_in),
            projection(&dw.w_z, None, &mut hs.z),
            projection(&dw.w_beta, None, &mut hs.beta),
            projection(&dw.w_alpha, None, &mut hs.alpha),
        ];
        let pending = self.pending_branch(&s.o, pending);
        self.mixer_input(
            il,
            lw,
            (&mut s.x, &mut s.xn),
            pending,
            hook.as_deref_mut(),
            &mut projections,
        );
        mix(il, s);
        let Some(hs) = s.hybrid.as_mut() else {
            return Err(missing_scratch());
        };
        be.rms_norm(&hs.out, &dw.norm, dn.v_dim, cfg.rms_eps, &mut hs.normed);
        be.gated(GatedActivation::SwiGlu, &hs.z, &hs.normed, &mut hs.out);
        let residual = Residual {
            x: &mut s.x,
            o: &mut s.o,
            xn: &mut s.xn,
        };
        let w_out = (&dw.w_out, lw.post_attn_norm.as_ref());
        Ok(self.add_branch(il, HookPoint::AttnOutput, w_out, &hs.out, residual, hook))
    }

    /// Layer `il`'s convolution and delta rule over `hs`'s projections, on
    /// the sequence's state in `rec` (logging the inputs after a
    /// checkpoint); the output in `hs.out`.
    fn recur(&self, il: usize, hs: &mut HybridScratch<B>, rec: &mut RecurrentMemory<B>) {
        let (cfg, be) = (&self.config, &*self.backend);
        let (Mixer::DeltaNet(dw), Some(dn)) = (&self.weights.layers[il].mixer, &cfg.delta_net)
        else {
            return;
        };
        let n = be.shape(&hs.mix_in).0;
        let at = rec.log_at();
        let l = rec.layer(cfg.slot_of(il));
        if let Some(at) = at {
            be.copy_rows(&hs.mix_in, 0, l.log_in, at, 0, n);
            be.copy_rows(&hs.alpha, 0, l.log_alpha, at, 0, n);
            be.copy_rows(&hs.beta, 0, l.log_beta, at, 0, n);
        }
        be.causal_conv_silu(&hs.mix_in, &dw.conv, l.conv, &mut hs.conv_out);
        let p = dn.params(cfg.rms_eps);
        be.gated_delta_rule(
            &hs.conv_out,
            &hs.alpha,
            &hs.beta,
            &dw.dt_bias,
            &dw.a,
            l.ssm_from,
            l.ssm,
            &mut hs.out,
            p,
        );
    }

    /// Brings `state`'s recurrent memory to its position before a pass: a
    /// rollback's restore and replay, a checkpoint's copy.
    fn settle(&self, state: &mut DecoderState<B>) -> Result<(), ModelError> {
        let (cfg, be) = (&self.config, &*self.backend);
        let Some(rec) = state.recurrent.as_mut() else {
            return Ok(());
        };
        if let Some(keep) = rec.prepare(be).filter(|&k| k > 0) {
            let (Some(hs), Some(dn)) = (state.scratch.hybrid.as_mut(), cfg.delta_net.as_ref())
            else {
                return Err(missing_scratch());
            };
            hs.shape(be, keep, cfg, dn);
            let p = dn.params(cfg.rms_eps);
            for (il, lw) in self.weights.layers.iter().enumerate() {
                let Mixer::DeltaNet(dw) = &lw.mixer else {
                    continue;
                };
                let l = rec.layer(cfg.slot_of(il));
                let logs = [
                    (&mut *l.log_in, dn.conv_dim()),
                    (&mut *l.log_alpha, dn.n_v_heads),
                    (&mut *l.log_beta, dn.n_v_heads),
                ];
                let log_rows = be.shape(&*logs[0].0).0;
                for (t, cols) in logs {
                    be.reshape(t, keep, cols);
                }
                be.causal_conv_silu(l.log_in, &dw.conv, l.conv, &mut hs.conv_out);
                be.gated_delta_rule(
                    &hs.conv_out,
                    l.log_alpha,
                    l.log_beta,
                    &dw.dt_bias,
                    &dw.a,
                    l.ssm_from,
                    l.ssm,
                    &mut hs.out,
                    p,
                );
                for (t, cols) in [
                    (l.log_in, dn.conv_dim()),
                    (l.log_alpha, dn.n_v_heads),
                    (l.log_beta, dn.n_v_heads),
                ] {
                    be.reshape(t, log_rows, cols);
                }
            }
            rec.passed(keep, false);
        }
        rec.rebase_at(be, state.kv.len());
        Ok(())
    }

    /// Adds a residual branch's output projection `w · input` to `r.x`
    /// (`w` with the branch's post-norm, where the architecture has one:
    /// Gemma 3): in one op where nothing sits between, else into `r.o`,
    /// through `hook` at `point`, then the post-norm. Without a hook, a
    /// post-normed output stays in `r.o` and its post-norm is returned: the
    /// next norm adds it to `r.x` in its own pass.
    fn add_branch<'w>(
        &self,
        il: usize,
        point: HookPoint,
        (w, post_norm): (&B::Weight, Option<&'w B::Weight>),
        input: &B::Tensor,
        r: Residual<'_, B>,
        hook: Option<&mut (dyn LayerHook<B> + '_)>,
    ) -> Option<&'w B::Weight> {
        let (cfg, be) = (&self.config, &*self.backend);
        match (hook, post_norm) {
            (None, None) => be.matmul_accumulate(w, input, r.x, r.o),
            (None, Some(pn)) => {
                be.matmul(w, input, r.o);
                return Some(pn);
            }
            (Some(h), post_norm) => {
                be.matmul(w, input, r.o);
                h.apply(be, il, point, r.o);
                match post_norm {
                    Some(pn) => be.add_normed(r.x, r.o, pn, cfg.rms_eps, r.xn),
                    None => be.add(r.x, r.o),
                }
            }
        }
        None
    }

    /// One layer's `q` and `k` rows at positions `pos0..` through their
    /// head norms (where the layer has them) and rope, their keys and values
    /// appended to `kv` there, and attention over it into `t.attn`.
    fn attend(
        &self,
        il: usize,
        t: AttentionTensors<'_, B>,
        kv: &mut KvCache<B>,
        pos0: usize,
        causal: bool,
    ) {
        let cfg = &self.config;
        let be = &*self.backend;
        let n = be.shape(t.q).0;
        let swa = cfg.swa_layers[il];
        let base = if swa {
            cfg.rope_base_swa
        } else {
            cfg.rope_base
        };
        let rope = |n_head| RopeParams {
            style: cfg.rope_style,
            n_head,
            head_dim: cfg.head_dim,
            n_rot: cfg.n_rot,
            base,
        };
        let mask = AttentionMask {
            q_pos0: pos0,
            kv_len: pos0 + n,
            causal,
            window: if swa { cfg.sliding_window } else { None },
        };
        let params = AttentionParams {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            scale: if cfg.scale_queries_first {
                1.0
            } else {
                cfg.attention_scale
            },
        };
        let step = AttentionStep {
            q_rope: rope(cfg.n_head),
            k_rope: rope(cfg.n_head_kv),
            q_scale: cfg.scale_queries_first.then_some(cfg.attention_scale),
            mask,
            params,
        };
        let head_norms = match &self.weights.layers[il].mixer {
            Mixer::Attention(AttentionWeights {
                q_norm: Some(q_weight),
                k_norm: Some(k_weight),
                ..
            }) => Some(HeadNorms {
                q_weight,
                k_weight,
                eps: cfg.rms_eps,
                q_out: t.q_normed,
                k_out: t.k_normed,
            }),
            _ => None,
        };
        let cache = kv.layer_mut(cfg.slot_of(il));
        be.attention_step((t.q, t.k, t.v), cache, step, head_norms, t.attn);
    }

    /// Logits of `rows` of the last block's output `s.x`, in that order.
    fn head(&self, s: &mut Scratch<B>, rows: &[usize], logits: &mut B::Tensor) {
        let cfg = &self.config;
        let be = &*self.backend;
        let n = rows.len();
        be.reshape(&mut s.xn, n, cfg.n_embd);
        // Runs of consecutive rows are one copy each.
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            be.copy_rows(&s.x, rows[i], &mut s.xn, i, 0, j - i);
            i = j;
        }
        be.reshape(&mut s.o, n, cfg.n_embd);
        be.rms_norm(
            &s.xn,
            &self.weights.output_norm,
            cfg.n_embd,
            cfg.rms_eps,
            &mut s.o,
        );
        be.reshape(logits, n, cfg.n_vocab_head);
        be.matmul(self.weights.head(), &s.o, logits);
    }
}

/// A hybrid model's pass found no hybrid activations (not reached: they
/// are made with the state of every hybrid model).
fn missing_scratch() -> ModelError {
    ModelError::Usage("a hybrid block ran without its activations".into())
}

/// The residual stream `x`, and the scratch a branch's output goes
/// through on its way there (fields of [`Scratch`], borrowed beside the
/// branch's input).
struct Residual<'a, B: Backend> {
    x: &'a mut B::Tensor,
    o: &'a mut B::Tensor,
    xn: &'a mut B::Tensor,
}

/// What one layer's attention step reads and writes (fields of
/// [`Scratch`]).
struct AttentionTensors<'a, B: Backend> {
    q: &'a mut B::Tensor,
    k: &'a mut B::Tensor,
    v: &'a mut B::Tensor,
    attn: &'a mut B::Tensor,
    q_normed: &'a mut B::Tensor,
    k_normed: &'a mut B::Tensor,
}

/// Preallocated activations of one forward pass.
struct Scratch<B: Backend> {
    x: B::Tensor,
    xn: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    q_normed: B::Tensor,
    k_normed: B::Tensor,
    attn: B::Tensor,
    o: B::Tensor,
    gate: B::Tensor,
    up: B::Tensor,
    hidden: B::Tensor,
    /// Hybrid blocks' activations, for hybrid models.
    hybrid: Option<HybridScratch<B>>,
}

impl<B: Backend> Scratch<B> {
    /// Columns of each tensor, in field order.
    fn cols(cfg: &ModelConfig) -> [usize; 12] {
        let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        [e, e, q, kv, kv, q, kv, q, e, ff, ff, ff]
    }

    /// Columns of every tensor, hybrid ones included.
    fn all_cols(cfg: &ModelConfig) -> Vec<usize> {
        let hybrid = cfg
            .delta_net
            .iter()
            .flat_map(|dn| HybridScratch::<B>::cols(cfg, dn));
        Self::cols(cfg).into_iter().chain(hybrid).collect()
    }

    fn new(be: &B, cfg: &ModelConfig, rows: usize) -> Self {
        let [x, xn, q, k, v, q_normed, k_normed, attn, o, gate, up, hidden] =
            Self::cols(cfg).map(|cols| be.tensor(rows, cols));
        let hybrid = cfg
            .delta_net
            .as_ref()
            .map(|dn| HybridScratch::new(be, cfg, dn, rows));
        Scratch {
            x,
            xn,
            q,
            k,
            v,
            q_normed,
            k_normed,
            attn,
            o,
            gate,
            up,
            hidden,
            hybrid,
        }
    }

    /// The tensors one layer's attention step reads and writes.
    fn attention_tensors(&mut self) -> AttentionTensors<'_, B> {
        AttentionTensors {
            q: &mut self.q,
            k: &mut self.k,
            v: &mut self.v,
            attn: &mut self.attn,
            q_normed: &mut self.q_normed,
            k_normed: &mut self.k_normed,
        }
    }

    fn shape(&mut self, be: &B, n: usize, cfg: &ModelConfig) {
        let tensors = [
            &mut self.x,
            &mut self.xn,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.q_normed,
            &mut self.k_normed,
            &mut self.attn,
            &mut self.o,
            &mut self.gate,
            &mut self.up,
            &mut self.hidden,
        ];
        for (t, cols) in tensors.into_iter().zip(Self::cols(cfg)) {
            be.reshape(t, n, cols);
        }
        if let (Some(h), Some(dn)) = (&mut self.hybrid, &cfg.delta_net) {
            h.shape(be, n, cfg, dn);
        }
    }
}

/// The stacked activations of [`Decoder::forward_batch`] passes, and the
/// logits of each sequence's last row.
pub struct BatchState<B: Backend> {
    scratch: Scratch<B>,
    logits: B::Tensor,
    max_rows: usize,
    max_seqs: usize,
}

impl<B: Backend> BatchState<B> {
    /// One row per sequence of the last pass, in its order.
    pub fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// Most rows of one pass, all sequences together.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Most sequences of one pass.
    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }
}

/// One sequence: its KV cache (attention blocks), recurrent state (a
/// hybrid model's gated-DeltaNet blocks), scratch activations and last
/// logits.
pub struct DecoderState<B: Backend> {
    pub kv: KvCache<B>,
    recurrent: Option<RecurrentMemory<B>>,
    scratch: Scratch<B>,
    logits: B::Tensor,
    max_batch: usize,
    logit_rows: usize,
}

/// Rows of a forward pass that fit a backend: every scratch tensor of
/// `max_batch` rows within its largest tensor, and logits for all rows of
/// a pass only up to `logit_rows` (a 262,144-entry vocabulary is 1 MiB a
/// row, and a browser's storage binding may be 128 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PassRows {
    max_batch: usize,
    logit_rows: usize,
}

impl PassRows {
    /// `requested` rows, fewer where a tensor of that many would not fit;
    /// at least one (a state that cannot hold one row is refused by
    /// [`MemoryLimits::check`](crate::backend::MemoryLimits::check)).
    fn new<B: Backend>(cfg: &ModelConfig, limits: MemoryLimits, requested: usize) -> Self {
        let fit = |cols: usize| {
            limits.max_tensor.map_or(usize::MAX, |max| {
                usize::try_from(max / (cols.max(1) as u64 * 4)).unwrap_or(usize::MAX)
            })
        };
        let scratch = Scratch::<B>::all_cols(cfg).into_iter().map(fit).min();
        let max_batch = requested.min(scratch.unwrap_or(usize::MAX)).max(1);
        PassRows {
            max_batch,
            logit_rows: max_batch.min(fit(cfg.n_vocab_head)).max(1),
        }
    }
}

impl<B: Backend> DecoderState<B> {
    /// Bytes of the tensors [`Self::new`] allocates: the KV cache, the
    /// scratch rows and the logits.
    fn sizes(cfg: &ModelConfig, n_ctx: usize, rows: PassRows, kv_type: KvType) -> Vec<u64> {
        let kv = tensor_bytes(n_ctx, cfg.kv_dim(), kv_type.element_bytes());
        let scratch = Scratch::<B>::all_cols(cfg)
            .into_iter()
            .map(|cols| tensor_bytes(rows.max_batch, cols, 4));
        std::iter::repeat_n(kv, 2 * cfg.n_kv_layers())
            .chain(scratch)
            .chain([tensor_bytes(rows.logit_rows, cfg.n_vocab_head, 4)])
            .chain(RecurrentMemory::<B>::sizes(cfg, rows.max_batch))
            .collect()
    }

    fn new(be: &B, cfg: &ModelConfig, n_ctx: usize, rows: PassRows, kv_type: KvType) -> Self {
        DecoderState {
            kv: KvCache::new(be, cfg.n_kv_layers(), cfg.kv_dim(), n_ctx, kv_type),
            recurrent: cfg
                .delta_net
                .as_ref()
                .map(|dn| RecurrentMemory::new(be, dn, cfg.n_recurrent_layers(), rows.max_batch)),
            scratch: Scratch::new(be, cfg, rows.max_batch),
            logits: be.tensor(rows.logit_rows, cfg.n_vocab_head),
            max_batch: rows.max_batch,
            logit_rows: rows.logit_rows,
        }
    }

    /// Logits of the rows the last forward pass asked for.
    pub fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// The logits, to penalize in place before a token is chosen.
    pub fn logits_mut(&mut self) -> &mut B::Tensor {
        &mut self.logits
    }

    /// Final-normed hidden rows behind [`Self::logits`] (what the head read).
    pub fn normed_hidden(&self) -> &B::Tensor {
        &self.scratch.o
    }

    /// Most tokens of one forward pass (what was asked for, or fewer where
    /// the backend's largest tensor holds fewer rows).
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Most rows of a pass with [`LogitRows::All`] (a verify of a draft of
    /// `logit_rows() - 1` tokens); at most [`Self::max_batch`].
    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }

    /// Positions held in the cache.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kv.len() == 0
    }

    /// Forgets every position from `len` on. A hybrid model's state goes
    /// back only to 0 or to a position logged since its last checkpoint
    /// ([`Self::can_truncate`]); elsewhere this fails and nothing changes.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if let Some(rec) = &mut self.recurrent {
            rec.rewind(self.kv.len(), len)?;
        }
        self.kv.truncate(len);
        Ok(())
    }

    /// Whether [`Self::truncate`] to `len` succeeds.
    pub fn can_truncate(&self, len: usize) -> bool {
        self.recurrent
            .as_ref()
            .is_none_or(|rec| rec.can_rewind(self.kv.len(), len))
    }

    /// Marks the current end before a pass whose rows may be taken back
    /// (see [`crate::engine::SequenceMemory`]).
    pub(crate) fn begin_checkpoint(&mut self) {
        if let Some(rec) = &mut self.recurrent {
            rec.checkpoint();
        }
    }

    /// Ends what [`Self::begin_checkpoint`] began.
    pub(crate) fn end_checkpoint(&mut self) {
        if let Some(rec) = &mut self.recurrent {
            rec.end_checkpoint();
        }
    }
}
