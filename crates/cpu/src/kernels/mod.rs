//! Quantized matmul kernels.
//!
//! Weights stay in their ggml blocks (read in place from the mmap), except
//! where a packed layout pays for itself: on x86 AVX2, Q4_K matrices are
//! re-laid out eight rows at a time on first use (`pack`, `x86_packed`),
//! with bit-identical results at about twice the speed, and so are Q4_0
//! matrices (in llama.cpp's repacked-Q4_0 float sequence) and Q4_1, Q5_0,
//! Q8_0 and IQ4_NL ones (in that sequence too: their own). The
//! activations are quantized once per call to 8-bit blocks matching the weight
//! family (32-blocks for Q4_0..Q8_1, 256-super-blocks for the K-quants) and the
//! dots are integer per block, scaled once per block — the same scheme as
//! llama.cpp's CPU path, so accuracy matches it. Float weights (F32/F16/BF16)
//! dot the f32 activations directly. The products of one input (q|k|v,
//! gate|up: `matmul_many`, `matmul_pair_combined`) share its quantization
//! and one parallel section, with bias adds and the gate's activation
//! applied per chunk as it is stored.
//!
//! Multi-row: every kernel dots one weight row with up to `MAX_NR` activation
//! rows at once, so a weight block is read from memory and decoded once for
//! all of them; that is what makes verifying n draft tokens cost much less
//! than n decode steps. Larger n (prefill) runs in groups of `MAX_NR` rows
//! over L2-sized chunks of weight rows.
//!
//! SIMD: AVX2+FMA+F16C kernels for every type, chosen at runtime, and the
//! same kernels built for AVX-VNNI (256-bit `vpdpbusd`, Intel client CPUs
//! without AVX-512) and for AVX-512 VNNI where the CPU has them
//! (`vpdpbusd` dots and 32 vector registers, bit-identical results; for
//! Q2_K, Q3_K, Q5_K, Q6_K and the 32-block types, and packed Q4_K, 512-bit
//! kernels that hold two weight rows per vector (`x86_avx512`) or sixteen
//! (`x86_packed`), bit-identical too;
//! `BLOCKDRAFT_NO_AVX512=1` keeps the AVX2 build; `BLOCKDRAFT_NO_SIMD=1`
//! forces the portable scalar kernels); aarch64
//! NEON kernels for every type too, using `sdot` where the CPU has it
//! (`BLOCKDRAFT_NO_DOTPROD=1` opts out), and wasm32 simd128 ones (when the
//! build enables simd128).

use crate::pool::ThreadPool;
use blockdraft_gguf::GgmlType;
use std::cell::RefCell;

mod lattice;
#[cfg(target_arch = "aarch64")]
mod neon;
pub(crate) mod scalar;
#[cfg(test)]
mod tests;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_lattice;
#[cfg(target_arch = "x86_64")]
mod x86_packed;

/// A weight matrix in its on-disk layout: `rows` output features, each a row
/// of `cols` input features (`cols` a multiple of the type's block length).
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    /// Output features.
    pub rows: usize,
    /// Input features = row length.
    pub cols: usize,
}

/// One activation row as the kernels see it (raw pointers into the scratch so
/// building one costs nothing in the inner loop).
#[derive(Clone, Copy)]
pub(crate) struct Act {
    /// Quantized values, `cols` of them.
    pub qs: *const i8,
    /// The same values widened to i16 (only where [`WIDE_ACTIVATIONS`]).
    pub qs16: *const i16,
    /// Scale per block (per 32 or per 256 values).
    pub d: *const f32,
    /// Per 32 values, `d * sum(qs)` (`d` of the enclosing block): the min
    /// terms of Q4_1/Q5_1 and Q4_K/Q5_K become one multiply-add per block.
    pub s: *const f32,
    /// 256-blocks: sum of each 16 quants.
    pub bs: *const i16,
    /// Sum of each 32 quants (the packed kernels' mins and offsets).
    pub b32: *const i16,
    /// The f32 row itself (float weights).
    pub f: *const f32,
    /// The row is in one of the whole groups of 4 rows at the start of the
    /// batch, which llama.cpp's repacked Q4_K kernel (its gemm) accumulates
    /// per 64 values instead of per 256 (its gemv, for the other rows).
    pub in_group4: bool,
}

impl Act {
    // A method, so closures capture the whole (Sync) struct, not its fields.
    fn offset(self, q: usize, d: usize, s: usize, b: usize, f: usize) -> Act {
        Act {
            qs: self.qs.wrapping_add(q),
            qs16: self.qs16.wrapping_add(q),
            d: self.d.wrapping_add(d),
            s: self.s.wrapping_add(s),
            bs: self.bs.wrapping_add(b),
            b32: self.b32.wrapping_add(s),
            f: self.f.wrapping_add(f),
            in_group4: self.in_group4,
        }
    }
}

// SAFETY: read-only views of buffers that outlive the parallel section.
unsafe impl Send for Act {}
unsafe impl Sync for Act {}

