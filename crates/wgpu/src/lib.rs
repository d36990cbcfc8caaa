//! WebGPU backend: the backend traits ([`blockdraft_core::Backend`]) on
//! wgpu, with WGSL kernels from `shaders/` (one op family per file), one
//! impl block per op family. The same crate runs natively
//! (Vulkan, Metal, DX12, or a software Vulkan such as Mesa's lavapipe) and
//! in the browser.
//!
//! Ops record dispatches into one command encoder and one open compute
//! pass, on a GPU submitted every 64 dispatches (it starts on them while
//! the rest is recorded; [`Tuning::submit_every`]); a readback (`read`, `argmax`) submits everything
//! recorded since the last submit and awaits it. Plain decoding therefore
//! costs one small readback per token. [`WgpuBackend::counters`] exposes
//! what crossed the boundary.
//!
//! Weights stay in their GGUF type (the lattice types IQ1/IQ2/IQ3 with
//! their grid table appended to each buffer, so the kernels read it through
//! the weight's own binding). A quantized matmul first quantizes the
//! activations on the GPU exactly as the CPU backend does (`quantize.wgsl`,
//! into a scratch buffer the backend owns), then takes integer dots per
//! block (`matmul_quant.wgsl`): one dispatch plus one per weight part.
//! After a norm the quantization is the norm's own pass (`norm.wgsl`), and
//! the weights a layer multiplies one input by sit side by side
//! ([`Device::colocate`](blockdraft_core::backend::Device::colocate)) so
//! that q|k|v and gate|up are one pass each (`matmul_stacked*`).
//!
//! Portable by construction: no kernel needs `shader-f16` or subgroups,
//! workgroups have at most 256 invocations, and weights larger than the
//! adapter's largest storage binding are split into parts of whole rows.
//! Where the adapter has those features, the matmuls' `#if SUBGROUPS` /
//! `#if F16` variants are built instead ([`Tuning`]).

mod device;
mod params;
mod profile;
mod recorder;
pub mod shaders;
#[cfg(test)]
mod tests;
mod weights;

pub use device::{DeviceErrors, Gpu, Tuning};
pub use recorder::Counters;
use weights::IdsLayout;
pub use weights::WgpuWeight;

use blockdraft_core::backend::{
    self, AttentionMask, AttentionOps, AttentionParams, AttentionStep, BackendError, CommandCounts,
    ConvParams, DeltaNetParams, DrafterOps, ElementwiseOps, GatedActivation, HeadNorms, HybridOps,
    KernelTiming, KvType, LinearOps, Projection, RopeParams, RopeStyle, RowNorm, SamplingOps,
    WeightSource,
};
// The trait's methods, without its name (wgpu has a `Device` of its own).
use blockdraft_core::backend::Device as _;
use blockdraft_core::sampling::SamplingParams;
use half::f16;
use recorder::{Binding, Device, Retired};
use shaders::Kernel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;
use weights::{ActLayout, ActQuant, Epilogue, Segment, Stacked};

/// A row-major f32 matrix in a GPU buffer.
pub struct WgpuTensor {
    buffer: wgpu::Buffer,
    rows: usize,
    cols: usize,
    capacity: usize,
    /// f32, or f16 two to a u32 (a KV cache, [`blockdraft_core::backend::Device::kv_tensor`]).
    ty: KvType,
    retired: Retired,
}

impl Drop for WgpuTensor {
    fn drop(&mut self) {
        self.retired.retire(&self.buffer);
    }
}

impl WgpuTensor {
    fn len(&self) -> usize {
        self.rows * self.cols
    }

    fn is_f16(&self) -> bool {
        self.ty == KvType::F16
    }

    /// The rows in use, not the buffer's capacity.
    fn binding(&self) -> Binding<'_> {
        Binding::head(&self.buffer, self.len() as u64 * self.ty.element_bytes())
    }
}

pub struct WgpuBackend {
    dev: Device,
    gpu_info: String,
    tuning: Tuning,
    max_binding: u64,
    /// Alignment of a binding's offset into a buffer (stacked weights).
    offset_alignment: u64,
    /// Each recording thread's scratch buffers (see [`StreamScratch`]).
    scratch: Mutex<HashMap<ThreadId, StreamScratch>>,
    /// cos/sin tables by (base bits, n_rot), each for a window of
    /// positions: the rotations of a model read one until the positions
    /// leave it (the kernel is told where in it to start), so their bind
    /// groups do not change per token.
    rope_tables: Mutex<HashMap<(u32, usize), RopeTable>>,
    /// GGUF bytes of every weight uploaded ([`blockdraft_core::backend::Device::weight_bytes_loaded`]).
    loaded_bytes: AtomicU64,
}

/// Buffers one stream of ops writes and then reads in a later dispatch or
/// readback. WebGPU orders the dispatches of one recording thread, so that
/// thread may reuse them op after op; a second thread recording into the
/// same backend between a write and its read would overwrite them (its
/// argmax results, its quantized activations), so every thread has its
/// own. A thread's buffers live as long as the backend.
#[derive(Default)]
struct StreamScratch {
    /// Token ids of `embed` calls, penalized histories and argmax results.
    ids: Option<wgpu::Buffer>,
    /// Quantized activations of the current matmul (quantize.wgsl), grown
    /// to the largest call so far.
    act: Option<wgpu::Buffer>,
}

struct RopeTable {
    buffer: wgpu::Buffer,
    /// Positions `start .. end`.
    start: usize,
    end: usize,
}

/// Positions a rope table is made for at least (about 1 MB at the widest
/// rotation, 256), so decoding replaces it once per that many tokens.
const ROPE_TABLE_POSITIONS: usize = 1024;
/// Where a rope table's window starts: a multiple of this at or below the
/// first position asked for.
const ROPE_TABLE_ALIGN: usize = 256;

/// Rows from which `gated_delta_rule` takes the chunked form (two chunks:
/// decode and verify passes stay on the recurrent kernel).
const CHUNKED_ROWS: usize = 64;

/// Workgroups for `n` items of `per_group` each, as a 2-D grid when one
/// dimension is not enough (the kernels use `group_index`).
/// The `rope.wgsl` uniform for rotating the rows of `x` with `p`, from
/// table row `table_row0`; `n_head_k` heads of a second tensor (`rope_qk`)
/// or 0.
fn rope_uniform(
    x: &WgpuTensor,
    p: &RopeParams,
    table_row0: usize,
    n_head_k: usize,
) -> params::Rope {
    params::Rope {
        n_rows: u(x.rows),
        cols: u(x.cols),
        n_head: u(p.n_head),
        head_dim: u(p.head_dim),
        half_rot: u(p.n_rot / 2),
        neox: u32::from(p.style == RopeStyle::Neox),
        table_row0: u(table_row0),
        n_head_k: u(n_head_k),
    }
}

/// The uniform of a norm over `n_slices` slices of `group` values that
/// quantizes nothing.
fn norm_uniform(group: usize, n_slices: usize, eps: f32) -> params::Norm {
    params::Norm {
        group: u(group),
        n_slices: u(n_slices),
        eps,
        q8_1_sums: 0,
        d_off: 0,
        s_off: 0,
        post_eps: 0.0,
        _pad0: 0,
    }
}

