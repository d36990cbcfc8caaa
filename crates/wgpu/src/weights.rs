//! Weights on the GPU in their GGUF type, read in place by the kernels.
//! Matrices larger than the adapter's largest storage binding are split
//! into parts of whole rows; 1-D weights (norms, biases) are small and kept
//! as f32.

use crate::params;
use crate::recorder::{Binding, Device, Retired};
use crate::shaders::Kernel;
use crate::{grid, u};
use blockdraft_core::backend::{BackendError, GatedActivation, WeightSource};
use blockdraft_gguf::GgmlType;

/// Where `embed` finds its ids: u32 from the host (`stride` 1), or f32
/// values down column 0 of a tensor of `stride` columns from row `row0`.
#[derive(Clone, Copy)]
pub(crate) struct IdsLayout {
    pub f32_values: bool,
    pub stride: usize,
    pub row0: usize,
}

/// Whole rows `row0 .. row0 + rows` of a matrix: `bytes` at `offset` of
/// `buffer`, which holds them alone or beside the other weights of a
/// stack ([`colocate`]).
struct Part {
    buffer: wgpu::Buffer,
    offset: u64,
    bytes: u64,
    row0: usize,
    rows: usize,
    retired: Retired,
}

impl Part {
    fn alone(buffer: wgpu::Buffer, row0: usize, rows: usize, retired: Retired) -> Self {
        Part {
            offset: 0,
            bytes: buffer.size(),
            buffer,
            row0,
            rows,
            retired,
        }
    }

    fn binding(&self) -> Binding<'_> {
        Binding {
            buffer: &self.buffer,
            offset: self.offset,
            size: Some(self.bytes),
        }
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        self.retired.retire(&self.buffer);
    }
}

pub struct WgpuWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    parts: Vec<Part>,
}

/// How the activations of a quantized matmul are prepared (as the CPU
/// backend does, so the two agree up to float summation order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActQuant {
    /// Q8_0-style 32-blocks, for Q4_0..Q8_1, IQ4_NL, MXFP4 and NVFP4.
    /// `q8_1_sums`: the block sum rounded as llama.cpp's block_q8_1 stores
    /// it (the Q4_1/Q5_1 partner).
    Q8_0 { q8_1_sums: bool },
    /// Q8_K 256-super-blocks with per-16 sums, for the K-quants, IQ4_XS and
    /// the lattice and ternary types.
    Q8K,
}

/// The kernels of a weight type: float types dot the f32 activations
/// directly; quantized ones first quantize them (`act`).
#[derive(Clone, Copy)]
struct TypeKernels {
    matmul: Kernel,
    embed: Kernel,
    act: Option<ActQuant>,
}

