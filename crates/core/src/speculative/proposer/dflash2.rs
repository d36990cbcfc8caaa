//! DFlash2 additions to the DFlash drafter (spec §3.3): grouped dynamic
//! depthwise convolutions around each sublayer of the block path, and a
//! candidate selector whose greedy lattice walk replaces per-row argmax.

use crate::backend::{Backend, BackendError, ConvParams};
use crate::error::ModelError;
use crate::model::{FileTensors, HookPoint, LayerHook};
use crate::sampling::argmax;
use blockdraft_gguf::{GgmlType, GgufFile, TensorData};

/// DFlash2 metadata (all positive once validated).
#[derive(Clone, Debug, PartialEq)]
pub struct DFlash2Config {
    /// Taps T of each convolution.
    pub conv_kernel_size: usize,
    /// Channels per dynamic delta G.
    pub conv_group_size: usize,
    /// Codebook rank R.
    pub selector_rank: usize,
    /// Candidates K per row.
    pub selector_top_k: usize,
    /// Multiplies the logits when non-zero.
    pub logit_scale: f32,
    /// `cap · tanh(logits / cap)` when positive.
    pub final_logit_softcapping: f32,
}

impl DFlash2Config {
    /// Reads the conv/selector keys of a drafter whose hidden size is `n_embd`.
    pub fn from_gguf(file: &GgufFile, n_embd: usize) -> Result<Self, String> {
        let md = file.metadata();
        let int = |key: &str| -> Result<i64, String> {
            Ok(md.opt_i64(key).map_err(|e| e.to_string())?.unwrap_or(0))
        };
        let mut vals = [0usize; 5];
        for (v, key) in vals.iter_mut().zip([
            "dflash.selector_rank",
            "dflash.block_size",
            "dflash.selector_top_k",
            "dflash.conv_kernel_size",
            "dflash.conv_group_size",
        ]) {
            *v = match usize::try_from(int(key)?) {
                Ok(x) if x > 0 => x,
                _ => {
                    return Err(format!(
                        "DFlash2 model is missing conv/selector metadata (`{key}` must be > 0)"
                    ))
                }
            };
        }
        let [selector_rank, _, selector_top_k, conv_kernel_size, conv_group_size] = vals;
        if !n_embd.is_multiple_of(conv_group_size) {
            return Err(format!(
                "DFlash2 hidden size {n_embd} must be divisible by conv_group_size {conv_group_size}"
            ));
        }
        if n_embd < selector_top_k * (selector_top_k + 1) {
            return Err(format!(
                "DFlash2 hidden size {n_embd} is too small for the selector lattice (top_k {selector_top_k})"
            ));
        }
        let float = |key: &str| -> Result<f32, String> {
            Ok(md.opt_f32(key).map_err(|e| e.to_string())?.unwrap_or(0.0))
        };
        Ok(DFlash2Config {
            conv_kernel_size,
            conv_group_size,
            selector_rank,
            selector_top_k,
            logit_scale: float("dflash.logit_scale")?,
            final_logit_softcapping: float("dflash.final_logit_softcapping")?,
        })
    }

    /// The target's output transforms, which the selector's scores assume.
    pub fn transform_logits(&self, logits: &mut [f32]) {
        let (scale, cap) = (self.logit_scale, self.final_logit_softcapping);
        if scale != 0.0 {
            logits.iter_mut().for_each(|l| *l *= scale);
        }
        if cap > 0.0 {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
    }
}

/// One sublayer's convolution pair: static base (`2T x d`, row `side·T + t`)
/// and the projection giving the per-token group deltas of both sides.
struct ConvPair<B: Backend> {
    base: B::Tensor,
    proj: B::Weight,
}

/// The four convolutions of every layer, applied as a decoder hook
/// ([`ConvHook`]) to the block rows (context rows never pass through the
/// layer loop).
pub(super) struct Convs<B: Backend> {
    /// `(attention, ffn)` per layer.
    layers: Vec<(ConvPair<B>, ConvPair<B>)>,
    taps: usize,
    group: usize,
}

/// A sequence's scratch for [`Convs`], for up to `max_rows` block rows.
pub(super) struct ConvScratch<B: Backend> {
    /// Deltas from the sublayer's normed input, kept for its output side.
    dynamic: B::Tensor,
    out: B::Tensor,
}

/// Columns of a sublayer's per-token group deltas, both sides.
fn dynamic_cols(taps: usize, group: usize, n_embd: usize) -> usize {
    2 * taps * (n_embd / group)
}

/// [`Convs`] with one sequence's scratch, as the decoder's layer hook.
pub(super) struct ConvHook<'a, B: Backend> {
    pub(super) convs: &'a Convs<B>,
    pub(super) scratch: &'a mut ConvScratch<B>,
}