fn grid(n: usize, per_group: usize) -> [u32; 3] {
    const MAX: usize = 65535;
    let groups = n.div_ceil(per_group).max(1);
    let x = groups.min(MAX);
    [x as u32, groups.div_ceil(x) as u32, 1]
}

fn kernel(file: &'static str, entry: &'static str) -> Kernel {
    Kernel::new(file, entry)
}

fn u(x: usize) -> u32 {
    u32::try_from(x).expect("tensor dimension exceeds u32")
}

impl WgpuBackend {
    /// A zeroed `rows x cols` tensor of f32, or of f16 two to a u32.
    fn zeroed(&self, rows: usize, cols: usize, ty: KvType) -> WgpuTensor {
        let capacity = rows * cols;
        let label = if ty == KvType::F16 {
            "kv f16"
        } else {
            "tensor"
        };
        WgpuTensor {
            buffer: self
                .dev
                .storage(label, capacity as u64 * ty.element_bytes()),
            rows,
            cols,
            capacity,
            ty,
            retired: self.dev.retired.clone(),
        }
    }

    /// The platform's default adapter (blocking, so native only; the
    /// browser awaits [`Gpu::request`] and calls [`Self::with_gpu`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self, BackendError> {
        Ok(Self::with_gpu(pollster::block_on(Gpu::request())?))
    }

    /// A backend with the kernel shapes and fast paths suited to `gpu`.
    pub fn with_gpu(gpu: Gpu) -> Self {
        let tuning = Tuning::for_gpu(&gpu);
        Self::with_tuning(gpu, tuning)
    }

    /// A backend with the kernel shapes of `tuning` whatever the adapter
    /// (tests run each on one adapter), less the fast paths it lacks.
    pub fn with_tuning(gpu: Gpu, tuning: Tuning) -> Self {
        let tuning = tuning.supported_by(&gpu);
        let gpu_info = format!("{}; kernels {tuning:?}", gpu.describe());
        let max_binding = gpu
            .limits
            .max_storage_buffer_binding_size
            .min(gpu.limits.max_buffer_size);
        WgpuBackend {
            dev: Device::new(gpu.device, gpu.queue, gpu.errors, tuning, gpu.features),
            gpu_info,
            tuning,
            max_binding,
            offset_alignment: gpu.limits.min_storage_buffer_offset_alignment.into(),
            scratch: Mutex::new(HashMap::new()),
            rope_tables: Mutex::new(HashMap::new()),
            loaded_bytes: AtomicU64::new(0),
        }
    }

    /// The kernel shapes and fast paths in use.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// Adapter, driver and limits, for logs and `bench`.
    pub fn adapter_info(&self) -> &str {
        &self.gpu_info
    }

    /// The first device error since the last call (validation,
    /// out-of-memory, a lost device).
    pub fn take_device_error(&self) -> Option<String> {
        self.dev.errors.take()
    }

    /// Whether a device error is waiting for [`Self::take_device_error`]
    /// (a generation stops at its next token when one is).
    pub fn has_device_error(&self) -> bool {
        self.dev.errors.pending()
    }

    /// Destroys the device, as a lost GPU would be (tests of the
    /// browser's recovery).
    pub fn destroy_device(&self) {
        self.dev.device.destroy();
    }

    /// Dispatches, submits and readbacks so far.
    pub fn counters(&self) -> Counters {
        self.dev.counters.snapshot()
    }

    /// Submits everything recorded so far without waiting.
    pub fn flush(&self) {
        self.dev.flush();
    }

    /// This thread's ids buffer, grown to hold `n` u32.
    fn ids_buffer(&self, n: usize) -> wgpu::Buffer {
        self.stream_buffer(|s| &mut s.ids, "ids", (n.max(256) * 4) as u64)
    }

    /// This thread's activation scratch, grown to hold `words` u32. Reusing
    /// it across matmuls is safe: WebGPU orders the dispatches that write
    /// and read it.
    fn act_buffer(&self, words: usize) -> wgpu::Buffer {
        self.stream_buffer(|s| &mut s.act, "activations", (words * 4) as u64)
    }

    /// The calling thread's buffer in `slot`, replaced by one of `bytes`
    /// where it is smaller (the old one retires once submitted work no
    /// longer reads it).
    fn stream_buffer(
        &self,
        slot: impl FnOnce(&mut StreamScratch) -> &mut Option<wgpu::Buffer>,
        label: &'static str,
        bytes: u64,
    ) -> wgpu::Buffer {
        let mut scratch = self.scratch.lock().unwrap();
        let buffer = slot(scratch.entry(std::thread::current().id()).or_default());
        match &*buffer {
            Some(b) if b.size() >= bytes => b.clone(),
            _ => {
                let b = self.dev.storage(label, bytes);
                if let Some(old) = buffer.replace(b.clone()) {
                    self.dev.retired.retire(&old);
                }
                b
            }
        }
    }

    /// The cos/sin table of `p`'s base and rotation holding positions
    /// `pos0 .. pos0 + rows`, and the position its first row is for.
    fn rope_table(&self, pos0: usize, rows: usize, p: &RopeParams) -> (wgpu::Buffer, usize) {
        let key = (p.base.to_bits(), p.n_rot);
        let mut tables = self.rope_tables.lock().unwrap();
        let end = pos0 + rows;
        if let Some(t) = tables.get(&key).filter(|t| t.start <= pos0 && end <= t.end) {
            return (t.buffer.clone(), t.start);
        }
        let start = pos0 / ROPE_TABLE_ALIGN * ROPE_TABLE_ALIGN;
        let end = start
            + (end - start)
                .max(ROPE_TABLE_POSITIONS)
                .next_multiple_of(ROPE_TABLE_ALIGN);
        // ggml's sequence: theta_i = pos · scale^i by repeated f32 products.
        let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
        let half = p.n_rot / 2;
        let mut cs = Vec::with_capacity((end - start) * half * 2);
        for pos in start..end {
            let mut theta = pos as f32;
            for _ in 0..half {
                cs.push(theta.cos());
                cs.push(theta.sin());
                theta *= theta_scale;
            }
        }
        let buffer = self.dev.storage_init("rope", bytemuck::cast_slice(&cs));
        let table = RopeTable {
            buffer: buffer.clone(),
            start,
            end,
        };
        if let Some(old) = tables.insert(key, table) {
            self.dev.retired.retire(&old.buffer);
        }
        (buffer, start)
    }

    /// `out = x · wᵀ` then `epilogue`. `quantized` is the kind of `x`'s
    /// quantization already in the activation scratch, if any: reused when
    /// `w` reads the same kind, replaced otherwise.
    fn project(
        &self,
        w: &WgpuWeight,
        x: &WgpuTensor,
        out: &mut WgpuTensor,
        epilogue: Epilogue,
        quantized: &mut Option<(ActQuant, ActLayout)>,
    ) {
        assert_eq!(x.cols, w.cols(), "matmul: x columns");
        assert_eq!(
            (out.rows, out.cols),
            (x.rows, w.rows()),
            "matmul: output shape"
        );
        if x.rows == 0 || w.rows() == 0 {
            return;
        }
        let Some(kind) = w.act_quant() else {
            w.matmul(
                &self.dev,
                x.binding(),
                x.rows,
                out.binding(),
                None,
                epilogue,
            );
            return;
        };
        let (act, layout) = self.quantized_input(x, kind, quantized);
        w.matmul(
            &self.dev,
            x.binding(),
            x.rows,
            out.binding(),
            Some((Binding::head(&act, layout.words as u64 * 4), layout)),
            epilogue,
        );
    }

    /// The scratch holding `x` quantized for `kind`: as it is where
    /// `quantized` says so, else quantized now (and `quantized` updated).
    fn quantized_input(
        &self,
        x: &WgpuTensor,
        kind: ActQuant,
        quantized: &mut Option<(ActQuant, ActLayout)>,
    ) -> (wgpu::Buffer, ActLayout) {
        let words = ActLayout::new(x.rows, x.cols).words;
        let act = self.act_buffer(words);
        let layout = match *quantized {
            Some((k, layout)) if k == kind => layout,
            _ => {
                let layout = weights::quantize_activations(
                    &self.dev,
                    kind,
                    x.binding(),
                    x.rows,
                    x.cols,
                    Binding::head(&act, words as u64 * 4),
                );
                *quantized = Some((kind, layout));
                layout
            }
        };
        (act, layout)
    }

    /// `what` of `x` with `segments`' weights in one dispatch, where
    /// [`Device::colocate`] stacked them together; `false` (nothing
    /// recorded but perhaps `x`'s quantization) otherwise.
    fn project_stacked(
        &self,
        what: Stacked,
        x: &WgpuTensor,
        segments: &[Segment],
        quantized: &mut Option<(ActQuant, ActLayout)>,
    ) -> bool {
        let Some(kind) = segments.first().and_then(|s| s.weight.act_quant()) else {
            return false;
        };
        if x.rows == 0 || segments.iter().any(|s| s.weight.act_quant() != Some(kind)) {
            return false;
        }
        let (act, layout) = self.quantized_input(x, kind, quantized);
        let act = Binding::head(&act, layout.words as u64 * 4);
        weights::stacked_matmul(&self.dev, what, segments, x.rows, (act, layout))
    }

    /// `norm.out = rms_norm(x) · norm.weight` (whole rows), also quantized
    /// in the same pass for `first`, the weight the products start with,
    /// where it reads quantized activations: what [`Self::project`] then
    /// finds in the scratch (`None` when nothing is there).
    fn norm_for<'a>(
        &self,
        x: &mut WgpuTensor,
        norm: RowNorm<'a, Self>,
        first: Option<&WgpuWeight>,
    ) -> (&'a mut WgpuTensor, Option<(ActQuant, ActLayout)>) {
        let kind = first.and_then(WgpuWeight::act_quant);
        let (Some(kind), true) = (kind, x.rows > 0) else {
            return (backend::norm_rows(self, x, norm), None);
        };
        assert!(
            norm.out.rows == x.rows && norm.out.cols == x.cols,
            "normed projections: norm output shape"
        );
        let layout = ActLayout::new(x.rows, x.cols);
        let act = self.act_buffer(layout.words);
        let (mut entry, q8_1_sums) = match kind {
            ActQuant::Q8_0 { q8_1_sums } => ("rms_norm_quantize_q8_0", q8_1_sums),
            ActQuant::Q8K => ("rms_norm_quantize_q8_k", false),
        };
        let mut params = params::Norm {
            q8_1_sums: u32::from(q8_1_sums),
            d_off: u(layout.d_off),
            s_off: u(layout.s_off),
            ..norm_uniform(x.cols, x.rows, norm.eps)
        };
        let mut bindings = vec![
            x.binding(),
            norm.weight.dense_binding(),
            norm.out.binding(),
            Binding::head(&act, layout.words as u64 * 4),
        ];
        if let Some(b) = &norm.pending {
            assert!(
                (b.output.rows, b.output.cols) == (x.rows, x.cols) && b.post_norm.cols() == x.cols,
                "normed projections: pending branch shapes"
            );
            entry = match kind {
                ActQuant::Q8_0 { .. } => "add_rms_norm_quantize_q8_0",
                ActQuant::Q8K => "add_rms_norm_quantize_q8_k",
            };
            params.post_eps = b.eps;
            bindings.extend([b.output.binding(), b.post_norm.dense_binding()]);
        }
        self.dev.dispatch(
            kernel("norm.wgsl", entry),
            &params,
            &bindings,
            grid(x.rows, 1),
        );
        (norm.out, Some((kind, layout)))
    }

    /// [`LinearOps::matmul_many`] of `x`, whose quantization for some kind
    /// may already be in the scratch (`quantized`): one quantization of `x`
    /// serves every weight type that reads the same kind (Q4_K and Q6_K
    /// both read Q8_K blocks).
    fn project_all(
        &self,
        x: &WgpuTensor,
        projections: &mut [Projection<'_, Self>],
        mut quantized: Option<(ActQuant, ActLayout)>,
    ) {
        for p in projections.iter() {
            assert!(
                p.weight.cols() == x.cols && self.shape(p.out) == (x.rows, p.weight.rows()),
                "matmul_many: shapes"
            );
        }
        let segments: Vec<_> = projections
            .iter()
            .map(|p| Segment {
                weight: p.weight,
                bias: p.bias,
                out: p.out.binding(),
            })
            .collect();
        if self.project_stacked(Stacked::Projections, x, &segments, &mut quantized) {
            return;
        }
        drop(segments);
        for p in projections {
            let epilogue = p.bias.map_or(Epilogue::Store, Epilogue::Bias);
            self.project(p.weight, x, p.out, epilogue, &mut quantized);
        }
    }

    /// [`LinearOps::gated_projection`] of `x`, with `quantized` as in
    /// [`Self::project_all`]: the gate projection into `gate`, then the up
    /// projection with the activated gate applied as it is stored.
    fn gated_from(
        &self,
        act: GatedActivation,
        x: &WgpuTensor,
        [w_gate, w_up]: [&WgpuWeight; 2],
        gate: &mut WgpuTensor,
        out: &mut WgpuTensor,
        mut quantized: Option<(ActQuant, ActLayout)>,
    ) {
        assert!(
            w_gate.cols() == x.cols
                && w_up.cols() == x.cols
                && w_gate.rows() == w_up.rows()
                && self.shape(out) == (x.rows, w_up.rows()),
            "gated_projection: shapes"
        );
        let segments = [w_gate, w_up].map(|weight| Segment {
            weight,
            bias: None,
            out: out.binding(),
        });
        if self.project_stacked(Stacked::Gated(act), x, &segments, &mut quantized) {
            return;
        }
        self.project(w_gate, x, gate, Epilogue::Store, &mut quantized);
        let epilogue = Epilogue::Gated(act, gate.binding());
        self.project(w_up, x, out, epilogue, &mut quantized);
    }

    fn elementwise(
        &self,
        entry: &'static str,
        x: &WgpuTensor,
        y: Option<&WgpuTensor>,
        n: usize,
        cols: usize,
        s: f32,
    ) {
        let params = params::Elementwise {
            n: u(n),
            cols: u(cols),
            s,
            _pad: 0,
        };
        let mut bindings = vec![x.binding()];
        if let Some(y) = y {
            bindings.push(y.binding());
        }
        self.dev.dispatch(
            kernel("elementwise.wgsl", entry),
            &params,
            &bindings,
            grid(n, 256),
        );
    }
}