/// The kernels of a weight type, if it has them.
fn kernels(ty: GgmlType) -> Option<TypeKernels> {
    use GgmlType::*;
    let float = |mm, emb| TypeKernels {
        matmul: Kernel::new("matmul_float.wgsl", mm),
        embed: Kernel::new("embed.wgsl", emb),
        act: None,
    };
    let quant = |mm, emb, act| TypeKernels {
        matmul: Kernel::new("matmul_quant.wgsl", mm),
        embed: Kernel::new("embed.wgsl", emb),
        act: Some(act),
    };
    let q8_0 = ActQuant::Q8_0 { q8_1_sums: false };
    let q8_1 = ActQuant::Q8_0 { q8_1_sums: true };
    let q8_k = ActQuant::Q8K;
    Some(match ty {
        F32 => float("matmul_f32", "embed_f32"),
        F16 => float("matmul_f16", "embed_f16"),
        BF16 => float("matmul_bf16", "embed_bf16"),
        Q4_0 => quant("matmul_q4_0", "embed_q4_0", q8_0),
        Q4_1 => quant("matmul_q4_1", "embed_q4_1", q8_1),
        Q5_0 => quant("matmul_q5_0", "embed_q5_0", q8_0),
        Q5_1 => quant("matmul_q5_1", "embed_q5_1", q8_1),
        Q8_0 => quant("matmul_q8_0", "embed_q8_0", q8_0),
        Q8_1 => quant("matmul_q8_1", "embed_q8_1", q8_0),
        Q2_K => quant("matmul_q2_k", "embed_q2_k", q8_k),
        Q3_K => quant("matmul_q3_k", "embed_q3_k", q8_k),
        Q4_K => quant("matmul_q4_k", "embed_q4_k", q8_k),
        Q5_K => quant("matmul_q5_k", "embed_q5_k", q8_k),
        Q6_K => quant("matmul_q6_k", "embed_q6_k", q8_k),
        Q8_K => quant("matmul_q8_k", "embed_q8_k", q8_k),
        IQ4_NL => quant("matmul_iq4_nl", "embed_iq4_nl", q8_0),
        IQ4_XS => quant("matmul_iq4_xs", "embed_iq4_xs", q8_k),
        IQ2_XXS => quant("matmul_iq2_xxs", "embed_iq2_xxs", q8_k),
        IQ2_XS => quant("matmul_iq2_xs", "embed_iq2_xs", q8_k),
        IQ2_S => quant("matmul_iq2_s", "embed_iq2_s", q8_k),
        IQ3_XXS => quant("matmul_iq3_xxs", "embed_iq3_xxs", q8_k),
        IQ3_S => quant("matmul_iq3_s", "embed_iq3_s", q8_k),
        IQ1_S => quant("matmul_iq1_s", "embed_iq1_s", q8_k),
        IQ1_M => quant("matmul_iq1_m", "embed_iq1_m", q8_k),
        TQ1_0 => quant("matmul_tq1_0", "embed_tq1_0", q8_k),
        TQ2_0 => quant("matmul_tq2_0", "embed_tq2_0", q8_k),
        MXFP4 => quant("matmul_mxfp4", "embed_mxfp4", q8_0),
        NVFP4 => quant("matmul_nvfp4", "embed_nvfp4", q8_0),
        _ => return None,
    })
}

/// The grid a lattice type's kernels look its indices up in, as the words
/// `quant_blocks.wgsl` reads after each weight part's rows (one row of 8
/// values is two words, of 4 values one word; byte j holds value j), from
/// `blockdraft_gguf`'s tables; empty for the other types.
fn lattice_grid(ty: GgmlType) -> Vec<u8> {
    use blockdraft_gguf::quants::grids::*;
    use GgmlType::*;
    let wide = |rows: &[u64]| rows.iter().flat_map(|r| r.to_le_bytes()).collect();
    let narrow = |rows: &[u32]| rows.iter().flat_map(|r| r.to_le_bytes()).collect();
    match ty {
        IQ2_XXS => wide(&IQ2XXS_GRID),
        IQ2_XS => wide(&IQ2XS_GRID),
        IQ2_S => wide(&IQ2S_GRID),
        IQ3_XXS => narrow(&IQ3XXS_GRID),
        IQ3_S => narrow(&IQ3S_GRID),
        IQ1_S | IQ1_M => wide(&IQ1S_GRID),
        _ => Vec::new(),
    }
}

/// Where `quantize.wgsl` puts `n` quantized rows of `cols` values, in u32
/// words of one scratch buffer: quants (4 per word), then scales, then sums.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ActLayout {
    pub d_off: usize,
    pub s_off: usize,
    pub words: usize,
}

impl ActLayout {
    pub fn new(n: usize, cols: usize) -> Self {
        let d_off = n * cols / 4;
        // Scales: at most one per 32 values; sums: at most one per 16.
        let s_off = d_off + n * cols / 32;
        ActLayout {
            d_off,
            s_off,
            words: s_off + n * cols / 16,
        }
    }
}

