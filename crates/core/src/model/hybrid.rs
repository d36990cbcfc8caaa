//! What hybrid models (Qwen3.5 family) add to a decoder: the activations
//! of their gated-DeltaNet and gated-attention blocks, and a sequence's
//! recurrent state with what a speculative rollback needs to restore it.
//!
//! A KV cache forgets rows by getting shorter; a recurrent state cannot.
//! At a checkpoint the state becomes the *base* and the inputs of the rows
//! that follow are logged; going back to a position after the base
//! replays the logged rows up to it from the base. The delta rule's state
//! (the large part) has two buffers: while the live state is the base, a
//! pass reads it and writes the other one, so neither the checkpoint nor
//! a restore copies it; the small convolution state is copied. The replay
//! needs the model's weights, so it runs at the start of the next forward
//! pass ([`RecurrentMemory::rewind`] only marks it): a verify of `k` rows
//! then costs the replay of the kept rows (each a fraction of a row's
//! cost), not a snapshot per row.

use super::config::{DeltaNetConfig, ModelConfig};
use crate::backend::{tensor_bytes, Backend, DeltaNetParams};
use crate::error::ModelError;

/// Most rows logged after a checkpoint: a verify pass, a drafted block and
/// its anchor, with room to spare.
pub const MAX_ROLLBACK_ROWS: usize = 64;

impl DeltaNetConfig {
    pub(super) fn params(&self, eps: f32) -> DeltaNetParams {
        DeltaNetParams {
            n_k_heads: self.n_k_heads,
            n_v_heads: self.n_v_heads,
            k_dim: self.k_dim,
            v_dim: self.v_dim,
            eps,
        }
    }
}

/// Activations of hybrid blocks for passes of up to `rows` rows.
pub(super) struct HybridScratch<B: Backend> {
    /// The convolution's input (`attn_qkv`'s output) and output.
    pub mix_in: B::Tensor,
    pub conv_out: B::Tensor,
    /// The output gate `z`, the per-head `alpha` and `beta` projections.
    pub z: B::Tensor,
    pub alpha: B::Tensor,
    pub beta: B::Tensor,
    /// The delta rule's output, normed, then gated.
    pub out: B::Tensor,
    pub normed: B::Tensor,
    /// Gated attention: `attn_q`'s output, and its gates once split.
    pub q_full: B::Tensor,
    pub q_gate: B::Tensor,
}

impl<B: Backend> HybridScratch<B> {
    /// Columns of each tensor, in field order.
    pub fn cols(cfg: &ModelConfig, dn: &DeltaNetConfig) -> [usize; 9] {
        let (conv, value, hv) = (dn.conv_dim(), dn.value_dim(), dn.n_v_heads);
        [
            conv,
            conv,
            value,
            hv,
            hv,
            value,
            value,
            cfg.q_proj_dim(),
            cfg.q_dim(),
        ]
    }

    pub fn new(be: &B, cfg: &ModelConfig, dn: &DeltaNetConfig, rows: usize) -> Self {
        let [mix_in, conv_out, z, alpha, beta, out, normed, q_full, q_gate] =
            Self::cols(cfg, dn).map(|cols| be.tensor(rows, cols));
        HybridScratch {
            mix_in,
            conv_out,
            z,
            alpha,
            beta,
            out,
            normed,
            q_full,
            q_gate,
        }
    }

    pub fn shape(&mut self, be: &B, n: usize, cfg: &ModelConfig, dn: &DeltaNetConfig) {
        let tensors = [
            &mut self.mix_in,
            &mut self.conv_out,
            &mut self.z,
            &mut self.alpha,
            &mut self.beta,
            &mut self.out,
            &mut self.normed,
            &mut self.q_full,
            &mut self.q_gate,
        ];
        for (t, cols) in tensors.into_iter().zip(Self::cols(cfg, dn)) {
            be.reshape(t, n, cols);
        }
    }
}

/// One recurrent layer's states, base and input log.
struct LayerState<B: Backend> {
    conv: B::Tensor,
    base_conv: B::Tensor,
    /// The delta rule's state in two buffers ([`RecurrentMemory::live`]).
    ssm: [B::Tensor; 2],
    log_in: B::Tensor,
    log_alpha: B::Tensor,
    log_beta: B::Tensor,
}