impl backend::Device for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    fn name(&self) -> String {
        format!("wgpu ({})", self.gpu_info)
    }

    fn command_counts(&self) -> Option<CommandCounts> {
        let c = self.counters();
        Some(CommandCounts {
            dispatches: c.dispatches,
            passes: c.passes,
            submits: c.submits,
            bind_groups: c.bind_groups,
            readbacks: c.readbacks,
        })
    }

    fn take_kernel_timings(&self) -> Option<Vec<KernelTiming>> {
        let profiler = self.dev.profiler.as_ref()?;
        Some(profiler.lock().unwrap().take())
    }

    fn record_error(&self, e: BackendError) {
        self.dev.errors.record(e.to_string());
    }

    fn device_error(&self) -> Option<BackendError> {
        self.dev.errors.peek().map(BackendError::Device)
    }

    fn memory_limits(&self) -> blockdraft_core::backend::MemoryLimits {
        // A tensor is one storage buffer, bound as far as its rows in use
        // reach: at most one binding. (Adapters do not tell how much
        // memory they have left.)
        blockdraft_core::backend::MemoryLimits {
            available: None,
            max_tensor: Some(self.max_binding),
        }
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<WgpuWeight, BackendError> {
        let bytes = src.data.len() as u64;
        let weight = WgpuWeight::load(&self.dev, src, self.max_binding)?;
        self.loaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(weight)
    }

    fn colocate(&self, weights: &mut [&mut WgpuWeight]) {
        weights::colocate(&self.dev, weights, self.offset_alignment, self.max_binding);
    }

    fn weight_bytes_loaded(&self) -> u64 {
        self.loaded_bytes.load(Ordering::Relaxed)
    }

    fn tensor(&self, rows: usize, cols: usize) -> WgpuTensor {
        self.zeroed(rows, cols, KvType::F32)
    }

    fn kv_tensor(&self, rows: usize, cols: usize, ty: KvType) -> WgpuTensor {
        // Kernels own whole u32s of an f16 tensor: two values of one row.
        assert!(
            ty == KvType::F32 || cols % 2 == 0,
            "f16 KV rows must have an even width"
        );
        self.zeroed(rows, cols, ty)
    }

    fn shape(&self, t: &WgpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: &mut WgpuTensor, rows: usize, cols: usize) {
        assert!(
            rows * cols <= t.capacity,
            "reshape to {rows}x{cols} exceeds capacity {}",
            t.capacity
        );
        t.rows = rows;
        t.cols = cols;
    }

    fn write(&self, t: &mut WgpuTensor, data: &[f32]) {
        assert_eq!(
            data.len(),
            t.len(),
            "write: data length is not the tensor's"
        );
        if t.is_f16() {
            // Whole u32s: an odd length gets a zero pad (within the buffer).
            let mut half: Vec<u16> = data.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
            half.resize(data.len().next_multiple_of(2), 0);
            self.dev.upload(&t.buffer, 0, bytemuck::cast_slice(&half));
        } else {
            self.dev.upload(&t.buffer, 0, bytemuck::cast_slice(data));
        }
    }

    async fn read(&self, t: &WgpuTensor) -> Vec<f32> {
        let bytes = t.len() as u64 * t.ty.element_bytes();
        let bytes = self
            .dev
            .read_bytes(&t.buffer, 0, bytes.next_multiple_of(4))
            .await;
        if t.is_f16() {
            let half: Vec<u16> = bytemuck::pod_collect_to_vec(&bytes);
            half[..t.len()]
                .iter()
                .map(|&h| f16::from_bits(h).to_f32())
                .collect()
        } else {
            bytemuck::pod_collect_to_vec(&bytes)
        }
    }
}