/// Quantizes the `n` rows of `x` (`cols` each) into `act` for `kind`.
pub(crate) fn quantize_activations(
    dev: &Device,
    kind: ActQuant,
    x: Binding,
    n: usize,
    cols: usize,
    act: Binding,
) -> ActLayout {
    let layout = ActLayout::new(n, cols);
    let (entry, q8_1_sums) = match kind {
        ActQuant::Q8_0 { q8_1_sums } => ("quantize_q8_0", q8_1_sums),
        ActQuant::Q8K => ("quantize_q8_k", false),
    };
    let chunks = cols.div_ceil(256);
    let params = params::Quantize {
        n: u(n),
        cols: u(cols),
        chunks: u(chunks),
        d_off: u(layout.d_off),
        s_off: u(layout.s_off),
        q8_1_sums: u32::from(q8_1_sums),
        _pad0: 0,
        _pad1: 0,
    };
    dev.dispatch(
        Kernel::new("quantize.wgsl", entry),
        &params,
        &[x, act],
        grid(n * chunks, 1),
    );
    layout
}

impl WgpuWeight {
    pub(crate) fn load(
        dev: &Device,
        src: WeightSource<'_>,
        max_binding: u64,
    ) -> Result<Self, BackendError> {
        let (rows, cols) = src.checked_shape()?;
        let too_large = || src.error("too large");
        let row_bytes = src.ty.bytes_for(cols as u64).ok_or_else(too_large)?;
        if src.dims.len() == 1 {
            let mut dense = vec![0f32; cols];
            blockdraft_gguf::quants::dequantize(src.ty, &src.data, &mut dense)
                .map_err(|e| src.error(e.to_string()))?;
            return Ok(WgpuWeight {
                ty: GgmlType::F32,
                rows: 1,
                cols,
                parts: vec![Part::alone(
                    dev.storage_init(src.name, bytemuck::cast_slice(&dense)),
                    0,
                    1,
                    dev.retired.clone(),
                )],
            });
        }
        if kernels(src.ty).is_none() {
            return Err(BackendError::Unsupported {
                what: format!("{} matrices on wgpu (`{}`)", src.ty, src.name),
            });
        }
        // Each part carries the type's grid after its rows (at the next
        // word), where the kernels read it from the same binding.
        let grid = lattice_grid(src.ty);
        let room = max_binding.saturating_sub(grid.len() as u64);
        // Whole rows per part, each part with its grid within one binding
        // (a multiple of 4 rows, so all but the last part end on a word;
        // the last, shorter one has room for its padding).
        let rows_per_part = ((room / row_bytes) as usize / 4 * 4).max(1);
        if row_bytes.next_multiple_of(4) > room {
            return Err(src.error(format!(
                "one row ({row_bytes} bytes{}) exceeds the device's largest storage binding ({max_binding})",
                if grid.is_empty() {
                    String::new()
                } else {
                    format!(" and its type's {}-byte grid", grid.len())
                }
            )));
        }
        let row_bytes = row_bytes as usize;
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|row0| {
                let n = rows_per_part.min(rows - row0);
                let bytes = &src.data[row0 * row_bytes..(row0 + n) * row_bytes];
                let buffer = dev.storage_init_with_tail(src.name, bytes, &grid);
                Part::alone(buffer, row0, n, dev.retired.clone())
            })
            .collect();
        Ok(WgpuWeight {
            ty: src.ty,
            rows,
            cols,
            parts,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// An F32 weight held in one part, as f32 values (a DeltaNet block's
    /// convolution taps); `None` for another type or a split one.
    pub(crate) fn f32_binding(&self) -> Option<Binding<'_>> {
        (self.ty == GgmlType::F32 && self.parts.len() == 1).then(|| self.parts[0].binding())
    }

    /// A 1-D weight as f32 (norm and bias kernels).
    pub(crate) fn dense_binding(&self) -> Binding<'_> {
        assert!(
            self.rows == 1 && self.ty == GgmlType::F32,
            "not a 1-D weight"
        );
        self.parts[0].binding()
    }