/// Dot `nw` weight rows (each `row_bytes` after the previous, `nb` blocks
/// long) with `x.len()` (1..=MAX_NR) activation rows: the result for weight
/// row `j` and activation row `i` goes to `*out.add(i * ldo + j)`. Kernels
/// work on tiles of several weight rows so that the per-output accumulation
/// chains (whose float order is fixed, see x86.rs) run side by side instead
/// of one after another.
pub(crate) type Kernel = unsafe fn(
    w: *const u8,
    row_bytes: usize,
    nw: usize,
    nb: usize,
    x: &[Act],
    out: *mut f32,
    ldo: usize,
);

/// A kernel that dots one weight row with the activation rows, `out[i]`
/// receiving row `i`'s result; `per_row!` turns it into a [`Kernel`].
pub(crate) type RowKernel = unsafe fn(w: *const u8, nb: usize, x: &[Act], out: &mut [f32]);

/// The [`Kernel`] that runs a [`RowKernel`] on each weight row in turn.
macro_rules! per_row {
    ($f:path) => {{
        unsafe fn per_row_kernel(
            w: *const u8,
            row_bytes: usize,
            nw: usize,
            nb: usize,
            x: &[$crate::kernels::Act],
            out: *mut f32,
            ldo: usize,
        ) {
            let mut tmp = [0f32; $crate::kernels::MAX_NR];
            for j in 0..nw {
                let f: $crate::kernels::RowKernel = $f;
                f(w.add(j * row_bytes), nb, x, &mut tmp[..x.len()]);
                for (i, &v) in tmp[..x.len()].iter().enumerate() {
                    *out.add(i * ldo + j) = v;
                }
            }
        }
        per_row_kernel as $crate::kernels::Kernel
    }};
}
// Used by the SIMD kernel modules (targets without one leave it unused).
#[allow(unused_imports)]
pub(crate) use per_row;