impl ElementwiseOps for WgpuBackend {
    fn rms_norm(
        &self,
        x: &WgpuTensor,
        weight: &WgpuWeight,
        group: usize,
        eps: f32,
        out: &mut WgpuTensor,
    ) {
        assert!(
            out.len() >= x.len() && x.cols % group == 0,
            "rms_norm shapes"
        );
        let slices = x.len() / group;
        self.dev.dispatch(
            kernel("norm.wgsl", "rms_norm"),
            &norm_uniform(group, slices, eps),
            &[x.binding(), weight.dense_binding(), out.binding()],
            grid(slices, 1),
        );
    }

    fn add_normed(
        &self,
        x: &mut WgpuTensor,
        y: &WgpuTensor,
        weight: &WgpuWeight,
        eps: f32,
        _scratch: &mut WgpuTensor,
    ) {
        assert!(
            (x.rows, x.cols) == (y.rows, y.cols) && weight.cols() == y.cols,
            "add_normed shapes"
        );
        if y.rows == 0 {
            return;
        }
        self.dev.dispatch(
            kernel("norm.wgsl", "add_rms_norm"),
            &norm_uniform(y.cols, y.rows, eps),
            &[y.binding(), weight.dense_binding(), x.binding()],
            grid(y.rows, 1),
        );
    }

    fn rope(&self, x: &mut WgpuTensor, pos0: usize, p: RopeParams) {
        let half = p.n_rot / 2;
        if half == 0 || x.rows == 0 {
            return;
        }
        let (table, table_pos0) = self.rope_table(pos0, x.rows, &p);
        let params = rope_uniform(x, &p, pos0 - table_pos0, 0);
        self.dev.dispatch(
            kernel("rope.wgsl", "rope"),
            &params,
            &[x.binding(), Binding::whole(&table)],
            grid(x.rows * p.n_head * half, 256),
        );
    }

    fn rope_qk(
        &self,
        q: &mut WgpuTensor,
        k: &mut WgpuTensor,
        pos0: usize,
        q_p: RopeParams,
        k_p: RopeParams,
    ) {
        let half = q_p.n_rot / 2;
        let same = RopeParams {
            n_head: q_p.n_head,
            ..k_p
        } == q_p;
        // One pass needs rows of exactly the heads and one rotation.
        if !same
            || q.rows != k.rows
            || q.cols != q_p.n_head * q_p.head_dim
            || k.cols != k_p.n_head * k_p.head_dim
            || half == 0
            || q.rows == 0
        {
            self.rope(q, pos0, q_p);
            self.rope(k, pos0, k_p);
            return;
        }
        let (table, table_pos0) = self.rope_table(pos0, q.rows, &q_p);
        let params = rope_uniform(q, &q_p, pos0 - table_pos0, k_p.n_head);
        self.dev.dispatch(
            kernel("rope.wgsl", "rope_qk"),
            &params,
            &[q.binding(), Binding::whole(&table), k.binding()],
            grid(q.rows * (q_p.n_head + k_p.n_head) * half, 256),
        );
    }