    /// How the activations must be quantized for [`Self::matmul`], if at all.
    pub(crate) fn act_quant(&self) -> Option<ActQuant> {
        kernels(self.ty).expect("checked at load").act
    }

    fn row_bytes(&self) -> usize {
        self.ty
            .bytes_for(self.cols as u64)
            .expect("checked at load") as usize
    }

    /// `out[r] = self[id r]` for `n` ids laid out in `ids` as `layout` says.
    pub(crate) fn embed(
        &self,
        dev: &Device,
        ids: Binding,
        layout: IdsLayout,
        n: usize,
        out: Binding,
    ) {
        let k = kernels(self.ty).expect("checked at load");
        // Float kernels: one invocation per value; quantized: per 32-value
        // unit (256 and 64 per workgroup).
        let groups = match k.act {
            None => grid(n * self.cols, 256),
            Some(_) => grid(n * self.cols / 32, 64),
        };
        for part in &self.parts {
            let params = params::Embed {
                n_ids: u(n),
                cols: u(self.cols),
                row0: u(part.row0),
                rows: u(part.rows),
                row_bytes: u(self.row_bytes()),
                zero: 0,
                ids_f32: u32::from(layout.f32_values),
                ids_stride: u(layout.stride),
                ids_row0: u(layout.row0),
                _pad0: 0,
                _pad1: 0,
                _pad2: 0,
            };
            dev.dispatch(k.embed, &params, &[ids, part.binding(), out], groups);
        }
    }

    /// `y = x · selfᵀ` for `n` rows of `x`, then `epilogue`. Quantized
    /// types read the rows from `act`, quantized by
    /// [`quantize_activations`] with the layout given; float types read
    /// `x`.
    pub(crate) fn matmul(
        &self,
        dev: &Device,
        x: Binding,
        n: usize,
        y: Binding,
        act: Option<(Binding, ActLayout)>,
        epilogue: Epilogue,
    ) {
        let k = kernels(self.ty).expect("checked at load");
        let flags = match epilogue {
            Epilogue::Store => 0,
            Epilogue::Bias(_) => EPILOGUE_BIAS,
            Epilogue::Accumulate => EPILOGUE_ACCUMULATE,
            Epilogue::Gated(GatedActivation::SwiGlu, _) => EPILOGUE_SWIGLU,
            Epilogue::Gated(GatedActivation::GeGlu, _) => EPILOGUE_GEGLU,
        };
        for part in &self.parts {
            // Without a bias the kernel reads none: any small read-only
            // range will do for its binding.
            let bias = match epilogue {
                Epilogue::Bias(b) => b.dense_binding(),
                Epilogue::Gated(_, gate) => gate,
                _ => Binding::head(&part.buffer, 4),
            };
            let weight = part.binding();
            let groups = grid(part.rows, dev.matmul_features_per_group);
            match act {
                None => dev.dispatch(
                    k.matmul,
                    &params::MatmulFloat {
                        rows: u(part.rows),
                        cols: u(self.cols),
                        n: u(n),
                        row0: u(part.row0),
                        out_cols: u(self.rows),
                        _pad0: 0,
                        _pad1: 0,
                        _pad2: 0,
                        epilogue: flags,
                        _pad3: 0,
                        _pad4: 0,
                        _pad5: 0,
                    },
                    &[weight, x, y, bias],
                    groups,
                ),
                Some((act, layout)) => dev.dispatch(
                    k.matmul,
                    &params::MatmulQuant {
                        rows: u(part.rows),
                        cols: u(self.cols),
                        n: u(n),
                        row0: u(part.row0),
                        out_cols: u(self.rows),
                        row_bytes: u(self.row_bytes()),
                        d_off: u(layout.d_off),
                        s_off: u(layout.s_off),
                        epilogue: flags,
                        _pad0: 0,
                        _pad1: 0,
                        _pad2: 0,
                        seg_rows: [0; 4],
                        seg_off: [0; 4],
                        seg_row_bytes: [0; 4],
                        seg_bias: [0; 4],
                    },
                    &[weight, act, y, bias],
                    groups,
                ),
            }
        }
    }
}