/// `with_nr!(n, f::<NR>(args))` calls `f::<n>(args)` (or `f::<G, n>` for
/// `f::<G, NR>`): the one place a run-time count of activation rows (1 to
/// `MAX_NR`; more counts as `MAX_NR`) becomes a kernel's constant.
macro_rules! with_nr {
    ($n:expr, $f:ident::<NR>($($arg:expr),* $(,)?)) => {
        match $n {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            4 => $f::<4>($($arg),*),
            5 => $f::<5>($($arg),*),
            6 => $f::<6>($($arg),*),
            7 => $f::<7>($($arg),*),
            _ => $f::<8>($($arg),*),
        }
    };
    ($n:expr, $f:ident::<$g:ty, NR>($($arg:expr),* $(,)?)) => {
        match $n {
            1 => $f::<$g, 1>($($arg),*),
            2 => $f::<$g, 2>($($arg),*),
            3 => $f::<$g, 3>($($arg),*),
            4 => $f::<$g, 4>($($arg),*),
            5 => $f::<$g, 5>($($arg),*),
            6 => $f::<$g, 6>($($arg),*),
            7 => $f::<$g, 7>($($arg),*),
            _ => $f::<$g, 8>($($arg),*),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use with_nr;

/// The [`Kernel`] that runs `$each::<NR>` (a function with a [`Kernel`]'s
/// arguments, generic over the activation row count) with NR = `x.len()`.
/// The x86 modules use it.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_macros))]
macro_rules! tile_kernel {
    ($each:ident) => {{
        unsafe fn tile_kernel(
            w: *const u8,
            row_bytes: usize,
            nw: usize,
            nb: usize,
            x: &[$crate::kernels::Act],
            out: *mut f32,
            ldo: usize,
        ) {
            $crate::kernels::with_nr!(x.len(), $each::<NR>(w, row_bytes, nw, nb, x, out, ldo))
        }
        tile_kernel as $crate::kernels::Kernel
    }};
}
#[allow(unused_imports)]
pub(crate) use tile_kernel;

/// The [`Kernel`] running the row kernel `$f::<NR>` (or `$f::<$g, NR>`;
/// NR = `x.len()`, up to `MAX_NR`) on each weight row: the dispatch every
/// SIMD module shares.
macro_rules! by_nr {
    ($f:ident $(, $g:ty)?) => {{
        unsafe fn row(w: *const u8, nb: usize, x: &[$crate::kernels::Act], out: &mut [f32]) {
            $crate::kernels::with_nr!(x.len(), $f::<$($g,)? NR>(w, nb, x, out))
        }
        $crate::kernels::per_row!(row)
    }};
}
#[allow(unused_imports)]
pub(crate) use by_nr;

/// wasm simd128 has no 8-bit dot product: its kernels multiply i16, so
/// the activation quants are widened once per matmul instead of once per
/// weight row.
const WIDE_ACTIVATIONS: bool = cfg!(all(target_arch = "wasm32", target_feature = "simd128"));

/// Activation rows handled per kernel call.
pub(crate) const MAX_NR: usize = 8;

/// How the activations must be prepared for a weight type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ActKind {
    F32,
    Q8_0,
    Q8K,
}

pub(crate) fn act_kind(ty: GgmlType) -> ActKind {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => ActKind::F32,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 | NVFP4 => ActKind::Q8_0,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS
        | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 => ActKind::Q8K,
        t => panic!("matmul: unsupported weight type {t}"),
    }
}

/// The portable kernel for a weight type.
pub(crate) fn scalar_kernel(ty: GgmlType) -> Kernel {
    use GgmlType::*;
    match ty {
        F32 => per_row!(scalar::f32w),
        F16 => per_row!(scalar::f16w),
        BF16 => per_row!(scalar::bf16w),
        Q4_0 => per_row!(scalar::q4_0),
        Q4_1 => per_row!(scalar::q4_1),
        Q5_0 => per_row!(scalar::q5_0),
        Q5_1 => per_row!(scalar::q5_1),
        Q8_0 => per_row!(scalar::q8_0),
        Q8_1 => per_row!(scalar::q8_1),
        Q2_K => per_row!(scalar::q2_k),
        Q3_K => per_row!(scalar::q3_k),
        Q4_K => per_row!(scalar::q4_k),
        Q5_K => per_row!(scalar::q5_k),
        Q6_K => per_row!(scalar::q6_k),
        Q8_K => per_row!(scalar::q8_k),
        IQ4_NL => per_row!(scalar::iq4_nl),
        IQ4_XS => per_row!(scalar::iq4_xs),
        IQ2_XXS => per_row!(lattice::iq2_xxs),
        IQ2_XS => per_row!(lattice::iq2_xs),
        IQ2_S => per_row!(lattice::iq2_s),
        IQ3_XXS => per_row!(lattice::iq3_xxs),
        IQ3_S => per_row!(lattice::iq3_s),
        IQ1_S => per_row!(lattice::iq1_s),
        IQ1_M => per_row!(lattice::iq1_m),
        TQ1_0 => per_row!(lattice::tq1_0),
        TQ2_0 => per_row!(lattice::tq2_0),
        MXFP4 => per_row!(lattice::mxfp4),
        NVFP4 => per_row!(lattice::nvfp4),
        t => panic!("matmul: unsupported weight type {t}"),
    }
}

/// The fastest kernel this CPU supports for `ty`.
pub(crate) fn best_kernel(ty: GgmlType) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = x86::kernel(ty) {
        return k;
    }
    #[cfg(target_arch = "aarch64")]
    if !neon::disabled() {
        if let Some(k) = neon::kernel(ty) {
            return k;
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if let Some(k) = wasm::kernel(ty) {
        return k;
    }
    scalar_kernel(ty)
}

/// Reused per-thread activation scratch, so the hot path does not allocate
/// once it has grown to the largest shape.
#[derive(Default)]
struct Scratch {
    qs: Vec<i8>,
    qs16: Vec<i16>,
    d: Vec<f32>,
    s: Vec<f32>,
    bs: Vec<i16>,
    b32: Vec<i16>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// A raw pointer that may cross threads; every task writes disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    // A method (not field access) so closures capture the whole Sync wrapper.
    fn get(self) -> *mut T {
        self.0
    }
}

/// `out[r * w.rows + o] = sum_k W[o, k] * x[r * w.cols + k]` for every
/// activation row `r` in `0..x.len() / w.cols`.
///
/// Every row gets the float sequence llama.cpp uses for a one-token batch,
/// so a row's result does not depend on the rows beside it.
pub fn matmul(pool: &ThreadPool, w: &WeightRef, x: &[f32], out: &mut [f32]) {
    matmul_with(pool, w, x, out, best_kernel(w.ty), false);
}

/// Like `matmul`, but the rows in the batch's whole groups of 4 get the
/// float sequence of llama.cpp's batch (gemm) kernel where it differs
/// (repacked Q4_K), so results equal llama.cpp's for the same batch.
pub fn matmul_llamacpp_batch(pool: &ThreadPool, w: &WeightRef, x: &[f32], out: &mut [f32]) {
    matmul_with(pool, w, x, out, best_kernel(w.ty), true);
}

pub(crate) fn matmul_with(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    out: &mut [f32],
    kernel: Kernel,
    gemm_groups: bool,
) {
    matmul_operand(pool, Operand::ggml(*w, kernel, gemm_groups), x, out);
}

/// A weight as a matmul reads it: `w.rows` rows of `row_bytes` each in the
/// layout `kernel` reads, tasks starting at multiples of `tile_rows`.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    w: WeightRef<'a>,
    row_bytes: usize,
    tile_rows: usize,
    kernel: Kernel,
    /// The batch's whole groups of 4 rows get llama.cpp's gemm order.
    gemm_groups: bool,
}

impl<'a> Operand<'a> {
    /// `w` in its ggml layout, for `kernel`.
    pub(crate) fn ggml(w: WeightRef<'a>, kernel: Kernel, gemm_groups: bool) -> Self {
        let bl = w.ty.block_len();
        assert!(
            w.cols > 0 && w.cols.is_multiple_of(bl),
            "matmul: cols {} not a multiple of {bl}",
            w.cols
        );
        Operand {
            w,
            row_bytes: w.cols / bl * w.ty.block_bytes(),
            tile_rows: 8,
            kernel,
            gemm_groups,
        }
    }

    /// Weight rows per task for `n` activation rows on `n_threads`.
    fn chunk_rows(&self, n: usize, n_threads: usize) -> usize {
        let (rows, tile) = (self.w.rows, self.tile_rows);
        // Four chunks per thread, in whole tiles of weight rows: the units
        // the pool moves from a slow thread's share to a fast one (the
        // machine is shared). On Qwen2.5-Coder-0.5B and 1.5B at 2 threads,
        // against four: two were 7 % slower (imbalance); sixteen 3–8 %
        // slower when threads drew chunks from one counter, and still
        // 0–4 % slower with contiguous shares.
        let chunk = if n_threads == 1 {
            rows
        } else {
            rows.div_ceil(n_threads * 4).next_multiple_of(tile)
        };
        if n <= MAX_NR {
            return chunk.max(1);
        }
        // Several passes over the chunk (one per group of MAX_NR activation
        // rows): small enough to stay in L2, so only the first pass reads
        // DRAM.
        const CHUNK_BYTES: usize = 192 << 10;
        chunk
            .min((CHUNK_BYTES / self.row_bytes).max(tile) / tile * tile)
            .max(1)
    }

    /// Checks the shapes of `out = x · Wᵀ` for `x` of `cols`-wide rows;
    /// returns the activation rows.
    fn check(&self, x: &[f32], out: &[f32]) -> usize {
        let (rows, cols) = (self.w.rows, self.w.cols);
        assert!(
            self.w.data.len() >= rows * self.row_bytes,
            "matmul: weight data too short"
        );
        assert_eq!(x.len() % cols, 0, "matmul: x is not whole rows");
        let n = x.len() / cols;
        assert_eq!(out.len(), n * rows, "matmul: out has the wrong size");
        n
    }

    /// Weight rows `o0..o1` against every activation row of `acts`, into
    /// `out` (`acts.n` rows of `w.rows`).
    ///
    /// # Safety
    /// `o0 < o1 <= w.rows`, `out` holds `acts.n * w.rows` values, no other
    /// thread writes its columns `o0..o1`, and `acts` was prepared for this
    /// weight's quantization from rows of `w.cols`.
    unsafe fn run_rows(&self, acts: &Activations, o0: usize, o1: usize, out: *mut f32) {
        let n = acts.n;
        let nb = self.w.cols / self.w.ty.block_len();
        let mut xs = [acts.row(0, false); MAX_NR];
        // Group of activation rows outer (it stays in L1 across the chunk's
        // weight rows), weight rows inner.
        for g in (0..n).step_by(MAX_NR) {
            let nr = (n - g).min(MAX_NR);
            for (i, a) in xs[..nr].iter_mut().enumerate() {
                *a = acts.row(g + i, self.gemm_groups);
            }
            // SAFETY: rows o0..o1 < rows and the data length was checked;
            // the kernel reads `nb` blocks of each and `cols` activations of
            // rows < n, all in bounds, and writes outputs (g + i, o) for o
            // in o0..o1 alone.
            unsafe {
                let w0 = self.w.data.as_ptr().add(o0 * self.row_bytes);
                let out0 = out.add(g * self.w.rows + o0);
                (self.kernel)(
                    w0,
                    self.row_bytes,
                    o1 - o0,
                    nb,
                    &xs[..nr],
                    out0,
                    self.w.rows,
                );
            }
        }
    }
}

/// `out = x · Wᵀ` for a weight as its kernel reads it.
pub(crate) fn matmul_operand(pool: &ThreadPool, op: Operand, x: &[f32], out: &mut [f32]) {
    matmul_many(
        pool,
        x,
        &mut [Product {
            op,
            bias: None,
            out,
        }],
    );
}

/// One product of a shared input: `out = x · Wᵀ (+ bias)`.
pub(crate) struct Product<'a, 'o> {
    pub op: Operand<'a>,
    pub bias: Option<&'a [f32]>,
    pub out: &'o mut [f32],
}

/// The products of one input (q|k|v, gate|up): the input is quantized
/// once where their weights take the same quantization, and every
/// product's chunks are tasks of one parallel section; each bias is added
/// as its chunk is stored. Results equal one `matmul` (and bias add) each.
pub(crate) fn matmul_many(pool: &ThreadPool, x: &[f32], products: &mut [Product]) {
    let Some(first) = products.first() else {
        return;
    };
    let q = Quantization::of(first.op.w.ty);
    let cols = first.op.w.cols;
    if products
        .iter()
        .any(|p| Quantization::of(p.op.w.ty) != q || p.op.w.cols != cols)
    {
        for p in products {
            matmul_many(pool, x, std::slice::from_mut(p));
        }
        return;
    }
    let mut n = 0;
    for p in products.iter() {
        n = p.op.check(x, p.out);
        if let Some(b) = p.bias {
            assert_eq!(b.len(), p.op.w.rows, "matmul: bias length");
        }
    }
    if n == 0 {
        return;
    }
    // (operand, bias, output, rows per chunk, first task) per product.
    let nt = pool.n_threads();
    let mut first_task = 0;
    let jobs: Vec<_> = products
        .iter_mut()
        .map(|p| {
            let chunk = p.op.chunk_rows(n, nt);
            let job = (p.op, p.bias, SendPtr(p.out.as_mut_ptr()), chunk, first_task);
            first_task += p.op.w.rows.div_ceil(chunk);
            job
        })
        .collect();
    with_quantized(pool, q, x, cols, n, |acts| {
        pool.run(first_task, &|t| {
            let &(op, bias, out, chunk, t0) = jobs
                .iter()
                .rev()
                .find(|j| j.4 <= t)
                .expect("task 0 is the first job's");
            let rows = op.w.rows;
            let o0 = (t - t0) * chunk;
            let o1 = (o0 + chunk).min(rows);
            // SAFETY: task t alone writes columns o0..o1 of this output,
            // whose size `check` verified; `acts` is x quantized for `q`.
            unsafe { op.run_rows(&acts, o0, o1, out.get()) };
            if let Some(b) = bias {
                for r in 0..n {
                    // SAFETY: as above, columns o0..o1 of row r < n.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(out.get().add(r * rows + o0), o1 - o0)
                    };
                    row.iter_mut().zip(&b[o0..o1]).for_each(|(v, b)| *v += b);
                }
            }
        });
    });
}