    fn gated(
        &self,
        act: GatedActivation,
        gate: &WgpuTensor,
        up: &WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n, "gated shapes");
        let entry = match act {
            GatedActivation::SwiGlu => "swiglu",
            GatedActivation::GeGlu => "geglu",
        };
        self.dev.dispatch(
            kernel("activation.wgsl", entry),
            &params::Activation {
                n: u(n),
                _pad0: 0,
                _pad1: 0,
                _pad2: 0,
            },
            &[gate.binding(), up.binding(), out.binding()],
            grid(n, 256),
        );
    }

    fn add(&self, x: &mut WgpuTensor, y: &WgpuTensor) {
        assert_eq!(x.len(), y.len(), "add shapes");
        self.elementwise("add", x, Some(y), x.len(), x.cols, 0.0);
    }

    fn scale(&self, x: &mut WgpuTensor, s: f32) {
        self.elementwise("scale", x, None, x.len(), x.cols, s);
    }

    fn clamp_finite(&self, x: &mut WgpuTensor, limit: f32) {
        self.elementwise("clamp_finite", x, None, x.len(), x.cols, limit);
    }

    fn copy_rows(
        &self,
        src: &WgpuTensor,
        src_row: usize,
        dst: &mut WgpuTensor,
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
        if n_rows == 0 {
            return;
        }
        let params = params::CopyRows {
            n_rows: u(n_rows),
            src_cols: u(src.cols),
            src_row: u(src_row),
            dst_cols: u(dst.cols),
            dst_row: u(dst_row),
            dst_col: u(dst_col),
            _pad0: 0,
            _pad1: 0,
        };
        let copy = match (src.is_f16(), dst.is_f16()) {
            (false, false) => kernel("copy.wgsl", "copy_rows"),
            (false, true) => {
                assert!(
                    src.cols % 2 == 0 && dst_col % 2 == 0,
                    "copy_rows into f16: odd width or column"
                );
                kernel("copy_f16.wgsl", "copy_rows_to_f16")
            }
            _ => panic!("copy_rows: reading an f16 KV tensor is not supported on this backend"),
        };
        let per_invocation = if dst.is_f16() { 2 } else { 1 };
        self.dev.dispatch(
            copy,
            &params,
            &[src.binding(), dst.binding()],
            grid(n_rows * src.cols / per_invocation, 256),
        );
    }

    fn softcap(&self, x: &mut WgpuTensor, cap: f32) {
        self.elementwise("softcap", x, None, x.len(), x.cols, cap);
    }
}

impl LinearOps for WgpuBackend {
    fn embed(&self, table: &WgpuWeight, ids: &[u32], out: &mut WgpuTensor) {
        assert_eq!(out.len(), ids.len() * table.cols(), "embed: output shape");
        let ids_buf = self.ids_buffer(ids.len());
        self.dev.upload(&ids_buf, 0, bytemuck::cast_slice(ids));
        let layout = IdsLayout {
            f32_values: false,
            stride: 1,
            row0: 0,
        };
        let ids_binding = Binding::head(&ids_buf, ids.len() as u64 * 4);
        table.embed(&self.dev, ids_binding, layout, ids.len(), out.binding());
    }

    fn embed_from(&self, table: &WgpuWeight, ids: &WgpuTensor, row0: usize, out: &mut WgpuTensor) {
        assert!(
            row0 + out.rows <= ids.rows && out.cols == table.cols(),
            "embed_from shapes"
        );
        let layout = IdsLayout {
            f32_values: true,
            stride: ids.cols,
            row0,
        };
        table.embed(&self.dev, ids.binding(), layout, out.rows, out.binding());
    }

    fn matmul(&self, w: &WgpuWeight, x: &WgpuTensor, out: &mut WgpuTensor) {
        self.project(w, x, out, Epilogue::Store, &mut None);
    }