/// The code `quant_blocks.wgsl` gives a quantized type.
fn shader_type(ty: GgmlType) -> Option<u32> {
    use GgmlType::*;
    [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS,
        IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4,
    ]
    .iter()
    .position(|&t| t == ty)
    .map(|i| i as u32)
}

/// Moves `weights` side by side into one buffer, each at an offset
/// aligned for binding alone (`align`), so that one dispatch can read them
/// all ([`stacked_matmul`]): matrices of one row length whose activations
/// are quantized alike, or 1-D weights (biases). Leaves them where they are
/// when they do not qualify or would not fit one binding (`max_binding`).
pub(crate) fn colocate(
    dev: &Device,
    weights: &mut [&mut WgpuWeight],
    align: u64,
    max_binding: u64,
) {
    let Some(first) = weights.first() else {
        return;
    };
    let vectors = weights.iter().all(|w| w.rows == 1 && w.ty == GgmlType::F32);
    let matrices = weights.iter().all(|w| {
        w.cols == first.cols
            && w.rows > 1
            && shader_type(w.ty).is_some()
            && w.act_quant() == first.act_quant()
    });
    let single = weights.iter().all(|w| w.parts.len() == 1);
    if weights.len() < 2 || !single || !(vectors || matrices) {
        return;
    }
    let mut offsets = Vec::with_capacity(weights.len());
    let mut end = 0u64;
    for w in weights.iter() {
        let at = end.next_multiple_of(align);
        offsets.push(at);
        end = at + w.parts[0].bytes;
    }
    if end > max_binding {
        return;
    }
    let stack = dev.storage("stacked weights", end);
    for (w, &at) in weights.iter_mut().zip(&offsets) {
        let old = &w.parts[0];
        dev.copy(&old.buffer, old.offset, &stack, at, old.bytes);
        w.parts[0] = Part {
            buffer: stack.clone(),
            offset: at,
            bytes: old.bytes,
            row0: 0,
            rows: old.rows,
            retired: old.retired.clone(),
        };
    }
    // The copies run now, so that the buffers they empty are freed as the
    // model loads rather than all at its first pass.
    dev.flush();
}

/// The buffer `weights` share, if [`colocate`] stacked them together.
fn shared_buffer<'a>(weights: &[&'a WgpuWeight]) -> Option<&'a wgpu::Buffer> {
    let first = &weights.first()?.parts;
    weights
        .iter()
        .all(|w| w.parts.len() == 1 && w.parts[0].buffer == first[0].buffer)
        .then_some(&first[0].buffer)
}

/// One stacked product of [`stacked_matmul`]: a weight and its output.
pub(crate) struct Segment<'a> {
    pub weight: &'a WgpuWeight,
    pub bias: Option<&'a WgpuWeight>,
    pub out: Binding<'a>,
}

/// What [`stacked_matmul`] computes.
#[derive(Clone, Copy)]
pub(crate) enum Stacked {
    /// Each segment's product (plus its bias) into its output.
    Projections,
    /// `act(x · gateᵀ) ⊙ (x · upᵀ)` into the first segment's output, the
    /// segments being gate and up.
    Gated(GatedActivation),
}