/// `combine(c0, a, b, out)` of [`matmul_pair_combined`].
pub(crate) type Combine<'a> = dyn Fn(usize, &[f32], &[f32], &mut [f32]) + Sync + 'a;

/// `out = combine(x · Aᵀ, x · Bᵀ)` for two weights of the same shape (a
/// gated feed-forward's gate and up): both products and their combination
/// run chunk by chunk in one parallel section, the input quantized once.
/// `combine(c0, a, b, out)` gets the spans of columns `c0..c0 + a.len()`
/// of one row of each, once both are stored (spans start at multiples of
/// 8 columns). Where the weights' layouts or quantizations differ, both
/// products run first and `combine` then gets whole rows.
pub(crate) fn matmul_pair_combined(
    pool: &ThreadPool,
    x: &[f32],
    a: Product,
    b: Product,
    out: &mut [f32],
    combine: &Combine<'_>,
) {
    let (ao, bo) = (a.op, b.op);
    let same = Quantization::of(ao.w.ty) == Quantization::of(bo.w.ty)
        && (ao.w.rows, ao.w.cols, ao.row_bytes, ao.tile_rows)
            == (bo.w.rows, bo.w.cols, bo.row_bytes, bo.tile_rows)
        && a.bias.is_none()
        && b.bias.is_none();
    let rows = ao.w.rows;
    if !same {
        let (a_out, b_out) = (a.out, b.out);
        matmul_many(
            pool,
            x,
            &mut [Product { out: a_out, ..a }, Product { out: b_out, ..b }],
        );
        assert_eq!(out.len(), a_out.len(), "matmul: combined output size");
        for ((o, a), b) in out
            .chunks_exact_mut(rows.max(1))
            .zip(a_out.chunks_exact(rows.max(1)))
            .zip(b_out.chunks_exact(rows.max(1)))
        {
            combine(0, a, b, o);
        }
        return;
    }
    let n = ao.check(x, a.out);
    bo.check(x, b.out);
    assert_eq!(out.len(), n * rows, "matmul: combined output size");
    if n == 0 {
        return;
    }
    let chunk = ao.chunk_rows(n, pool.n_threads());
    let (ap, bp, op) = (
        SendPtr(a.out.as_mut_ptr()),
        SendPtr(b.out.as_mut_ptr()),
        SendPtr(out.as_mut_ptr()),
    );
    with_quantized(pool, Quantization::of(ao.w.ty), x, ao.w.cols, n, |acts| {
        pool.run(rows.div_ceil(chunk), &|t| {
            let o0 = t * chunk;
            let o1 = (o0 + chunk).min(rows);
            // SAFETY: task t alone reads and writes columns o0..o1 of the
            // three outputs, whose sizes were checked; `acts` is x quantized
            // for both weights.
            unsafe {
                ao.run_rows(&acts, o0, o1, ap.get());
                bo.run_rows(&acts, o0, o1, bp.get());
                for r in 0..n {
                    let at = r * rows + o0;
                    let span =
                        |p: SendPtr<f32>| std::slice::from_raw_parts_mut(p.get().add(at), o1 - o0);
                    combine(o0, span(ap), span(bp), span(op));
                }
            }
        });
    });
}