    fn matmul_many(&self, x: &WgpuTensor, projections: &mut [Projection<'_, Self>]) {
        self.project_all(x, projections, None);
    }

    fn normed_matmul_many(
        &self,
        x: &mut WgpuTensor,
        norm: RowNorm<'_, Self>,
        projections: &mut [Projection<'_, Self>],
    ) {
        let (normed, quantized) = self.norm_for(x, norm, projections.first().map(|p| p.weight));
        self.project_all(normed, projections, quantized);
    }

    fn gated_projection(
        &self,
        act: GatedActivation,
        x: &WgpuTensor,
        w_gate: &WgpuWeight,
        w_up: &WgpuWeight,
        gate: &mut WgpuTensor,
        _up: &mut WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        self.gated_from(act, x, [w_gate, w_up], gate, out, None);
    }

    fn normed_gated_projection(
        &self,
        act: GatedActivation,
        x: &mut WgpuTensor,
        norm: RowNorm<'_, Self>,
        w_gate: &WgpuWeight,
        w_up: &WgpuWeight,
        gate: &mut WgpuTensor,
        _up: &mut WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        let (normed, quantized) = self.norm_for(x, norm, Some(w_gate));
        self.gated_from(act, normed, [w_gate, w_up], gate, out, quantized);
    }

    fn matmul_accumulate(
        &self,
        w: &WgpuWeight,
        x: &WgpuTensor,
        acc: &mut WgpuTensor,
        _scratch: &mut WgpuTensor,
    ) {
        self.project(w, x, acc, Epilogue::Accumulate, &mut None);
    }

    fn add_bias(&self, x: &mut WgpuTensor, bias: &WgpuWeight) {
        let params = params::Elementwise {
            n: u(x.len()),
            cols: u(x.cols),
            s: 0.0,
            _pad: 0,
        };
        self.dev.dispatch(
            kernel("elementwise.wgsl", "add_bias"),
            &params,
            &[x.binding(), bias.dense_binding()],
            grid(x.len(), 256),
        );
    }
}

impl AttentionOps for WgpuBackend {
    fn append_kv(
        &self,
        k: &WgpuTensor,
        v: &WgpuTensor,
        k_cache: &mut WgpuTensor,
        v_cache: &mut WgpuTensor,
        row: usize,
        n: usize,
    ) {
        let alike = k.cols == v.cols
            && k_cache.cols == v_cache.cols
            && k_cache.ty == v_cache.ty
            && k_cache.rows == v_cache.rows
            && !k.is_f16()
            && !v.is_f16();
        if !alike || n == 0 {
            self.copy_rows(k, 0, k_cache, row, 0, n);
            self.copy_rows(v, 0, v_cache, row, 0, n);
            return;
        }
        assert!(
            k.cols <= k_cache.cols && row + n <= k_cache.rows && n <= k.rows && n <= v.rows,
            "append_kv out of bounds"
        );
        let params = params::CopyRows {
            n_rows: u(n),
            src_cols: u(k.cols),
            src_row: 0,
            dst_cols: u(k_cache.cols),
            dst_row: u(row),
            dst_col: 0,
            _pad0: 0,
            _pad1: 0,
        };
        let (append, per_invocation) = if k_cache.is_f16() {
            assert!(k.cols % 2 == 0, "append_kv into f16: odd width");
            (kernel("copy_f16.wgsl", "append_kv_to_f16"), 2)
        } else {
            (kernel("copy.wgsl", "append_kv"), 1)
        };
        self.dev.dispatch(
            append,
            &params,
            &[
                k.binding(),
                k_cache.binding(),
                v.binding(),
                v_cache.binding(),
            ],
            grid(n * k.cols / per_invocation, 256),
        );
    }

    fn attention(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut WgpuTensor,
    ) {
        assert!(
            p.head_dim <= 256
                && p.head_dim % 2 == 0
                && p.n_head_kv > 0
                && p.n_head % p.n_head_kv == 0
                && k.ty == v.ty,
            "attention: head_dim {} (> 256 or odd), heads {} / {}, or keys and values of different types",
            p.head_dim,
            p.n_head,
            p.n_head_kv
        );
        // The fused pass's inputs go unread: any small read-only range.
        let unused = Binding::head(q.binding().buffer, 4);
        self.dispatch_attention(
            q,
            (k, v),
            attention_uniform(q, mask, p),
            [unused, unused, unused, unused],
            out,
        );
    }

    fn attention_step(
        &self,
        (q, k, v): (&mut WgpuTensor, &mut WgpuTensor, &WgpuTensor),
        (k_cache, v_cache): (&mut WgpuTensor, &mut WgpuTensor),
        step: AttentionStep,
        head_norms: Option<HeadNorms<'_, Self>>,
        out: &mut WgpuTensor,
    ) {
        let (qp, kp, p) = (step.q_rope, step.k_rope, step.params);
        let pos0 = step.mask.q_pos0;
        // One pass needs rows of exactly the heads, one rotation, a cache
        // of the new rows' type, and the new keys within the workgroup's
        // room (MAX_NEW_KEYS in attention_core.wgsl).
        let fits = RopeParams {
            n_head: qp.n_head,
            ..kp
        } == qp
            && (qp.n_head, kp.n_head, qp.head_dim) == (p.n_head, p.n_head_kv, p.head_dim)
            && q.rows == k.rows
            && k.rows == v.rows
            && q.cols == p.n_head * p.head_dim
            && k.cols == p.n_head_kv * p.head_dim
            && v.cols == k.cols
            && k_cache.cols == k.cols
            && v_cache.cols == k.cols
            && k_cache.ty == v_cache.ty
            && !k.is_f16()
            && !v.is_f16()
            && qp.n_rot % 2 == 0
            && q.rows * p.head_dim <= 3072
            && pos0 + q.rows <= k_cache.rows.min(v_cache.rows)
            && step.mask.kv_len == pos0 + q.rows
            && q.rows > 0;
        // Head norms in the same pass need both weights in one binding
        // (the pass has no room for a ninth storage buffer on adapters
        // with WebGPU's default limit of eight).
        let norms = match &head_norms {
            None => Some(None),
            Some(h) => head_norm_binding(h, p.head_dim)
                .filter(|_| q.rows <= MAX_NORMED_ROWS)
                .map(|b| Some((b, h.eps))),
        };
        let Some(norms) = norms.filter(|_| fits) else {
            let parts = ((q, k, v), (k_cache, v_cache));
            backend::attention_step_by_parts(self, parts.0, parts.1, step, head_norms, out);
            return;
        };
        let (table, table_pos0) = self.rope_table(pos0, q.rows, &qp);
        let mut params = attention_uniform(q, step.mask, p);
        params.fused = 1;
        params.half_rot = u(qp.n_rot / 2);
        params.neox = u32::from(qp.style == RopeStyle::Neox);
        params.table_row0 = u(pos0 - table_pos0);
        params.q_scale = step.q_scale.unwrap_or(1.0);
        let norm_weights = match norms {
            Some(((binding, k_off), eps)) => {
                params.head_norm = 1;
                params.norm_eps = eps;
                params.k_norm_off = u(k_off);
                binding
            }
            None => Binding::head(q.binding().buffer, 4),
        };
        self.dispatch_attention(
            q,
            (k_cache, v_cache),
            params,
            [
                k.binding(),
                v.binding(),
                Binding::whole(&table),
                norm_weights,
            ],
            out,
        );
    }
}

/// Rows whose keys one attention pass normalizes (MAX_NORMED_ROWS in
/// attention_core.wgsl).
const MAX_NORMED_ROWS: usize = 64;

/// One binding over both head-norm weights, and where the keys' start in
/// it (in values), if [`Device::colocate`] put them side by side in that
/// order and each has `head_dim` values.
fn head_norm_binding<'a>(
    h: &'a HeadNorms<'_, WgpuBackend>,
    head_dim: usize,
) -> Option<(Binding<'a>, usize)> {
    let (q, k) = (h.q_weight, h.k_weight);
    if q.cols() != head_dim || k.cols() != head_dim || q.rows() != 1 || k.rows() != 1 {
        return None;
    }
    let (qb, kb) = (q.dense_binding(), k.dense_binding());
    let k_end = kb.offset + kb.size?;
    (qb.buffer == kb.buffer && kb.offset >= qb.offset + head_dim as u64 * 4).then(|| {
        let binding = Binding {
            buffer: qb.buffer,
            offset: qb.offset,
            size: Some(k_end - qb.offset),
        };
        (binding, ((kb.offset - qb.offset) / 4) as usize)
    })
}

/// The uniform of a plain (not fused) attention pass.
fn attention_uniform(q: &WgpuTensor, mask: AttentionMask, p: AttentionParams) -> params::Attention {
    params::Attention {
        n_rows: u(q.rows),
        n_head: u(p.n_head),
        n_head_kv: u(p.n_head_kv),
        head_dim: u(p.head_dim),
        q_pos0: u(mask.q_pos0),
        kv_len: u(mask.kv_len),
        causal: u32::from(mask.causal),
        window: u(mask.window.unwrap_or(0)),
        scale: p.scale,
        fused: 0,
        half_rot: 0,
        neox: 0,
        table_row0: 0,
        q_scale: 1.0,
        head_norm: 0,
        norm_eps: 0.0,
        k_norm_off: 0,
        _pad0: 0,
    }
}

impl WgpuBackend {
    /// One attention pass over the caches `k` and `v` (`fused`: the new
    /// keys, new values, rotation table and head-norm weights, or unused
    /// bindings).
    fn dispatch_attention(
        &self,
        q: &WgpuTensor,
        (k, v): (&WgpuTensor, &WgpuTensor),
        params: params::Attention,
        fused: [Binding; 4],
        out: &WgpuTensor,
    ) {
        let [k_new, v_new, table, head_norms] = fused;
        self.dev.dispatch(
            if k.is_f16() {
                kernel("attention_f16.wgsl", "attention")
            } else {
                kernel("attention.wgsl", "attention")
            },
            &params,
            &[
                q.binding(),
                k.binding(),
                v.binding(),
                out.binding(),
                k_new,
                v_new,
                table,
                head_norms,
            ],
            grid(q.rows * params.n_head as usize, 1),
        );
    }
}

impl SamplingOps for WgpuBackend {
    async fn argmax(&self, x: &WgpuTensor) -> Vec<u32> {
        if x.rows == 0 {
            return Vec::new();
        }
        let ids = self.ids_buffer(x.rows);
        self.dev.dispatch(
            kernel("argmax.wgsl", "argmax"),
            &params::Argmax {
                n_rows: u(x.rows),
                cols: u(x.cols),
                as_f32: 0,
                out_row: 0,
                out_col: 0,
                out_cols: 1,
                _pad0: 0,
                _pad1: 0,
            },
            &[x.binding(), Binding::whole(&ids)],
            grid(x.rows, 1),
        );
        let bytes = self.dev.read_bytes(&ids, 0, x.rows as u64 * 4).await;
        bytemuck::pod_collect_to_vec(&bytes)
    }