impl<B: Backend> Convs<B> {
    pub(super) fn load(
        be: &B,
        tensors: &FileTensors,
        cfg: &DFlash2Config,
        n_layer: usize,
        n_embd: usize,
    ) -> Result<Self, ModelError> {
        let (d, t) = (n_embd as u64, cfg.conv_kernel_size as u64);
        let dyn_cols = dynamic_cols(cfg.conv_kernel_size, cfg.conv_group_size, n_embd);
        let pair = |prefix: &str| -> Result<ConvPair<B>, ModelError> {
            let name = format!("{prefix}_conv_base");
            let (ty, data) = tensors.take(&name, &[d, t, 2])?;
            if ty != GgmlType::F32 {
                return Err(ModelError::Usage(format!(
                    "DFlash drafter: `{name}` is {ty}, expected F32"
                )));
            }
            let values: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let mut base = be.tensor(2 * cfg.conv_kernel_size, n_embd);
            be.write(&mut base, &values);
            let proj = tensors.weight(
                be,
                &format!("{prefix}_conv_proj.weight"),
                &[d, dyn_cols as u64],
            )?;
            Ok(ConvPair { base, proj })
        };
        let layers = (0..n_layer)
            .map(|il| {
                Ok((
                    pair(&format!("blk.{il}.attn"))?,
                    pair(&format!("blk.{il}.ffn"))?,
                ))
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Convs {
            layers,
            taps: cfg.conv_kernel_size,
            group: cfg.conv_group_size,
        })
    }

    /// Scratch for one sequence's blocks of up to `max_rows` rows.
    pub(super) fn scratch(&self, be: &B, n_embd: usize, max_rows: usize) -> ConvScratch<B> {
        let dyn_cols = dynamic_cols(self.taps, self.group, n_embd);
        ConvScratch {
            dynamic: be.tensor(max_rows, dyn_cols),
            out: be.tensor(max_rows, n_embd),
        }
    }
}

impl<B: Backend> LayerHook<B> for ConvHook<'_, B> {
    fn apply(&mut self, be: &B, layer: usize, point: HookPoint, x: &mut B::Tensor) {
        let Self { convs, scratch } = self;
        let (attn, ffn) = &convs.layers[layer];
        let (pair, side) = match point {
            HookPoint::AttnInput => (attn, 0),
            HookPoint::AttnOutput => (attn, 1),
            HookPoint::FfnInput => (ffn, 0),
            HookPoint::FfnOutput => (ffn, 1),
        };
        let (rows, cols) = be.shape(x);
        if side == 0 {
            // One projection of the normed input feeds both sides.
            let dyn_cols = be.shape(&scratch.dynamic).1;
            be.reshape(&mut scratch.dynamic, rows, dyn_cols);
            be.matmul(&pair.proj, x, &mut scratch.dynamic);
        }
        be.reshape(&mut scratch.out, rows, cols);
        let p = ConvParams {
            taps: convs.taps,
            group: convs.group,
            side,
        };
        be.grouped_conv(x, &pair.base, &scratch.dynamic, p, &mut scratch.out);
        be.copy_rows(&scratch.out, 0, x, 0, 0, rows);
    }
}

/// Candidate selector: `selector_hidden` on the device, the two codebooks
/// read row by row from the file (only 2K rows are touched per block row).
pub(super) struct Selector<B: Backend> {
    pub(super) hidden: B::Weight,
    predecessor: TensorData,
    successor: TensorData,
    ty: GgmlType,
    rank: usize,
    top_k: usize,
}

/// The selector on the device (greedy drafting without a readback): the
/// codebooks as embedding tables.
pub(super) struct DeviceSelector<B: Backend> {
    predecessor: B::Weight,
    successor: B::Weight,
    top_k: usize,
    rank: usize,
    logit_scale: f32,
    softcap: f32,
}