/// A weight matrix re-laid out for a kernel that reads several weight rows
/// per vector (see `x86_packed`). Its float sequence is llama.cpp's for
/// Q4_K, Q4_1, Q5_0 and Q8_0 (bit-identical to the ggml-layout kernels)
/// and Q4_0 (llama.cpp's repacked one), and its own, documented, for the
/// others
/// ([`packed_follows_llamacpp`]); every row's result is independent of the
/// rows beside it either way.
pub struct PackedWeight {
    data: crate::WeightBuffer,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// Rows the kernel reads as one unit (tasks start at multiples).
    tile_rows: usize,
    kernel: Kernel,
    llamacpp_gemm_order: bool,
}

impl PackedWeight {
    /// Bytes held (a copy of the weight, in the new layout).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether batches of 4 or more rows also get llama.cpp's float
    /// sequence for them (its gemm), not only single rows.
    pub fn matches_llamacpp_batches(&self) -> bool {
        self.llamacpp_gemm_order
    }
}

/// Whether `ty`'s packed kernel on this CPU keeps llama.cpp's float sequence
/// for single rows (Q4_K, Q4_1, Q5_0, Q8_0: bit-identical to the
/// ggml-layout kernels; Q4_0: llama.cpp's repacked one). Q6_K and IQ4_NL
/// have their own (`x86_packed`): faster, equal to llama.cpp's only to
/// rounding.
pub fn packed_follows_llamacpp(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_K | Q4_0 | Q4_1 | Q5_0 | Q8_0)
}