    fn top_k(&self, x: &WgpuTensor, k: usize, values: &mut WgpuTensor, ids: &mut WgpuTensor) {
        assert!(
            k <= x.cols
                && (values.rows, values.cols) == (x.rows, k)
                && (ids.rows, ids.cols) == (x.rows, k),
            "top_k shapes"
        );
        if x.rows == 0 || k == 0 {
            return;
        }
        self.dev.dispatch(
            kernel("topk.wgsl", "top_k"),
            &params::TopK {
                n_rows: u(x.rows),
                cols: u(x.cols),
                k: u(k),
                _pad0: 0,
            },
            &[x.binding(), values.binding(), ids.binding()],
            grid(x.rows, 1),
        );
    }

    fn penalize(
        &self,
        x: &mut WgpuTensor,
        history: &[u32],
        batch: Option<(&WgpuTensor, usize)>,
        penalty: f32,
        last_n: usize,
    ) {
        if let Some((b, col)) = batch {
            assert!(col < b.cols && b.rows >= x.rows, "penalize batch shape");
        } else {
            assert!(x.rows <= 1, "penalize: several rows need their batch");
        }
        if x.rows == 0 || penalty == 1.0 || last_n == 0 {
            return;
        }
        // Only the window's tail of the history can matter.
        let history = &history[history.len().saturating_sub(last_n)..];
        let hist = self.ids_buffer(history.len().max(1));
        self.dev.upload(&hist, 0, bytemuck::cast_slice(history));
        let params = params::Penalty {
            rows: u(x.rows),
            cols: u(x.cols),
            hist_len: u(history.len()),
            last_n: u(last_n),
            penalty,
            batch_col: u(batch.map_or(0, |(_, col)| col)),
            batch_cols: u(batch.map_or(0, |(b, _)| b.cols)),
            _pad: 0,
        };
        // Without a batch the history stands in for its (unread) binding.
        let batch_binding = batch.map_or(Binding::whole(&hist), |(b, _)| b.binding());
        self.dev.dispatch(
            kernel("penalty.wgsl", "penalize"),
            &params,
            &[x.binding(), Binding::whole(&hist), batch_binding],
            [u(x.rows), 1, 1],
        );
    }

    fn sample_to(
        &self,
        x: &WgpuTensor,
        p: &SamplingParams,
        counter: u64,
        out: &mut WgpuTensor,
        row: usize,
        col: usize,
    ) {
        assert!(
            row + x.rows <= out.rows && col < out.cols,
            "sample_to out of bounds"
        );
        if x.rows == 0 || x.cols == 0 {
            return;
        }
        let k = p.top_k.min(x.cols);
        let top = (k > 0).then(|| {
            let (mut values, mut ids) = (self.tensor(x.rows, k), self.tensor(x.rows, k));
            self.top_k(x, k, &mut values, &mut ids);
            (values, ids)
        });
        let (values, ids) = match &top {
            Some((values, ids)) => (values, ids),
            // The ids binding is unused for whole rows.
            None => (x, x),
        };
        let params = params::Sample {
            n_rows: u(x.rows),
            m: u(values.cols),
            sorted: u32::from(top.is_some()),
            temperature: p.temperature.max(1e-6),
            top_p: p.top_p,
            min_p: p.min_p,
            seed_lo: p.seed as u32,
            seed_hi: (p.seed >> 32) as u32,
            ctr_lo: counter as u32,
            ctr_hi: (counter >> 32) as u32,
            out_row: u(row),
            out_col: u(col),
            out_cols: u(out.cols),
            _pad0: 0,
            _pad1: 0,
            _pad2: 0,
        };
        self.dev.dispatch(
            kernel("sample.wgsl", "sample"),
            &params,
            &[values.binding(), ids.binding(), out.binding()],
            grid(x.rows, 1),
        );
    }

    fn argmax_to(&self, x: &WgpuTensor, out: &mut WgpuTensor, row: usize, col: usize) {
        assert!(
            row + x.rows <= out.rows && col < out.cols,
            "argmax_to out of bounds"
        );
        if x.rows == 0 {
            return;
        }
        self.dev.dispatch(
            kernel("argmax.wgsl", "argmax"),
            &params::Argmax {
                n_rows: u(x.rows),
                cols: u(x.cols),
                as_f32: 1,
                out_row: u(row),
                out_col: u(col),
                out_cols: u(out.cols),
                _pad0: 0,
                _pad1: 0,
            },
            &[x.binding(), out.binding()],
            grid(x.rows, 1),
        );
    }
}

impl HybridOps for WgpuBackend {
    fn runs_hybrid_blocks(&self) -> bool {
        true
    }

    fn causal_conv_silu(
        &self,
        x: &WgpuTensor,
        weight: &WgpuWeight,
        state: &mut WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        let taps = weight.cols();
        assert!(
            weight.rows() == x.cols
                && (state.rows, state.cols) == (taps - 1, x.cols)
                && (out.rows, out.cols) == (x.rows, x.cols),
            "causal_conv_silu shapes"
        );
        let Some(taps_binding) = weight.f32_binding() else {
            self.record_error(BackendError::Unsupported {
                what: format!("{} convolution taps on wgpu (F32 only)", weight.ty()),
            });
            return;
        };
        let params = params::DeltaNet {
            n_rows: u(x.rows),
            channels: u(x.cols),
            taps: u(taps),
            n_k_heads: 0,
            n_v_heads: 0,
            k_dim: 0,
            v_dim: 0,
            eps: 0.0,
        };
        self.dev.dispatch(
            kernel("delta_net.wgsl", "causal_conv_silu"),
            &params,
            &[x.binding(), taps_binding, state.binding(), out.binding()],
            grid(x.cols, 256),
        );
    }