/// A sequence's scratch for one block's walk ([`DeviceSelector::walk`]).
pub(super) struct DeviceSelectorScratch<B: Backend> {
    gates: B::Tensor,
    /// Top-K logits (transformed) and ids of each block row; ids row 0,
    /// column 0 is overwritten with the anchor, so that the ids read as a
    /// column index both codebooks: the anchor's predecessor row first.
    unary: B::Tensor,
    ids: B::Tensor,
    pred_rows: B::Tensor,
    succ_rows: B::Tensor,
}

impl<B: Backend> DeviceSelector<B> {
    /// `None` when the device walk would differ from the host's (a negative
    /// logit scale reverses the order the top-K is taken in) or the backend
    /// cannot keep the codebooks' type resident: the host walks then.
    pub(super) fn load(
        be: &B,
        tensors: &FileTensors,
        cfg: &DFlash2Config,
        n_vocab: usize,
    ) -> Result<Option<Self>, ModelError> {
        if cfg.logit_scale < 0.0 {
            return Ok(None);
        }
        let (r, k) = (cfg.selector_rank, cfg.selector_top_k);
        let dims = [r as u64, n_vocab as u64];
        let table = |name| match tensors.weight(be, name, &dims) {
            Err(ModelError::Backend(BackendError::Unsupported { .. })) => Ok(None),
            other => other.map(Some),
        };
        let (Some(predecessor), Some(successor)) = (
            table("selector_predecessor.weight")?,
            table("selector_successor.weight")?,
        ) else {
            return Ok(None);
        };
        Ok(Some(DeviceSelector {
            predecessor,
            successor,
            top_k: k,
            rank: r,
            logit_scale: cfg.logit_scale,
            softcap: cfg.final_logit_softcapping,
        }))
    }

    /// Scratch for one sequence's blocks of up to `max_rows` rows.
    pub(super) fn scratch(&self, be: &B, max_rows: usize) -> DeviceSelectorScratch<B> {
        let (r, k) = (self.rank, self.top_k);
        DeviceSelectorScratch {
            gates: be.tensor(max_rows, r),
            unary: be.tensor(max_rows, k),
            ids: be.tensor(max_rows, k),
            pred_rows: be.tensor(max_rows * k, r),
            succ_rows: be.tensor(max_rows * k, r),
        }
    }

    /// Walks the block whose raw logits and final-normed hidden rows are
    /// `logits` and `hidden` (row 0 the anchor's), writing the picks of rows
    /// 1.. down column 0 of `round` from row 1. `anchor` (1 x 1) holds the
    /// anchor id.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn walk(
        &self,
        s: &mut DeviceSelectorScratch<B>,
        be: &B,
        selector_hidden: &B::Weight,
        logits: &B::Tensor,
        hidden: &B::Tensor,
        anchor: &B::Tensor,
        round: &mut B::Tensor,
    ) {
        let (rows, k, r) = (be.shape(logits).0, self.top_k, self.rank);
        be.reshape(&mut s.gates, rows, r);
        be.matmul(selector_hidden, hidden, &mut s.gates);
        be.reshape(&mut s.unary, rows, k);
        be.reshape(&mut s.ids, rows, k);
        be.top_k(logits, k, &mut s.unary, &mut s.ids);
        // The transforms are increasing, so they commute with the top-K.
        if self.logit_scale != 0.0 {
            be.scale(&mut s.unary, self.logit_scale);
        }
        if self.softcap > 0.0 {
            be.softcap(&mut s.unary, self.softcap);
        }
        be.copy_rows(anchor, 0, &mut s.ids, 0, 0, 1);
        be.reshape(&mut s.ids, rows * k, 1);
        for (table, out) in [
            (&self.predecessor, &mut s.pred_rows),
            (&self.successor, &mut s.succ_rows),
        ] {
            be.reshape(out, rows * k, r);
            be.embed_from(table, &s.ids, 0, out);
        }
        be.reshape(&mut s.ids, rows, k);
        be.selector_walk(
            &s.gates,
            &s.pred_rows,
            &s.succ_rows,
            &s.unary,
            &s.ids,
            round,
            0,
        );
    }
}

/// The per-row candidates of one block and what scores them.
#[derive(Clone, Debug, PartialEq)]
pub struct Lattice {
    /// Rows 1..=n of the block: the top-K token ids, best logit first.
    pub candidates: Vec<Vec<u32>>,
    /// Their (transformed) logits.
    pub unary: Vec<Vec<f32>>,
    /// `selector_hidden · z` per row, rank R.
    pub gates: Vec<Vec<f32>>,
}