/// The packed form of `w`, where this CPU has a packed kernel for its type
/// and shape (x86: Q4_K, Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL and Q6_K on AVX2 and
/// AVX-512 VNNI, with whole groups of 8 rows). `fast`: Q4_1, Q5_0 and Q8_0
/// in the packed layout's own float sequence instead of llama.cpp's (see
/// `x86_packed`). Packing runs on the pool.
pub fn pack(pool: &ThreadPool, w: &WeightRef, fast: bool) -> Option<PackedWeight> {
    #[cfg(target_arch = "x86_64")]
    if let Some(layout) = x86_packed::layout(w.ty, fast) {
        // The AVX-512 kernels read groups in pairs, laid out interleaved.
        let (kernel, tile_groups) = if x86::has_avx512_vnni() {
            (layout.kernel_avx512, 2)
        } else if x86::has_avx2() {
            (layout.kernel, 1)
        } else {
            return None;
        };
        return pack_for(pool, w, layout, kernel, tile_groups);
    }
    let _ = (pool, w, fast);
    None
}

/// `w` packed in `layout` for `kernel`, which reads `tile_groups` groups
/// (1, or 2 interleaved block by block) as one unit; `None` where the
/// shape has no whole groups.
#[cfg(target_arch = "x86_64")]
fn pack_for(
    pool: &ThreadPool,
    w: &WeightRef,
    layout: &x86_packed::Layout,
    kernel: Kernel,
    tile_groups: usize,
) -> Option<PackedWeight> {
    use x86_packed::GROUP_ROWS;
    if w.rows == 0 || !w.rows.is_multiple_of(GROUP_ROWS) || !w.cols.is_multiple_of(layout.block_len)
    {
        return None;
    }
    let nb = w.cols / layout.block_len;
    let block = layout.group_block_bytes;
    let group_bytes = nb * block;
    let src_group = GROUP_ROWS * nb * layout.src_block_bytes;
    let n_groups = w.rows / GROUP_ROWS;
    assert!(
        w.data.len() >= n_groups * src_group,
        "pack: weight data too short"
    );
    let mut data = crate::WeightBuffer::zeroed(n_groups * group_bytes);
    let dst = SendPtr(data.as_mut_slice().as_mut_ptr());
    pool.run(n_groups.div_ceil(tile_groups), &|t| {
        let g0 = t * tile_groups;
        let groups = tile_groups.min(n_groups - g0);
        // SAFETY: tile t owns its disjoint range of `data`.
        let out = unsafe {
            std::slice::from_raw_parts_mut(dst.get().add(g0 * group_bytes), groups * group_bytes)
        };
        for i in 0..groups {
            let src = &w.data[(g0 + i) * src_group..(g0 + i + 1) * src_group];
            (layout.pack_group)(src, nb, &mut out[i * block..], groups * block);
        }
    });
    Some(PackedWeight {
        data,
        ty: w.ty,
        rows: w.rows,
        cols: w.cols,
        row_bytes: group_bytes / GROUP_ROWS,
        tile_rows: tile_groups * GROUP_ROWS,
        kernel,
        llamacpp_gemm_order: layout.llamacpp_gemm_order,
    })
}