    fn gated_delta_rule(
        &self,
        x: &WgpuTensor,
        alpha: &WgpuTensor,
        beta: &WgpuTensor,
        dt_bias: &WgpuWeight,
        a: &WgpuWeight,
        from: Option<&WgpuTensor>,
        state: &mut WgpuTensor,
        out: &mut WgpuTensor,
        p: DeltaNetParams,
    ) {
        assert!(
            x.cols == p.input_dim()
                && (state.rows, state.cols) == p.state_shape()
                && (out.rows, out.cols) == (x.rows, p.n_v_heads * p.v_dim),
            "gated_delta_rule shapes"
        );
        // The kernel keeps a key head in workgroup memory.
        const MAX_K: usize = 256;
        if p.k_dim > MAX_K {
            self.record_error(BackendError::Unsupported {
                what: format!(
                    "DeltaNet key heads of {} (at most {MAX_K}) on wgpu",
                    p.k_dim
                ),
            });
            return;
        }
        // A copy on the device: cheap beside the rule's own passes.
        if let Some(from) = from {
            self.copy_rows(from, 0, state, 0, 0, from.rows);
        }
        let params = params::DeltaNet {
            n_rows: u(x.rows),
            channels: 0,
            taps: 0,
            n_k_heads: u(p.n_k_heads),
            n_v_heads: u(p.n_v_heads),
            k_dim: u(p.k_dim),
            v_dim: u(p.v_dim),
            eps: p.eps,
        };
        // A prefill goes in chunks of rows (the shader's CHUNK): one pass
        // prepares every chunk at once (T·diag(β) and the masked q·k, 2·CHUNK²
        // floats per chunk and value head, and four factors per row and
        // value head), a second walks them in order. Where that scratch
        // outgrows a binding, or the chunks a grid, the rows go one by one.
        const CHUNK: usize = 32;
        let chunks = x.rows.div_ceil(CHUNK);
        let records = chunks * p.n_v_heads;
        let chunked = x.rows >= CHUNKED_ROWS
            && chunks <= 65535
            && (records * 2 * CHUNK * CHUNK * 4) as u64 <= self.max_binding;
        if !chunked {
            self.dev.dispatch(
                kernel("delta_net.wgsl", "gated_delta_rule"),
                &params,
                &[
                    x.binding(),
                    alpha.binding(),
                    state.binding(),
                    out.binding(),
                    beta.binding(),
                    dt_bias.dense_binding(),
                    a.dense_binding(),
                ],
                // Workgroups of 128 value columns (the kernel's WG).
                [u(p.n_v_heads), u(p.v_dim.div_ceil(128)), 1],
            );
            return;
        }
        let mats = self.tensor(records, 2 * CHUNK * CHUNK);
        let factors = self.tensor(records, 4 * CHUNK);
        self.dev.dispatch(
            kernel("delta_net.wgsl", "delta_rule_prepare"),
            &params,
            &[
                x.binding(),
                alpha.binding(),
                mats.binding(),
                factors.binding(),
                beta.binding(),
                dt_bias.dense_binding(),
                a.dense_binding(),
            ],
            [u(p.n_v_heads), u(chunks), 1],
        );
        self.dev.dispatch(
            kernel("delta_net.wgsl", "delta_rule_chunked"),
            &params,
            &[
                x.binding(),
                mats.binding(),
                state.binding(),
                out.binding(),
                factors.binding(),
            ],
            // Workgroups of 32 value columns (the kernel's CW).
            [u(p.n_v_heads), u(p.v_dim.div_ceil(32)), 1],
        );
    }

    fn split_heads(
        &self,
        x: &WgpuTensor,
        d: usize,
        first: &mut WgpuTensor,
        second: &mut WgpuTensor,
    ) {
        let half = (x.rows, x.cols / 2);
        assert!(
            x.cols % (2 * d) == 0
                && (first.rows, first.cols) == half
                && (second.rows, second.cols) == half,
            "split_heads shapes"
        );
        let params = params::GatedAttention {
            n: u(first.len()),
            d: u(d),
            _pad0: 0,
            _pad1: 0,
        };
        self.dev.dispatch(
            kernel("gated_attention.wgsl", "split_heads"),
            &params,
            &[x.binding(), first.binding(), second.binding()],
            grid(first.len(), 256),
        );
    }

    fn sigmoid_mul(&self, x: &mut WgpuTensor, gate: &WgpuTensor) {
        assert!(
            (x.rows, x.cols) == (gate.rows, gate.cols),
            "sigmoid_mul shapes"
        );
        let params = params::GatedAttention {
            n: u(x.len()),
            d: 1,
            _pad0: 0,
            _pad1: 0,
        };
        self.dev.dispatch(
            kernel("gated_attention.wgsl", "sigmoid_mul"),
            &params,
            &[gate.binding(), x.binding()],
            grid(x.len(), 256),
        );
    }
}

impl DrafterOps for WgpuBackend {
    fn grouped_conv(
        &self,
        x: &WgpuTensor,
        base: &WgpuTensor,
        dynamic: &WgpuTensor,
        p: ConvParams,
        out: &mut WgpuTensor,
    ) {
        assert!(
            base.rows == 2 * p.taps
                && base.cols == x.cols
                && x.cols % p.group == 0
                && dynamic.rows == x.rows
                && dynamic.cols == 2 * p.taps * (x.cols / p.group)
                && (out.rows, out.cols) == (x.rows, x.cols),
            "grouped_conv shapes"
        );
        let params = params::Conv {
            n_rows: u(x.rows),
            cols: u(x.cols),
            taps: u(p.taps),
            group: u(p.group),
            side: u(p.side),
            _pad0: 0,
            _pad1: 0,
            _pad2: 0,
        };
        self.dev.dispatch(
            kernel("conv.wgsl", "grouped_conv"),
            &params,
            &[
                x.binding(),
                base.binding(),
                dynamic.binding(),
                out.binding(),
            ],
            grid(x.len(), 256),
        );
    }

    fn add_slices(&self, x: &WgpuTensor, w: &[f32], out: &mut WgpuTensor) {
        assert!(
            x.rows == out.rows && x.cols == w.len() * out.cols,
            "add_slices shapes"
        );
        const PER_DISPATCH: usize = params::ADD_SLICES_WEIGHTS;
        for (i, chunk) in w.chunks(PER_DISPATCH).enumerate() {
            let mut params = params::AddSlices {
                n: u(out.len()),
                d: u(out.cols),
                width: u(x.cols),
                slice0: u(i * PER_DISPATCH),
                n_w: u(chunk.len()),
                _pad0: 0,
                _pad1: 0,
                _pad2: 0,
                w: [[0.0; 4]; PER_DISPATCH / 4],
            };
            bytemuck::cast_slice_mut(&mut params.w)[..chunk.len()].copy_from_slice(chunk);
            self.dev.dispatch(
                kernel("fusion.wgsl", "add_slices"),
                &params,
                &[x.binding(), out.binding()],
                grid(out.len(), 256),
            );
        }
    }

    fn selector_walk(
        &self,
        gates: &WgpuTensor,
        pred: &WgpuTensor,
        succ: &WgpuTensor,
        unary: &WgpuTensor,
        cand: &WgpuTensor,
        out: &mut WgpuTensor,
        col: usize,
    ) {
        let (n, rank, k) = (gates.rows, gates.cols, unary.cols);
        assert!(
            (pred.rows, pred.cols) == (n * k, rank)
                && (succ.rows, succ.cols) == (n * k, rank)
                && (unary.rows, cand.rows, cand.cols) == (n, n, k)
                && n <= out.rows
                && col < out.cols,
            "selector_walk shapes"
        );
        if n < 2 {
            return;
        }
        self.dev.dispatch(
            kernel("selector.wgsl", "selector_walk"),
            &params::Selector {
                n_rows: u(n),
                rank: u(rank),
                k: u(k),
                out_col: u(col),
                out_cols: u(out.cols),
                _pad0: 0,
                _pad1: 0,
                _pad2: 0,
            },
            &[
                gates.binding(),
                pred.binding(),
                succ.binding(),
                unary.binding(),
                cand.binding(),
                out.binding(),
            ],
            [1, 1, 1],
        );
    }
}
