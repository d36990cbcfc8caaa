//! CPU backend: quantized kernels on the weights' own blocks, SIMD, a persistent thread pool.
//!
//! It is the reference every other backend is tested against, so each op is
//! written for clarity first; the matmul kernels (where the time goes) are
//! in [`kernels`].

pub mod kernels;
pub mod pool;
mod weight_buffer;

pub use weight_buffer::WeightBuffer;

pub mod attention;
mod delta_net;
mod libm;
mod ops;

use blockdraft_core::backend::{
    AttentionMask, AttentionOps, AttentionParams, BackendError, ConvParams, DeltaNetParams, Device,
    DrafterOps, ElementwiseOps, GatedActivation, HybridOps, KvType, LinearOps, MemoryLimits,
    Projection, RopeParams, SamplingOps, WeightRole, WeightSource,
};
use blockdraft_core::host_ops;
use blockdraft_gguf::{GgmlType, TensorData};
use half::{f16, slice::HalfFloatSliceExt};
use kernels::{Operand, PackedWeight, Product, WeightRef};
use pool::ThreadPool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A row-major f32 matrix, or an f16 one for a KV cache
/// ([`blockdraft_core::backend::Device::kv_tensor`]).
pub struct CpuTensor {
    data: Vec<f32>,
    /// The values of an f16 tensor; `data` is then empty.
    half: Vec<f16>,
    rows: usize,
    cols: usize,
}

impl CpuTensor {
    fn is_f16(&self) -> bool {
        !self.half.is_empty()
    }

    fn capacity(&self) -> usize {
        self.data.len().max(self.half.len())
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.data[..self.rows * self.cols]
    }

    /// The values in use, as f32 (an f16 cache widened).
    fn values(&self) -> Vec<f32> {
        if self.is_f16() {
            let half = &self.half[..self.rows * self.cols];
            half.iter().map(|h| h.to_f32()).collect()
        } else {
            self.as_slice().to_vec()
        }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data[..self.rows * self.cols]
    }
}

/// A weight kept in its GGUF type, in place in the memory map. 1-D weights
/// (norms, biases) are small and kept as f32.
///
/// On its first matmul a matrix moves into huge-page memory
/// ([`WeightBuffer`]), where decoding streams it faster: re-laid out if this
/// CPU has a packed kernel for it (`kernels::pack`, x86: Q4_K and Q4_0 in
/// llama.cpp's float sequence for them, Q6_K, Q4_1, Q5_0, Q8_0 and IQ4_NL
/// in their own; up to twice as fast), copied as it is
/// otherwise. The copy replaces the mapped pages in memory, which are
/// released. Tables that are only embedded from stay in the map.
pub struct CpuWeight {
    ty: GgmlType,
    /// A drafter's weight runs the fastest kernels whatever the backend's
    /// setting ([`WeightRole::Proposer`]).
    role: WeightRole,
    rows: usize,
    cols: usize,
    data: TensorData,
    dense: Vec<f32>,
    resident: OnceLock<Option<Resident>>,
    /// A matrix's values as f32, made on first use by an op that reads
    /// them element by element (a DeltaNet block's convolution taps).
    values: OnceLock<Vec<f32>>,
}

/// A matrix's copy in [`WeightBuffer`] memory.
enum Resident {
    /// Re-laid out for a packed kernel.
    Packed(PackedWeight),
    /// The file's bytes, for the ggml-layout kernels.
    Copied(WeightBuffer),
}

impl CpuWeight {
    /// Every value as f32 (a vector's are kept from loading).
    fn values(&self) -> &[f32] {
        if !self.dense.is_empty() {
            return &self.dense;
        }
        self.values.get_or_init(|| {
            let mut v = vec![0.0; self.rows * self.cols];
            // The bytes were checked against the type and shape at load.
            if blockdraft_gguf::quants::dequantize(self.ty, &self.data, &mut v).is_err() {
                v.clear();
            }
            v
        })
    }