/// `matmul` on a packed weight (same results as on the original).
pub fn matmul_packed(pool: &ThreadPool, p: &PackedWeight, x: &[f32], out: &mut [f32]) {
    matmul_operand(pool, p.operand(), x, out);
}

impl PackedWeight {
    /// This weight as its packed kernel reads it.
    pub(crate) fn operand(&self) -> Operand<'_> {
        Operand {
            w: WeightRef {
                ty: self.ty,
                data: self.data.as_slice(),
                rows: self.rows,
                cols: self.cols,
            },
            row_bytes: self.row_bytes,
            tile_rows: self.tile_rows,
            kernel: self.kernel,
            gemm_groups: false,
        }
    }
}

/// How the activations are prepared for a weight type; products of one
/// input share the prepared rows where it is equal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Quantization {
    kind: ActKind,
    /// llama.cpp pairs Q4_1/Q5_1 with block_q8_1, whose sum is stored as
    /// f16.
    q8_1_sums: bool,
}

impl Quantization {
    fn of(ty: GgmlType) -> Self {
        Quantization {
            kind: act_kind(ty),
            q8_1_sums: matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1),
        }
    }
}

/// The `n` prepared rows of one input, as kernel rows.
#[derive(Clone, Copy)]
struct Activations {
    base: Act,
    kind: ActKind,
    cols: usize,
    n: usize,
}

impl Activations {
    /// Activation row `r`; `gemm_groups`: a row in the batch's whole
    /// groups of 4 is marked for llama.cpp's gemm order.
    fn row(&self, r: usize, gemm_groups: bool) -> Act {
        let cols = self.cols;
        // Offsets only matter for the buffers this kind uses (the others
        // may be empty), hence `offset`'s wrapping_add.
        let (q_off, d_off, s_off, b_off) = match self.kind {
            ActKind::F32 => (0, 0, 0, 0),
            ActKind::Q8_0 => (r * cols, r * cols / 32, r * cols / 32, r * cols / 16),
            ActKind::Q8K => (r * cols, r * cols / 256, r * cols / 32, r * cols / 16),
        };
        Act {
            in_group4: gemm_groups && r < self.n - self.n % 4,
            ..self.base.offset(q_off, d_off, s_off, b_off, r * cols)
        }
    }
}

/// Prepares the `n` rows of `x` (`cols` each) for `q` in this thread's
/// scratch and runs `f` on them.
fn with_quantized(
    pool: &ThreadPool,
    q: Quantization,
    x: &[f32],
    cols: usize,
    n: usize,
    f: impl FnOnce(Activations),
) {
    SCRATCH.with(|cell| {
        // A nested matmul on this thread (not expected) gets its own scratch.
        let mut fresh = Scratch::default();
        let mut guard = cell.try_borrow_mut();
        let sc: &mut Scratch = match guard {
            Ok(ref mut g) => g,
            Err(_) => &mut fresh,
        };
        let nblk = match q.kind {
            ActKind::F32 => 0,
            ActKind::Q8_0 => cols / 32,
            ActKind::Q8K => cols / 256,
        };
        if q.kind != ActKind::F32 {
            grow(&mut sc.qs, n * cols);
            if WIDE_ACTIVATIONS {
                grow(&mut sc.qs16, n * cols);
            }
            grow(&mut sc.d, n * nblk);
            grow(&mut sc.s, n * cols / 32);
            grow(&mut sc.b32, n * cols / 32);
            if q.kind == ActKind::Q8K {
                grow(&mut sc.bs, n * cols / 16);
            }
            quantize_rows(pool, q, x, cols, n, sc);
        }
        f(Activations {
            base: Act {
                qs: sc.qs.as_ptr(),
                qs16: sc.qs16.as_ptr(),
                d: sc.d.as_ptr(),
                s: sc.s.as_ptr(),
                bs: sc.bs.as_ptr(),
                b32: sc.b32.as_ptr(),
                f: x.as_ptr(),
                in_group4: false,
            },
            kind: q.kind,
            cols,
            n,
        });
    });
}