impl<B: Backend> Selector<B> {
    /// Codebook rank R.
    pub(super) fn rank(&self) -> usize {
        self.rank
    }

    pub(super) fn load(
        be: &B,
        tensors: &FileTensors,
        cfg: &DFlash2Config,
        n_embd: usize,
        n_vocab: usize,
    ) -> Result<Self, ModelError> {
        let r = cfg.selector_rank as u64;
        if cfg.selector_top_k > n_vocab {
            return Err(ModelError::Usage(format!(
                "DFlash drafter: selector_top_k {} exceeds the vocabulary of {n_vocab}",
                cfg.selector_top_k
            )));
        }
        let hidden = tensors.weight(be, "selector_hidden.weight", &[n_embd as u64, r])?;
        let (ty, predecessor) =
            tensors.take("selector_predecessor.weight", &[r, n_vocab as u64])?;
        let (ty2, successor) = tensors.take("selector_successor.weight", &[r, n_vocab as u64])?;
        if ty != ty2 || !cfg.selector_rank.is_multiple_of(ty.block_len()) {
            return Err(ModelError::Usage(format!(
                "DFlash drafter: selector codebooks of types {ty}/{ty2} with rank {r} cannot be read by row"
            )));
        }
        Ok(Selector {
            hidden,
            predecessor,
            successor,
            ty,
            rank: cfg.selector_rank,
            top_k: cfg.selector_top_k,
        })
    }

    fn row(&self, table: &TensorData, id: u32) -> Vec<f32> {
        let bytes = self
            .ty
            .bytes_for(self.rank as u64)
            .expect("checked at load") as usize;
        let mut out = vec![0.0; self.rank];
        blockdraft_gguf::quants::dequantize(
            self.ty,
            &table[id as usize * bytes..][..bytes],
            &mut out,
        )
        .expect("row size checked at load");
        out
    }

    /// Candidates of each row of `logits` (`rows x n_vocab`) with `gates`
    /// (`rows x R`).
    pub(super) fn lattice(&self, logits: &[f32], gates: &[f32], n_vocab: usize) -> Lattice {
        let mut lat = Lattice {
            candidates: Vec::new(),
            unary: Vec::new(),
            gates: gates.chunks_exact(self.rank).map(<[f32]>::to_vec).collect(),
        };
        for row in logits.chunks_exact(n_vocab) {
            let mut ids: Vec<u32> = (0..n_vocab as u32).collect();
            let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
            ids.select_nth_unstable_by(self.top_k - 1, by_logit);
            ids.truncate(self.top_k);
            ids.sort_by(|a, b| by_logit(a, b).then(a.cmp(b)));
            lat.unary
                .push(ids.iter().map(|&i| row[i as usize]).collect());
            lat.candidates.push(ids);
        }
        lat
    }

    /// Edge scores of row `r`'s candidates after token `pred`:
    /// `<A[pred] ⊙ gate_r, B[cand]> + unary`.
    pub(super) fn scores(&self, lat: &Lattice, r: usize, pred: u32) -> Vec<f32> {
        let a: Vec<f32> = self
            .row(&self.predecessor, pred)
            .iter()
            .zip(&lat.gates[r])
            .map(|(a, g)| a * g)
            .collect();
        lat.candidates[r]
            .iter()
            .zip(&lat.unary[r])
            .map(|(&c, &u)| {
                let b = self.row(&self.successor, c);
                u + a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
            })
            .collect()
    }

    /// Greedy walk from `anchor`: each row takes its best-scoring
    /// candidate given the previous pick, stopping at the first row whose
    /// pick has softmax probability (over the K scores) below `p_min`.
    pub(super) fn walk(&self, lat: &Lattice, anchor: u32, p_min: f32) -> Vec<u32> {
        let mut path = Vec::with_capacity(lat.candidates.len());
        let mut pred = anchor;
        for r in 0..lat.candidates.len() {
            let scores = self.scores(lat, r, pred);
            let best = argmax(&scores) as usize;
            if p_min > 0.0 {
                let m = scores[best];
                let p = 1.0 / scores.iter().map(|s| (s - m).exp()).sum::<f32>();
                if p < p_min {
                    break;
                }
            }
            pred = lat.candidates[r][best];
            path.push(pred);
        }
        path
    }
}