    fn matrix(&self) -> WeightRef<'_> {
        WeightRef {
            ty: self.ty,
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Awaited before every readback; see [`CpuBackend::with_readback_hook`].
pub type ReadbackHook = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

pub struct CpuBackend {
    pool: ThreadPool,
    readback_hook: Option<ReadbackHook>,
    /// SIMD matmul kernels where the CPU has them; off for the scalar
    /// reference.
    simd: bool,
    llamacpp_batches: bool,
    /// Matrices move into huge-page memory on first use, packed for the
    /// faster kernels where they exist (see [`CpuWeight`]).
    packing: bool,
    /// Faster kernels in their own float sequences where llama.cpp's cost
    /// speed ([`Self::with_fast_kernels`]).
    fast_kernels: bool,
    /// Bytes of packed copies made so far.
    packed_bytes: AtomicUsize,
    /// Bytes of plain (unpacked) copies made so far.
    copied_bytes: AtomicUsize,
    /// GGUF bytes of every weight loaded ([`blockdraft_core::backend::Device::weight_bytes_loaded`]).
    loaded_bytes: AtomicU64,
    /// The first error an op recorded ([`blockdraft_core::backend::Device::record_error`]).
    error: OnceLock<BackendError>,
    /// At most this much memory for weights and states, whatever the host
    /// has (see [`Self::with_memory_budget`]).
    memory_budget: Option<u64>,
}

impl CpuBackend {
    /// A backend running on `n_threads` threads (the caller's included).
    ///
    /// Its float sequences are llama.cpp's (AVX2 build) for one token, for
    /// every row of a forward pass: a row's logits do not depend on how the
    /// sequence was split into passes (speculative decoding relies on this),
    /// and out of the box it gives llama.cpp's tokens (its defaults: an f16
    /// cache with flash attention). Except where Q6_K and IQ4_NL matrices
    /// (x86) run packed kernels with their own sequence (faster on several
    /// rows; the same bits on AVX2 and AVX-512 VNNI; equal to llama.cpp's
    /// to rounding, still independent of the batch): for llama.cpp's exact
    /// results use [`Self::without_packing`] or
    /// [`Self::matching_llamacpp_batches`]. [`Self::with_fast_kernels`]
    /// trades llama.cpp's tokens for speed. A drafter's matrices
    /// ([`WeightRole::Proposer`]) take the fast kernels' layouts either way:
    /// they only propose tokens the target verifies.
    pub fn new(n_threads: usize) -> Self {
        CpuBackend {
            pool: ThreadPool::new(n_threads.max(1)),
            readback_hook: None,
            simd: true,
            llamacpp_batches: false,
            packing: true,
            fast_kernels: false,
            packed_bytes: AtomicUsize::new(0),
            copied_bytes: AtomicUsize::new(0),
            loaded_bytes: AtomicU64::new(0),
            error: OnceLock::new(),
            memory_budget: None,
        }
    }

    /// A model's weights, or one state, larger than `bytes` is refused
    /// before it is loaded or allocated, as one beyond the host's available
    /// memory is: for a process that shares the machine with other work.
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// A backend on the portable scalar matmul kernels: the reference the
    /// SIMD kernels (and other backends) are checked against.
    pub fn scalar(n_threads: usize) -> Self {
        CpuBackend {
            simd: false,
            ..Self::new(n_threads)
        }
    }

    /// Like `new`, but passes of several rows use the float sequences
    /// llama.cpp uses for batches where they differ (attention's value
    /// product, repacked Q4_K), and only the packed layouts in llama.cpp's
    /// sequence are used, so logits are bit-equal to llama.cpp's for
    /// the same batching, e.g. a prompt in one batch then one token at a
    /// time. Results then depend on the batching, so speculative decoding
    /// is no longer exactly identical to plain greedy decoding.
    pub fn matching_llamacpp_batches(n_threads: usize) -> Self {
        CpuBackend {
            llamacpp_batches: true,
            ..Self::new(n_threads)
        }
    }

    /// Kernels in their own float sequences where llama.cpp's cost speed,
    /// at the price of llama.cpp's exact tokens (a pass's rows still do not
    /// depend on each other, so speculative output stays plain decoding's):
    /// - an f16 cache's attention in the tiled kernel
    ///   (`attention::tiled_attention_f16`: f32 accumulators, keys shared by
    ///   the rows of a pass) instead of llama.cpp's flash attention, whose
    ///   f16 accumulator is rounded at every key: on Zen 3 (AVX2) 0.9-2.9x
    ///   as fast for a decode row and 1.6-3.4x for 8 verify rows over
    ///   64-512 keys, more at depth;
    /// - packed Q4_1, Q5_0 and Q8_0 (x86) with one float sum per block
    ///   instead of llama.cpp's eight lanes (`x86_packed`), and their
    ///   AVX-512 VNNI kernels.
    ///
    /// Top-1 agreement with llama-server's defaults: SmolLM2 97.11 % (100 %
    /// by default), Qwen2.5-Coder-0.5B 100 %, 1.5B 99.05 %, Gemma 3 270M
    /// 98.11 % (`tests/llamacpp_agreement.rs`). Not on wasm32, which has no
    /// FMA instruction: the tiled kernel's fused multiply-adds would run in
    /// software there, and the packed kernels are x86's.
    pub fn with_fast_kernels(mut self) -> Self {
        self.fast_kernels = !cfg!(target_arch = "wasm32");
        self
    }

    /// Keeps every weight in place in the memory map, without packed or
    /// huge-page copies (see [`CpuWeight`]): loads faster, runs the
    /// ggml-layout kernels (slower on multi-row batches and on
    /// compute-bound CPUs; the same results for Q4_K, Q4_1, Q5_0 and Q8_0,
    /// llama.cpp's unpacked sequence for the others) and streams the weights from 4 KiB pages.
    pub fn without_packing(mut self) -> Self {
        self.packing = false;
        self
    }

    /// Awaits `hook` before each readback (`read`, `argmax`). Readbacks
    /// complete at once here, so a browser engine yields to the JS event
    /// loop there: otherwise a whole generation would run before an abort
    /// message could arrive.
    pub fn with_readback_hook(mut self, hook: ReadbackHook) -> Self {
        self.readback_hook = Some(hook);
        self
    }

    async fn before_readback(&self) {
        if let Some(hook) = self.readback_hook {
            hook().await;
        }
    }

    /// Bytes of packed weight copies made so far (they replace the mapped
    /// pages of the weights they copy).
    pub fn packed_bytes(&self) -> usize {
        self.packed_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of weights copied as they are into huge pages so far (they
    /// replace the mapped pages too).
    pub fn copied_bytes(&self) -> usize {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// `w` in huge-page memory: packed where a packed kernel exists, else
    /// copied, where the OS gives huge pages for it.
    fn make_resident(&self, w: &CpuWeight) -> Option<Resident> {
        // Matching llama.cpp bit for bit, only the layouts in its sequence;
        // a drafter's products only propose, so any layout, the fastest.
        let proposes = w.role == WeightRole::Proposer;
        let pack = proposes || !self.llamacpp_batches || kernels::packed_follows_llamacpp(w.ty);
        let fast = proposes || self.fast_kernels;
        if let Some(p) = pack
            .then(|| kernels::pack(&self.pool, &w.matrix(), fast))
            .flatten()
        {
            self.packed_bytes.fetch_add(p.bytes(), Ordering::Relaxed);
            return Some(Resident::Packed(p));
        }
        let mut copy = WeightBuffer::in_huge_pages(w.data.len())?;
        // By pieces, releasing each piece's mapped pages once copied, so
        // that a large head is never resident twice.
        const PIECE: usize = 8 << 20;
        for (i, piece) in copy.as_mut_slice().chunks_mut(PIECE).enumerate() {
            let at = i * PIECE;
            piece.copy_from_slice(&w.data[at..at + piece.len()]);
            w.data.release_pages_in(at..at + piece.len());
        }
        self.copied_bytes.fetch_add(copy.len(), Ordering::Relaxed);
        Some(Resident::Copied(copy))
    }

    /// `w` as a matmul of `n` activation rows reads it: packed, copied or
    /// in the mapped file, with the kernel this backend's options choose.
    fn operand<'w>(&self, w: &'w CpuWeight, n: usize) -> Operand<'w> {
        let mut matrix = w.matrix();
        if self.simd && self.packing {
            let resident = w.resident.get_or_init(|| {
                let r = self.make_resident(w);
                if r.is_some() {
                    w.data.release_pages();
                }
                r
            });
            // llama.cpp's batch order (its gemm, for whole groups of 4 rows)
            // for Q4_K exists in the ggml layout only.
            let gemm_rows = self.llamacpp_batches && n >= 4;
            match resident {
                Some(Resident::Packed(p)) if !gemm_rows || p.matches_llamacpp_batches() => {
                    return p.operand();
                }
                Some(Resident::Copied(copy)) => matrix.data = copy.as_slice(),
                _ => {}
            }
        }
        let kernel = if self.simd {
            kernels::best_kernel(w.ty)
        } else {
            kernels::scalar_kernel(w.ty)
        };
        Operand::ggml(matrix, kernel, self.llamacpp_batches)
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
}

impl Device for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;

    fn name(&self) -> String {
        let n = self.pool.n_threads();
        format!(
            "cpu ({n} thread{}, {}{})",
            if n == 1 { "" } else { "s" },
            if self.simd {
                kernels::simd_level()
            } else {
                "scalar"
            },
            if self.fast_kernels {
                ", fast kernels"
            } else {
                ""
            }
        )
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CpuWeight, BackendError> {
        let (rows, cols) = src.checked_shape()?;
        let dense = if src.dims.len() == 1 {
            let mut v = vec![0.0; cols];
            blockdraft_gguf::quants::dequantize(src.ty, &src.data, &mut v)
                .map_err(|e| src.error(e.to_string()))?;
            v
        } else {
            if !kernels::supports(src.ty) {
                return Err(BackendError::Unsupported {
                    what: format!("{} matrices (`{}`)", src.ty, src.name),
                });
            }
            Vec::new()
        };
        self.loaded_bytes
            .fetch_add(src.data.len() as u64, Ordering::Relaxed);
        Ok(CpuWeight {
            ty: src.ty,
            role: src.role,
            rows,
            cols,
            data: src.data,
            dense,
            resident: OnceLock::new(),
            values: OnceLock::new(),
        })
    }

    fn weight_bytes_loaded(&self) -> u64 {
        self.loaded_bytes.load(Ordering::Relaxed)
    }

    fn tensor(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            data: vec![0.0; rows * cols],
            half: Vec::new(),
            rows,
            cols,
        }
    }

    fn kv_tensor(&self, rows: usize, cols: usize, ty: KvType) -> CpuTensor {
        match ty {
            KvType::F32 => self.tensor(rows, cols),
            KvType::F16 => CpuTensor {
                data: Vec::new(),
                half: vec![f16::ZERO; rows * cols],
                rows,
                cols,
            },
        }
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: &mut CpuTensor, rows: usize, cols: usize) {
        assert!(
            rows * cols <= t.capacity(),
            "reshape to {rows}x{cols} exceeds capacity {}",
            t.capacity()
        );
        t.rows = rows;
        t.cols = cols;
    }

    fn write(&self, t: &mut CpuTensor, data: &[f32]) {
        if t.is_f16() {
            t.half[..t.rows * t.cols].convert_from_f32_slice(data);
        } else {
            t.as_mut_slice().copy_from_slice(data);
        }
    }

    async fn read(&self, t: &CpuTensor) -> Vec<f32> {
        self.before_readback().await;
        t.values()
    }

    fn read_blocking(&self, t: &CpuTensor) -> Result<Vec<f32>, BackendError> {
        Ok(t.values())
    }

    fn record_error(&self, e: BackendError) {
        let _ = self.error.set(e);
    }

    fn device_error(&self) -> Option<BackendError> {
        self.error.get().cloned()
    }

    fn host_memory(&self) -> bool {
        true
    }

    fn memory_limits(&self) -> MemoryLimits {
        let available = match (host_memory_available(), self.memory_budget) {
            (Some(host), Some(budget)) => Some(host.min(budget)),
            (host, budget) => host.or(budget),
        };
        MemoryLimits {
            available,
            max_tensor: Some(isize::MAX as u64),
        }
    }
}

impl ElementwiseOps for CpuBackend {
    fn rms_norm(
        &self,
        x: &CpuTensor,
        weight: &CpuWeight,
        group: usize,
        eps: f32,
        out: &mut CpuTensor,
    ) {
        ops::rms_norm(x.as_slice(), &weight.dense, group, eps, out.as_mut_slice());
    }

    fn rope(&self, x: &mut CpuTensor, pos0: usize, p: RopeParams) {
        let cols = x.cols;
        ops::rope(x.as_mut_slice(), cols, pos0, p);
    }

    fn gated(&self, act: GatedActivation, gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) {
        ops::gated(
            act,
            gate.cols,
            gate.as_slice(),
            up.as_slice(),
            out.as_mut_slice(),
        );
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) {
        kernels::axpy_f32(x.as_mut_slice(), 1.0, y.as_slice());
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) {
        x.as_mut_slice().iter_mut().for_each(|v| *v *= s);
    }

    fn clamp_finite(&self, x: &mut CpuTensor, limit: f32) {
        for v in x.as_mut_slice() {
            *v = if v.is_nan() {
                0.0
            } else {
                v.clamp(-limit, limit)
            };
        }
    }

    fn copy_rows(
        &self,
        src: &CpuTensor,
        src_row: usize,
        dst: &mut CpuTensor,
        dst_row: usize,
        dst_col: usize,
        n_rows: usize,
    ) {
        assert!(
            dst_col + src.cols <= dst.cols
                && dst_row + n_rows <= dst.rows
                && src_row + n_rows <= src.rows,
            "copy_rows out of bounds"
        );
        let (n, at_src, at_dst) = (
            src.cols,
            |r: usize| (src_row + r) * src.cols,
            |r: usize| (dst_row + r) * dst.cols + dst_col,
        );
        for r in 0..n_rows {
            let (s, d) = (at_src(r), at_dst(r));
            match (src.is_f16(), dst.is_f16()) {
                (false, false) => dst.data[d..][..n].copy_from_slice(&src.data[s..][..n]),
                (false, true) => dst.half[d..][..n].convert_from_f32_slice(&src.data[s..][..n]),
                (true, true) => dst.half[d..][..n].copy_from_slice(&src.half[s..][..n]),
                (true, false) => src.half[s..][..n].convert_to_f32_slice(&mut dst.data[d..][..n]),
            }
        }
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) {
        host_ops::softcap(x.as_mut_slice(), cap);
    }
}

impl LinearOps for CpuBackend {
    fn embed(&self, table: &CpuWeight, ids: &[u32], out: &mut CpuTensor) {
        let row_bytes = table
            .ty
            .bytes_for(table.cols as u64)
            .expect("checked at load") as usize;
        for (r, &id) in ids.iter().enumerate() {
            let start = id as usize * row_bytes;
            let dst = &mut out.data[r * table.cols..(r + 1) * table.cols];
            blockdraft_gguf::quants::dequantize(
                table.ty,
                &table.data[start..start + row_bytes],
                dst,
            )
            .expect("row size checked at load");
        }
    }

    fn matmul(&self, w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) {
        debug_assert_eq!(x.cols, w.cols);
        debug_assert_eq!((out.rows, out.cols), (x.rows, w.rows));
        let op = self.operand(w, x.rows);
        kernels::matmul_operand(&self.pool, op, x.as_slice(), out.as_mut_slice());
    }

    fn matmul_many(&self, x: &CpuTensor, projections: &mut [Projection<'_, Self>]) {
        let mut products: Vec<Product> = projections
            .iter_mut()
            .map(|p| Product {
                op: self.operand(p.weight, x.rows),
                bias: p.bias.map(|b| b.dense.as_slice()),
                out: p.out.as_mut_slice(),
            })
            .collect();
        kernels::matmul_many(&self.pool, x.as_slice(), &mut products);
    }

    fn gated_projection(
        &self,
        act: GatedActivation,
        x: &CpuTensor,
        w_gate: &CpuWeight,
        w_up: &CpuWeight,
        gate: &mut CpuTensor,
        up: &mut CpuTensor,
        out: &mut CpuTensor,
    ) {
        let cols = w_gate.rows;
        kernels::matmul_pair_combined(
            &self.pool,
            x.as_slice(),
            Product {
                op: self.operand(w_gate, x.rows),
                bias: None,
                out: gate.as_mut_slice(),
            },
            Product {
                op: self.operand(w_up, x.rows),
                bias: None,
                out: up.as_mut_slice(),
            },
            out.as_mut_slice(),
            &|c0, g, u, o| ops::gated_span(act, cols, c0, g, u, o),
        );
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuWeight) {
        let cols = x.cols;
        for row in x.as_mut_slice().chunks_exact_mut(cols) {
            kernels::axpy_f32(row, 1.0, &bias.dense);
        }
    }

    fn embed_from(&self, table: &CpuWeight, ids: &CpuTensor, row0: usize, out: &mut CpuTensor) {
        assert!(row0 + out.rows <= ids.rows, "embed_from shapes");
        let ids: Vec<u32> = (row0..row0 + out.rows)
            .map(|r| ids.data[r * ids.cols] as u32)
            .collect();
        self.embed(table, &ids, out);
    }
}

impl AttentionOps for CpuBackend {
    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut CpuTensor,
    ) {
        let out_cols = out.cols;
        let out = &mut out.data[..q.rows * out_cols];
        let (pool, q, batches) = (&self.pool, q.as_slice(), self.llamacpp_batches);
        match (k.is_f16(), v.is_f16()) {
            (false, false) => {
                attention::attention_f32(pool, q, &k.data, &v.data, mask, p, batches, out)
            }
            (true, true)
                // Compiled out on wasm32, which never runs it (80 KB of module).
                if cfg!(not(target_arch = "wasm32"))
                    && self.fast_kernels
                    && attention::tiled_supports_head_dim(p.head_dim) =>
            {
                attention::tiled_attention_f16(pool, q, &k.half, &v.half, mask, p, out)
            }
            (true, true) => attention::flash_attention_f16(pool, q, &k.half, &v.half, mask, p, out),
            _ => panic!("attention: keys and values of different types"),
        }
    }
}

impl SamplingOps for CpuBackend {
    async fn argmax(&self, x: &CpuTensor) -> Vec<u32> {
        self.before_readback().await;
        row_argmax(x)
    }

    fn argmax_to(&self, x: &CpuTensor, out: &mut CpuTensor, row: usize, col: usize) {
        assert!(
            row + x.rows <= out.rows && col < out.cols,
            "argmax_to out of bounds"
        );
        let cols = out.cols;
        for (r, id) in row_argmax(x).into_iter().enumerate() {
            out.data[(row + r) * cols + col] = id as f32;
        }
    }
}

impl DrafterOps for CpuBackend {
    fn grouped_conv(
        &self,
        x: &CpuTensor,
        base: &CpuTensor,
        dynamic: &CpuTensor,
        p: ConvParams,
        out: &mut CpuTensor,
    ) {
        assert!(
            base.rows == 2 * p.taps
                && base.cols == x.cols
                && x.cols.is_multiple_of(p.group)
                && dynamic.rows == x.rows
                && dynamic.cols == 2 * p.taps * (x.cols / p.group)
                && (out.rows, out.cols) == (x.rows, x.cols),
            "grouped_conv shapes"
        );
        ops::grouped_conv(
            x.as_slice(),
            x.cols,
            base.as_slice(),
            dynamic.as_slice(),
            p,
            out.as_mut_slice(),
        );
    }
}

impl HybridOps for CpuBackend {
    fn runs_hybrid_blocks(&self) -> bool {
        true
    }

    fn causal_conv_silu(
        &self,
        x: &CpuTensor,
        weight: &CpuWeight,
        state: &mut CpuTensor,
        out: &mut CpuTensor,
    ) {
        let taps = weight.cols;
        assert!(
            weight.rows == x.cols
                && (state.rows, state.cols) == (taps - 1, x.cols)
                && (out.rows, out.cols) == (x.rows, x.cols),
            "causal_conv_silu shapes"
        );
        delta_net::causal_conv_silu(
            &self.pool,
            x.as_slice(),
            x.cols,
            weight.values(),
            taps,
            state.as_mut_slice(),
            out.as_mut_slice(),
        );
    }

    fn gated_delta_rule(
        &self,
        x: &CpuTensor,
        alpha: &CpuTensor,
        beta: &CpuTensor,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
        from: Option<&CpuTensor>,
        state: &mut CpuTensor,
        out: &mut CpuTensor,
        p: DeltaNetParams,
    ) {
        assert!(
            x.cols == p.input_dim()
                && (state.rows, state.cols) == p.state_shape()
                && from.is_none_or(|f| (f.rows, f.cols) == p.state_shape())
                && (out.rows, out.cols) == (x.rows, p.n_v_heads * p.v_dim),
            "gated_delta_rule shapes"
        );
        delta_net::gated_delta_rule(
            &self.pool,
            x.as_slice(),
            alpha.as_slice(),
            beta.as_slice(),
            dt_bias.values(),
            a.values(),
            from.map(CpuTensor::as_slice),
            state.as_mut_slice(),
            out.as_mut_slice(),
            p,
        );
    }

    fn split_heads(&self, x: &CpuTensor, d: usize, first: &mut CpuTensor, second: &mut CpuTensor) {
        let half = (x.rows, x.cols / 2);
        assert!(
            x.cols.is_multiple_of(2 * d)
                && (first.rows, first.cols) == half
                && (second.rows, second.cols) == half,
            "split_heads shapes"
        );
        host_ops::split_heads(
            x.as_slice(),
            x.cols,
            d,
            first.as_mut_slice(),
            second.as_mut_slice(),
        );
    }

    fn sigmoid_mul(&self, x: &mut CpuTensor, gate: &CpuTensor) {
        assert!(
            (x.rows, x.cols) == (gate.rows, gate.cols),
            "sigmoid_mul shapes"
        );
        host_ops::sigmoid_mul(x.as_mut_slice(), gate.as_slice());
    }
}

fn row_argmax(x: &CpuTensor) -> Vec<u32> {
    x.as_slice()
        .chunks_exact(x.cols)
        .map(blockdraft_core::sampling::argmax)
        .collect()
}

/// Bytes of host memory that can still be had: Linux's estimate of what
/// is available without swapping, plus free swap. `None` elsewhere (and
/// in wasm, whose own allocator fails cleanly at its 4 GB).
fn host_memory_available() -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((kb("MemAvailable:")? + kb("SwapFree:").unwrap_or(0)) * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU runs the traits' host compositions of sampling and the
    /// selector walk: a shape mismatch there is an error the backend
    /// reports, not a panic, and the first one stays.
    #[test]
    fn host_compositions_record_shape_errors() {
        let be = CpuBackend::new(1);
        let x = be.tensor(2, 8);
        let (mut values, mut ids) = (be.tensor(2, 3), be.tensor(1, 3));
        be.top_k(&x, 3, &mut values, &mut ids);
        let e = be.device_error().expect("a recorded error").to_string();
        assert!(e.starts_with("top_k: tensor shapes do not agree"), "{e}");
        let mut out = be.tensor(1, 1);
        be.sample_to(
            &x,
            &blockdraft_core::sampling::SamplingParams::default(),
            0,
            &mut out,
            0,
            0,
        );
        let e = be.device_error().unwrap().to_string();
        assert!(e.starts_with("top_k"), "the first error stays: {e}");
    }

    #[test]
    fn host_compositions_match_their_references() {
        let be = CpuBackend::new(1);
        let data: Vec<f32> = (0..16).map(|i| ((i * 7) % 16) as f32).collect();
        let mut x = be.tensor(2, 8);
        be.write(&mut x, &data);
        let (mut values, mut ids) = (be.tensor(2, 3), be.tensor(2, 3));
        be.top_k(&x, 3, &mut values, &mut ids);
        let (want_v, want_i) = host_ops::top_k(&data, 8, 3);
        assert_eq!(be.read_blocking(&values).unwrap(), want_v);
        assert_eq!(be.read_blocking(&ids).unwrap(), want_i);
        let mut penalized = data.clone();
        host_ops::penalize_rows(&mut penalized[..8], 8, &[1, 2], &[], 1.5, 64);
        let mut row = be.tensor(1, 8);
        be.write(&mut row, &data[..8]);
        be.penalize(&mut row, &[1, 2], None, 1.5, 64);
        assert_eq!(be.read_blocking(&row).unwrap(), penalized[..8]);
        assert!(be.device_error().is_none());
    }

    #[test]
    fn the_name_counts_threads_and_memory_is_known_on_linux() {
        assert!(CpuBackend::new(1).name().starts_with("cpu (1 thread, "));
        assert!(CpuBackend::new(2).name().starts_with("cpu (2 threads, "));
        let fast = CpuBackend::new(2).with_fast_kernels().name();
        assert_eq!(
            fast.ends_with(", fast kernels)"),
            !cfg!(target_arch = "wasm32"),
            "{fast}"
        );
        let limits = CpuBackend::new(1).memory_limits();
        if cfg!(target_os = "linux") {
            assert!(limits.available.unwrap() > 1 << 20, "{limits:?}");
        }
    }

    #[test]
    fn clamp_finite_zeroes_nan_and_clamps_to_the_limit() {
        let be = CpuBackend::new(1);
        let mut t = be.tensor(1, 5);
        be.write(&mut t, &[f32::NAN, f32::INFINITY, -1e6, 3.5, -65504.0]);
        be.clamp_finite(&mut t, 65504.0);
        assert_eq!(t.as_slice(), [0.0, 65504.0, -65504.0, 3.5, -65504.0]);
    }

    /// Two taps, two groups of two channels, three rows, checked by hand.
    #[test]
    fn grouped_conv_mixes_the_previous_row_with_static_plus_dynamic_weights() {
        let be = CpuBackend::new(1);
        let tensor = |rows, cols, data: &[f32]| {
            let mut t = be.tensor(rows, cols);
            be.write(&mut t, data);
            t
        };
        let x = tensor(
            3,
            4,
            &[
                1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0,
            ],
        );
        // base rows: side 0 taps 0, 1; side 1 taps 0, 1.
        #[rustfmt::skip]
        let base = tensor(4, 4, &[
            1.0, 1.0, 2.0, 2.0,
            0.5, 0.5, 0.5, 0.5,
            9.0, 9.0, 9.0, 9.0,
            9.0, 9.0, 9.0, 9.0,
        ]);
        // dynamic per row: [s0 t0 g0, s0 t0 g1, s0 t1 g0, s0 t1 g1, side 1 ...].
        let mut dyn_data = Vec::new();
        for i in 0..3 {
            let d = i as f32;
            dyn_data.extend([d, -d, 0.1 * d, 0.0, 7.0, 7.0, 7.0, 7.0]);
        }
        let dynamic = tensor(3, 8, &dyn_data);
        let mut out = be.tensor(3, 4);
        let p = ConvParams {
            taps: 2,
            group: 2,
            side: 0,
        };
        be.grouped_conv(&x, &base, &dynamic, p, &mut out);
        let mut want = vec![0.0f32; 12];
        for i in 0..3 {
            let d = i as f32;
            let w0 = [1.0 + d, 1.0 + d, 2.0 - d, 2.0 - d];
            let w1 = [0.5 + 0.1 * d, 0.5 + 0.1 * d, 0.5, 0.5];
            for c in 0..4 {
                want[i * 4 + c] = w0[c] * (i * 4 + c + 1) as f32;
                if i > 0 {
                    want[i * 4 + c] += w1[c] * ((i - 1) * 4 + c + 1) as f32;
                }
            }
        }
        let got = out.as_slice();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }
}