/// Quantize the `n` rows of `x` into the scratch (in parallel when large).
fn quantize_rows(
    pool: &ThreadPool,
    q: Quantization,
    x: &[f32],
    cols: usize,
    n: usize,
    sc: &mut Scratch,
) {
    let qs16 = SendPtr(sc.qs16.as_mut_ptr());
    let (qs, d, s, bs, b32) = (
        SendPtr(sc.qs.as_mut_ptr()),
        SendPtr(sc.d.as_mut_ptr()),
        SendPtr(sc.s.as_mut_ptr()),
        SendPtr(sc.bs.as_mut_ptr()),
        SendPtr(sc.b32.as_mut_ptr()),
    );
    let (kind, q8_1_sums) = (q.kind, q.q8_1_sums);
    let one = |r: usize| {
        let xr = &x[r * cols..(r + 1) * cols];
        // SAFETY: row r owns these disjoint ranges of buffers grown to n rows.
        unsafe {
            let q = std::slice::from_raw_parts_mut(qs.get().add(r * cols), cols);
            match kind {
                ActKind::Q8_0 => {
                    let nbk = cols / 32;
                    let d = std::slice::from_raw_parts_mut(d.get().add(r * nbk), nbk);
                    let s = std::slice::from_raw_parts_mut(s.get().add(r * nbk), nbk);
                    let b32 = std::slice::from_raw_parts_mut(b32.get().add(r * nbk), nbk);
                    quantize_q8_0(xr, q, d, s, b32, q8_1_sums);
                }
                ActKind::Q8K => {
                    let nbk = cols / 256;
                    let d = std::slice::from_raw_parts_mut(d.get().add(r * nbk), nbk);
                    let b = std::slice::from_raw_parts_mut(bs.get().add(r * cols / 16), cols / 16);
                    quantize_q8_k(xr, q, d, b);
                    let s = std::slice::from_raw_parts_mut(s.get().add(r * cols / 32), cols / 32);
                    let b32 =
                        std::slice::from_raw_parts_mut(b32.get().add(r * cols / 32), cols / 32);
                    for (k, (v, v32)) in s.iter_mut().zip(b32).enumerate() {
                        // |sum of 32| <= 32 * 127: exact in i16.
                        *v32 = b[2 * k] + b[2 * k + 1];
                        *v = d[k / 8] * *v32 as f32;
                    }
                }
                ActKind::F32 => return,
            }
            if WIDE_ACTIVATIONS {
                let q16 = std::slice::from_raw_parts_mut(qs16.get().add(r * cols), cols);
                for (w, &v) in q16.iter_mut().zip(q.iter()) {
                    *w = v as i16;
                }
            }
        }
    };
    if n * cols >= 1 << 16 && pool.n_threads() > 1 {
        pool.run(n, &one);
    } else {
        (0..n).for_each(one);
    }
}

fn quantize_q8_0(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    sums: &mut [i16],
    q8_1_sums: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: AVX2 checked at runtime.
        return unsafe { x86::quantize_q8_0(x, qs, d, s, sums, q8_1_sums) };
    }
    scalar::quantize_q8_0(x, qs, d, s, sums, q8_1_sums)
}

fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: AVX2 checked at runtime.
        return unsafe { x86::quantize_q8_k(x, qs, d, bs) };
    }
    scalar::quantize_q8_k(x, qs, d, bs)
}

/// Runs `f` inside a function compiled for FMA when the CPU has it, so the
/// `mul_add`s that `f` inlines (ggml's float sequences use many) are single
/// instructions instead of calls to libm's `fmaf`. Same results either way.
#[inline(always)]
pub(crate) fn with_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma_enabled<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX2+FMA checked at runtime.
        return unsafe { fma_enabled(f) };
    }
    f()
}

/// Dot product of two equal-length f32 slices, with the float sequence of
/// ggml's `ggml_vec_dot_f32` on AVX2 (which llama.cpp uses for attention
/// with an f32 KV cache), so scores are bit-equal to llama.cpp's: element
/// `i < n - n % 32` goes by fused multiply-add into lane `i % 32` of 32
/// partial sums (four 8-wide accumulators), which are reduced as
/// `(acc0 + acc2) + (acc1 + acc3)` lane-wise, then `lo4 + hi4`, then
/// `(t0 + t1) + (t2 + t3)`; the remaining elements are added one by one.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: AVX2+FMA checked at runtime; lengths equal.
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_f32_scalar(a, b)
}

pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..32 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut s = reduce32(&acc);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// The reduction of `dot_f32`'s 32 lane sums (lane `l` is element `l % 8`
/// of accumulator `l / 8`).
pub(crate) fn reduce32(acc: &[f32; 32]) -> f32 {
    let v: [f32; 8] = std::array::from_fn(|i| (acc[i] + acc[16 + i]) + (acc[8 + i] + acc[24 + i]));
    let t: [f32; 4] = std::array::from_fn(|i| v[i] + v[4 + i]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `y = fma(a, x, y)` elementwise (one rounding per element, as ggml's
/// vectorised FMA loops do).
pub fn axpy_f32(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: AVX2+FMA checked at runtime; lengths equal.
        return unsafe { x86::axpy_f32(y, a, x) };
    }
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = a.mul_add(xv, *yv);
    }
}

/// Whether `matmul` handles weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
            | TQ1_0
            | TQ2_0
            | MXFP4
            | NVFP4
    )
}

/// The SIMD instruction set the kernels use on this CPU, for logs.
pub fn simd_level() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx512_vnni() {
        return "avx512+vnni";
    }
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx_vnni() {
        return "avx2+avxvnni";
    }
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        return "avx2+fma";
    }
    #[cfg(target_arch = "aarch64")]
    if !neon::disabled() {
        return if neon::has_dotprod() {
            "neon+dotprod"
        } else {
            "neon"
        };
    }
    if cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
        return "simd128";
    }
    "scalar"
}