/// A sequence's recurrent state in every gated-DeltaNet block.
pub struct RecurrentMemory<B: Backend> {
    layers: Vec<LayerState<B>>,
    /// Rows each log holds.
    log_rows: usize,
    /// Position of the base, and the `ssm` buffer holding it, when there
    /// is one.
    base: Option<(usize, usize)>,
    /// The `ssm` buffer holding the live state.
    live: usize,
    /// Rows logged since the base.
    logged: usize,
    /// Whether passes log their rows (from a checkpoint to its commit).
    logging: bool,
    /// What the next pass does first, in this order: zero the state,
    /// restore the base and replay this many logged rows, make the state
    /// the base.
    clear: bool,
    replay: Option<usize>,
    rebase: bool,
}

impl<B: Backend> RecurrentMemory<B> {
    /// Column widths of a layer's tensors, in [`LayerState`] order, and
    /// their rows.
    fn shapes(dn: &DeltaNetConfig, log_rows: usize) -> [(usize, usize); 7] {
        let conv = (dn.conv_kernel - 1, dn.conv_dim());
        let ssm = dn.params(0.0).state_shape();
        [
            conv,
            conv,
            ssm,
            ssm,
            (log_rows, dn.conv_dim()),
            (log_rows, dn.n_v_heads),
            (log_rows, dn.n_v_heads),
        ]
    }

    /// Rows a state for passes of `max_batch` rows logs.
    pub(super) fn log_rows(max_batch: usize) -> usize {
        max_batch.min(MAX_ROLLBACK_ROWS)
    }

    /// Bytes of every tensor [`Self::new`] allocates.
    pub(super) fn sizes(cfg: &ModelConfig, max_batch: usize) -> Vec<u64> {
        let Some(dn) = &cfg.delta_net else {
            return Vec::new();
        };
        let layer = Self::shapes(dn, Self::log_rows(max_batch));
        std::iter::repeat_n(layer, cfg.n_recurrent_layers())
            .flatten()
            .map(|(r, c)| tensor_bytes(r, c, 4))
            .collect()
    }

    pub(super) fn new(be: &B, dn: &DeltaNetConfig, n_layers: usize, max_batch: usize) -> Self {
        let log_rows = Self::log_rows(max_batch);
        let layers = (0..n_layers)
            .map(|_| {
                let [conv, base_conv, ssm0, ssm1, log_in, log_alpha, log_beta] =
                    Self::shapes(dn, log_rows).map(|(r, c)| be.tensor(r, c));
                LayerState {
                    conv,
                    base_conv,
                    ssm: [ssm0, ssm1],
                    log_in,
                    log_alpha,
                    log_beta,
                }
            })
            .collect();
        RecurrentMemory {
            layers,
            log_rows,
            base: None,
            live: 0,
            logged: 0,
            logging: false,
            clear: false,
            replay: None,
            rebase: false,
        }
    }

    /// Marks position `len` as a checkpoint: the next pass copies the
    /// state there and logs its rows.
    pub(super) fn checkpoint(&mut self) {
        self.rebase = true;
        self.logging = true;
    }

    /// Ends a checkpoint's logging (its commit).
    pub(super) fn end_checkpoint(&mut self) {
        self.logging = false;
        // A checkpoint without a pass leaves the base where it was.
        self.rebase = false;
    }

    /// Whether the state at `len` can be had again from position `now`.
    pub(super) fn can_rewind(&self, now: usize, len: usize) -> bool {
        len >= now
            || len == 0
            || self
                .base
                .is_some_and(|(b, _)| b <= len && len - b <= self.logged)
    }

    /// Goes back from position `now` to `len` (see [`Self::can_rewind`]);
    /// the work is done at the start of the next pass.
    pub(super) fn rewind(&mut self, now: usize, len: usize) -> Result<(), ModelError> {
        if len >= now {
            return Ok(());
        }
        if len == 0 {
            self.clear = true;
            self.replay = None;
            self.rebase = false;
            self.base = None;
            self.logged = 0;
            return Ok(());
        }
        match self.base {
            Some((b, _)) if b <= len && len - b <= self.logged => {
                self.replay = Some(len - b);
                Ok(())
            }
            _ => Err(ModelError::Usage(format!(
                "a hybrid model's recurrent state cannot go back from position {now} to {len}: \
                 only to 0 or to a position logged since the last checkpoint"
            ))),
        }
    }