/// The products of `n` rows (quantized in `act` as `layout` says) with up
/// to three weights stacked by [`colocate`], in one dispatch; `false`
/// (nothing recorded) where they are not stacked together or do not
/// qualify (biases on some segments only, or biases not stacked together;
/// gate and up of different row counts).
pub(crate) fn stacked_matmul(
    dev: &Device,
    what: Stacked,
    segments: &[Segment],
    n: usize,
    (act, layout): (Binding, ActLayout),
) -> bool {
    let weights: Vec<_> = segments.iter().map(|s| s.weight).collect();
    let Some(buffer) = shared_buffer(&weights) else {
        return false;
    };
    let biases: Option<Vec<_>> = segments.iter().map(|s| s.bias).collect();
    let bias_buffer = match &biases {
        Some(b) => match shared_buffer(b) {
            Some(buffer) => Some(buffer),
            None => return false,
        },
        None if segments.iter().any(|s| s.bias.is_some()) => return false,
        None => None,
    };
    let gated = matches!(what, Stacked::Gated(_));
    if !(2..=3).contains(&segments.len())
        || gated && (segments.len() != 2 || weights[0].rows != weights[1].rows)
        || shader_type(weights[0].ty).is_none()
    {
        return false;
    }
    let mut p = params::MatmulQuant {
        rows: 0,
        cols: u(weights[0].cols),
        n: u(n),
        row0: 0,
        out_cols: 0,
        row_bytes: 0,
        d_off: u(layout.d_off),
        s_off: u(layout.s_off),
        epilogue: 0,
        _pad0: 0,
        _pad1: 0,
        _pad2: 0,
        seg_rows: [0; 4],
        seg_off: [0; 4],
        seg_row_bytes: [0; 4],
        seg_bias: [0; 4],
    };
    // Unused segments repeat the first's type: one pipeline per type set.
    let mut types = [shader_type(weights[0].ty).expect("checked above"); 3];
    for (i, w) in weights.iter().enumerate() {
        let part = &w.parts[0];
        p.seg_rows[i] = u(w.rows);
        types[i] = shader_type(w.ty).expect("colocated: quantized");
        p.seg_off[i] = u(part.offset as usize);
        p.seg_row_bytes[i] = u(w.row_bytes());
        if let Some(b) = &biases {
            p.seg_bias[i] = u((b[i].parts[0].offset / 4) as usize);
        }
    }
    let (entry, features) = match what {
        Stacked::Projections => {
            p.epilogue = if bias_buffer.is_some() {
                EPILOGUE_BIAS
            } else {
                0
            };
            ("matmul_stacked", weights.iter().map(|w| w.rows).sum())
        }
        Stacked::Gated(act) => {
            p.epilogue = match act {
                GatedActivation::SwiGlu => EPILOGUE_SWIGLU,
                GatedActivation::GeGlu => EPILOGUE_GEGLU,
            };
            ("matmul_stacked_gated", weights[0].rows)
        }
    };
    p.rows = u(features);
    let mut bindings = vec![Binding::whole(buffer), act, segments[0].out];
    if !gated {
        // Without biases the kernel reads none: any small read-only range
        // will do. A missing third output is never written.
        let bias = bias_buffer.map_or(Binding::head(buffer, 4), Binding::whole);
        let unused = Binding::whole(&dev.unused_output);
        let out = |i: usize| segments.get(i).map_or(unused, |s| s.out);
        bindings.extend([bias, out(1), out(2)]);
    }
    dev.dispatch(
        Kernel {
            types: Some(types),
            ..Kernel::new("matmul_quant.wgsl", entry)
        },
        &p,
        &bindings,
        grid(features, dev.matmul_features_per_group),
    );
    true
}

/// What a matmul does with each output as it stores it
/// (`matmul_rows.wgsl`).
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    Store,
    /// Adds the feature's bias (a 1-D weight).
    Bias(&'a WgpuWeight),
    /// Adds the output to what `y` holds.
    Accumulate,
    /// Stores `act(gate) * output`: the up projection of a gated
    /// feed-forward, `gate` its gate projection's outputs.
    Gated(GatedActivation, Binding<'a>),
}

const EPILOGUE_BIAS: u32 = 1;
const EPILOGUE_ACCUMULATE: u32 = 2;
const EPILOGUE_SWIGLU: u32 = 4;
const EPILOGUE_GEGLU: u32 = 8;