    /// Fails unless a pass of `n` rows fits what is left of the log.
    pub(super) fn check_pass(&self, n: usize) -> Result<(), ModelError> {
        let logged = if self.rebase { 0 } else { self.logged };
        if self.logging && logged + n > self.log_rows {
            return Err(ModelError::Usage(format!(
                "a hybrid model takes back at most {} rows after a checkpoint, got {}",
                self.log_rows,
                logged + n
            )));
        }
        Ok(())
    }

    /// What must happen before the next pass: zeroing, restoring the base
    /// (the caller then replays [`Self::take_replay`] rows), re-basing.
    pub(super) fn prepare(&mut self, be: &B) -> Option<usize> {
        if std::mem::take(&mut self.clear) {
            let live = self.live;
            for l in &mut self.layers {
                for t in [&mut l.conv, &mut l.ssm[live]] {
                    let (r, c) = be.shape(t);
                    be.write(t, &vec![0.0; r * c]);
                }
            }
        }
        let replay = self.replay.take();
        if let (Some(_), Some((_, slot))) = (replay, self.base) {
            for l in &mut self.layers {
                copy_all(be, &l.base_conv, &mut l.conv);
            }
            self.live = slot;
        }
        replay
    }

    /// After the replay of [`Self::prepare`]: the state is at `len`; a
    /// pending checkpoint makes it the base.
    pub(super) fn rebase_at(&mut self, be: &B, len: usize) {
        if std::mem::take(&mut self.rebase) {
            for l in &mut self.layers {
                copy_all(be, &l.conv, &mut l.base_conv);
            }
            self.base = Some((len, self.live));
            self.logged = 0;
        }
    }

    /// The `ssm` buffer a pass writes: the live one, unless that holds the
    /// base, which stays as it is.
    fn target(&self) -> usize {
        match self.base {
            Some((_, slot)) if slot == self.live => 1 - slot,
            _ => self.live,
        }
    }

    /// Row of the logs a pass starts at, when passes log.
    pub(super) fn log_at(&self) -> Option<usize> {
        self.logging.then_some(self.logged)
    }

    /// Layer `r`'s states (the delta rule's to read and to write) and logs.
    pub(super) fn layer(&mut self, r: usize) -> LayerRefs<'_, B> {
        let (live, target) = (self.live, self.target());
        let l = &mut self.layers[r];
        let [a, b] = &mut l.ssm;
        let (other, to) = if target == 0 { (&*b, a) } else { (&*a, b) };
        LayerRefs {
            conv: &mut l.conv,
            ssm_from: (live != target).then_some(other),
            ssm: to,
            log_in: &mut l.log_in,
            log_alpha: &mut l.log_alpha,
            log_beta: &mut l.log_beta,
        }
    }

    /// Counts a pass (or replay) of `n` rows, whose states went to
    /// [`Self::target`]; `logged`: rows that went to the log.
    pub(super) fn passed(&mut self, n: usize, logged: bool) {
        self.live = self.target();
        if logged && self.logging {
            self.logged += n;
        }
    }
}

pub(super) struct LayerRefs<'a, B: Backend> {
    pub conv: &'a mut B::Tensor,
    /// The delta rule's state before the pass, where it is not `ssm`'s.
    pub ssm_from: Option<&'a B::Tensor>,
    pub ssm: &'a mut B::Tensor,
    /// The inputs of the rows since the base: convolution input, alpha,
    /// beta.
    pub log_in: &'a mut B::Tensor,
    pub log_alpha: &'a mut B::Tensor,
    pub log_beta: &'a mut B::Tensor,
}

fn copy_all<B: Backend>(be: &B, src: &B::Tensor, dst: &mut B::Tensor) {
    let rows = be.shape(src).0;
    be.copy_rows(src, 0, dst, 0, 0, rows);
}
