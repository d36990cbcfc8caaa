//! Native CUDA backend: the backend traits ([`blockdraft_core::Backend`])
//! on NVIDIA GPUs through cudarc. Sampling and the DFlash2 selector walk
//! are the traits' host compositions (a readback per call).
//!
//! Issue 23 names this crate `native/cuda`; like every crate of the
//! repository it lives under `crates/` (`crates/cuda`). Nothing CUDA is
//! linked at build time: the driver and NVRTC are loaded when
//! [`CudaBackend::new`] runs, which fails with [`CudaError::NoDevice`] where
//! they or a device are missing. The kernels (`kernels/*.cu`, one op family
//! per file) are compiled by NVRTC for the device's own architecture and
//! cached on disk ([`compile`]).
//!
//! On the device: matmuls of every weight type (activations quantized to
//! Q8_0/Q8_K as the CPU backend does), embeddings, norms, rope, gated
//! activations, elementwise ops, row copies (f32 and f16 caches),
//! attention, the grouped convolution, argmax. On the host, after a
//! readback (this first version; each a sync): `top_k`, `penalize`,
//! `sample_to` and `selector_walk`, which run the reference
//! ([`blockdraft_core::host_ops`]) and write their results back, so they
//! equal the CPU backend's bit for bit.
//!
//! No CUDA header is needed at run time: the kernels declare their own
//! integer types and convert f16 with single PTX instructions.
//!
//! Checked without a GPU: every kernel compiles to sm_80 and sm_90 CUBINs
//! without spills (`tests/compile.rs`, NVRTC from `tests/fetch_nvrtc.sh`),
//! and the kernels' block decoding equals the reference dequantizer
//! (`tests/host.rs`, the kernels built for the host). On a GPU:
//! `gpu-pack.sh` here builds the test binaries and the CLI into `.gpu/`,
//! and `gpu-check.sh` runs the op
//! conformance suite, the generation tests and `bench --backend cuda` on
//! the GPU machine.

pub mod compile;

use blockdraft_core::backend::{
    AttentionMask, AttentionOps, AttentionParams, BackendError, ConvParams, DeltaNetParams, Device,
    DrafterOps, ElementwiseOps, GatedActivation, HybridOps, KvType, LinearOps, MemoryLimits,
    RopeParams, RopeStyle, SamplingOps, WeightSource,
};
use blockdraft_gguf::GgmlType;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Why the backend could not start or an op failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library, no NVRTC library, or no device.
    #[error("no CUDA device / driver: {0}")]
    NoDevice(String),
    #[error("CUDA kernel compilation: {0}")]
    Compile(String),
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// An op's operands do not fit together (a caller's bug); nothing ran.
    #[error("CUDA op {0}")]
    Shape(String),
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        BackendError::Device(e.to_string())
    }
}

fn driver(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {e}"))
}

fn shape_unless(ok: bool, what: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape(what()))
    }
}

/// Device memory of a tensor: f32, or f16 bits for a KV cache.
enum Buf {
    F32(CudaSlice<f32>),
    F16(CudaSlice<u16>),
}

/// A row-major matrix on the device. `buf` is `None` when its allocation
/// failed (the error is the backend's [`blockdraft_core::backend::Device::device_error`]).
pub struct CudaTensor {
    buf: Option<Buf>,
    rows: usize,
    cols: usize,
}

impl CudaTensor {
    fn capacity(&self) -> usize {
        match &self.buf {
            Some(Buf::F32(s)) => s.len(),
            Some(Buf::F16(s)) => s.len(),
            None => 0,
        }
    }

    fn len(&self) -> usize {
        self.rows * self.cols
    }

    fn f32(&self) -> Result<&CudaSlice<f32>, CudaError> {
        match &self.buf {
            Some(Buf::F32(s)) => Ok(s),
            Some(Buf::F16(_)) => Err(CudaError::Shape("on an f16 tensor".into())),
            None => Err(CudaError::Shape(
                "on a tensor whose allocation failed".into(),
            )),
        }
    }

    fn f32_mut(&mut self) -> Result<&mut CudaSlice<f32>, CudaError> {
        match &mut self.buf {
            Some(Buf::F32(s)) => Ok(s),
            Some(Buf::F16(_)) => Err(CudaError::Shape("on an f16 tensor".into())),
            None => Err(CudaError::Shape(
                "on a tensor whose allocation failed".into(),
            )),
        }
    }
}

/// A weight in its GGUF type; 1-D weights (norms, biases) also as f32.
pub struct CudaWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: CudaSlice<u8>,
    dense: Option<CudaSlice<f32>>,
}

/// Quantized activations of a matmul, reused across calls (one stream
/// orders every use).
struct ActScratch {
    q: CudaSlice<i8>,
    d: CudaSlice<f32>,
    s: CudaSlice<f32>,
    bs: CudaSlice<i32>,
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    device: String,
    arch: String,
    loaded: AtomicU64,
    error: Mutex<Option<String>>,
    act: Mutex<Option<ActScratch>>,
}

/// Every kernel function, by file.
const FUNCTIONS: &[(&str, &[&str])] = &[
    ("activation", &["swiglu", "geglu"]),
    ("argmax", &["argmax_rows"]),
    ("attention", &["attention_f32", "attention_f16"]),
    ("conv", &["grouped_conv"]),
    ("delta_net", &["causal_conv_silu", "gated_delta_rule"]),
    ("gated_attention", &["split_heads", "sigmoid_mul"]),
    (
        "copy",
        &[
            "copy_f32_f32",
            "copy_f32_f16",
            "copy_f16_f16",
            "copy_f16_f32",
        ],
    ),
    (
        "elementwise",
        &[
            "add",
            "scale",
            "add_bias",
            "clamp_finite",
            "softcap",
            "add_slices",
        ],
    ),
    (
        "embed",
        &[
            "embed_F32",
            "embed_F16",
            "embed_BF16",
            "embed_Q4_0",
            "embed_Q4_1",
            "embed_Q5_0",
            "embed_Q5_1",
            "embed_Q8_0",
            "embed_Q8_1",
            "embed_Q2_K",
            "embed_Q3_K",
            "embed_Q4_K",
            "embed_Q5_K",
            "embed_Q6_K",
            "embed_Q8_K",
            "embed_IQ4_NL",
            "embed_IQ4_XS",
            "embed_IQ2_XXS",
            "embed_IQ2_XS",
            "embed_IQ2_S",
            "embed_IQ3_XXS",
            "embed_IQ3_S",
            "embed_IQ1_S",
            "embed_IQ1_M",
            "embed_TQ1_0",
            "embed_TQ2_0",
            "embed_MXFP4",
            "embed_NVFP4",
        ],
    ),
    (
        "matmul",
        &[
            "matmul_F32",
            "matmul_F16",
            "matmul_BF16",
            "matmul_Q4_0",
            "matmul_Q4_1",
            "matmul_Q5_0",
            "matmul_Q5_1",
            "matmul_Q8_0",
            "matmul_Q8_1",
            "matmul_Q2_K",
            "matmul_Q3_K",
            "matmul_Q4_K",
            "matmul_Q5_K",
            "matmul_Q6_K",
            "matmul_Q8_K",
            "matmul_IQ4_NL",
            "matmul_IQ4_XS",
            "matmul_IQ2_XXS",
            "matmul_IQ2_XS",
            "matmul_IQ2_S",
            "matmul_IQ3_XXS",
            "matmul_IQ3_S",
            "matmul_IQ1_S",
            "matmul_IQ1_M",
            "matmul_TQ1_0",
            "matmul_TQ2_0",
            "matmul_MXFP4",
            "matmul_NVFP4",
        ],
    ),
    ("norm", &["rms_norm"]),
    ("quantize", &["quantize_q8_0", "quantize_q8_k"]),
    ("rope", &["rope"]),
];

/// The kernel names of one file ([`compile::KERNEL_FILES`]).
pub fn functions_of(file: &str) -> &'static [&'static str] {
    FUNCTIONS
        .iter()
        .find(|(f, _)| *f == file)
        .map_or(&[], |(_, names)| names)
}

/// The suffix of a weight type's kernels (`matmul_Q4_K`, `embed_Q4_K`), or
/// `None` where no kernel reads it.
fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => "F32",
        T::F16 => "F16",
        T::BF16 => "BF16",
        T::Q4_0 => "Q4_0",
        T::Q4_1 => "Q4_1",
        T::Q5_0 => "Q5_0",
        T::Q5_1 => "Q5_1",
        T::Q8_0 => "Q8_0",
        T::Q8_1 => "Q8_1",
        T::Q2_K => "Q2_K",
        T::Q3_K => "Q3_K",
        T::Q4_K => "Q4_K",
        T::Q5_K => "Q5_K",
        T::Q6_K => "Q6_K",
        T::Q8_K => "Q8_K",
        T::IQ4_NL => "IQ4_NL",
        T::IQ4_XS => "IQ4_XS",
        T::IQ2_XXS => "IQ2_XXS",
        T::IQ2_XS => "IQ2_XS",
        T::IQ2_S => "IQ2_S",
        T::IQ3_XXS => "IQ3_XXS",
        T::IQ3_S => "IQ3_S",
        T::IQ1_S => "IQ1_S",
        T::IQ1_M => "IQ1_M",
        T::TQ1_0 => "TQ1_0",
        T::TQ2_0 => "TQ2_0",
        T::MXFP4 => "MXFP4",
        T::NVFP4 => "NVFP4",
        _ => return None,
    })
}

/// How a matmul's activations are quantized for a weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActKind {
    /// Float weights take the f32 activations.
    F32,
    /// 32-blocks; `true`: block_q8_1 sums (the Q4_1/Q5_1 partner).
    Q8_0(bool),
    /// 256-super-blocks with sums per 16.
    Q8K,
}

fn act_kind(ty: GgmlType) -> ActKind {
    use GgmlType as T;
    match ty {
        T::Q4_1 | T::Q5_1 => ActKind::Q8_0(true),
        // NVFP4's 64-value blocks take two Q8_0 blocks each, as on the CPU.
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Q8_1 | T::IQ4_NL | T::MXFP4 | T::NVFP4 => {
            ActKind::Q8_0(false)
        }
        T::Q2_K
        | T::Q3_K
        | T::Q4_K
        | T::Q5_K
        | T::Q6_K
        | T::Q8_K
        | T::IQ4_XS
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ1_M
        | T::TQ1_0
        | T::TQ2_0 => ActKind::Q8K,
        _ => ActKind::F32,
    }
}

/// Activation rows a matmul launch covers in one grid.y step (`MM_ROWS` in
/// matmul.cu), and weight rows per block (one warp each).
const MM_ROWS: usize = 8;
const MM_WARPS: usize = 4;

/// Launch shape of a matmul of `rows` weight rows by `n` activation rows.
fn matmul_grid(rows: usize, n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            rows.div_ceil(MM_WARPS) as u32,
            n.div_ceil(MM_ROWS) as u32,
            1,
        ),
        block_dim: (32, MM_WARPS as u32, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per value, 256 to a block.
fn flat(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Values too large for the kernels' `int` indices are refused.
fn int(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Shape(format!("{what} {v} exceeds the kernels' range")))
}

impl CudaBackend {
    /// The first CUDA device, its kernels compiled (or read from the cache).
    pub fn new() -> Result<Self, CudaError> {
        Self::on_device(0)
    }

    /// Device `ordinal`.
    pub fn on_device(ordinal: usize) -> Result<Self, CudaError> {
        // cudarc panics when a library is missing: check first.
        // SAFETY: only tries to open the libraries.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDevice(
                "the CUDA driver library (libcuda) is not installed".into(),
            ));
        }
        if !compile::nvrtc_present() {
            return Err(CudaError::NoDevice(
                "NVRTC (libnvrtc.so.13) is not found; add its folder to LD_LIBRARY_PATH".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| CudaError::NoDevice(format!("the driver reports: {e}")))?;
        if count <= ordinal as i32 {
            return Err(CudaError::NoDevice(format!(
                "{count} CUDA device(s); device {ordinal} asked for"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("creating a context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let arch = format!("sm_{major}{minor}");
        let device = ctx.name().map_err(driver("device name"))?;
        // SAFETY: every op of this backend runs on the one stream below, in
        // order, so cudarc's per-slice events (a record per kernel argument)
        // only cost launch time.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let mut functions = HashMap::new();
        for (file, src) in compile::KERNEL_FILES {
            let cubin = compile::cubin_cached(file, src, &arch).map_err(CudaError::Compile)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .map_err(driver("loading a CUBIN"))?;
            for &name in functions_of(file) {
                let f = module
                    .load_function(name)
                    .map_err(|e| CudaError::Compile(format!("{file}.cu: no `{name}`: {e}")))?;
                functions.insert(name, f);
            }
        }
        Ok(CudaBackend {
            ctx,
            stream,
            functions,
            device,
            arch,
            loaded: AtomicU64::new(0),
            error: Mutex::new(None),
            act: Mutex::new(None),
        })
    }

    /// The device's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn device_info(&self) -> String {
        format!("{} ({})", self.device, self.arch)
    }

    fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions
            .get(name)
            .ok_or_else(|| CudaError::Compile(format!("kernel `{name}` is not loaded")))
    }

    /// Keeps the first error; later ones usually follow from it. With
    /// `BLOCKDRAFT_CUDA_LOG_ERRORS` set it is also printed when it happens
    /// (tests on a GPU then show the cause, not only a wrong result).
    fn record(&self, r: Result<(), CudaError>) {
        if let Err(e) = r {
            self.keep_first_error(e.to_string());
        }
    }

    /// The first error of any op (its own or a trait's host composition)
    /// stays for `device_error`.
    fn keep_first_error(&self, message: String) {
        if let Ok(mut slot) = self.error.lock() {
            if slot.is_none() && std::env::var_os("BLOCKDRAFT_CUDA_LOG_ERRORS").is_some() {
                eprintln!("blockdraft-cuda: {message}");
            }
            slot.get_or_insert(message);
        }
    }

    /// Runs an op, recording its error.
    fn run(&self, op: impl FnOnce() -> Result<(), CudaError>) {
        let r = self
            .ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))
            .and_then(|_| op());
        self.record(r);
    }

    fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>, CudaError> {
        // Zero-sized allocations are refused by the driver.
        self.stream
            .alloc_zeros::<f32>(n.max(1))
            .map_err(driver("allocating a tensor"))
    }

    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>, CudaError> {
        let n = t.len();
        match &t.buf {
            Some(Buf::F32(s)) => self
                .stream
                .clone_dtoh(&s.slice(..n))
                .map_err(driver("reading a tensor")),
            Some(Buf::F16(s)) => Ok(self
                .stream
                .clone_dtoh(&s.slice(..n))
                .map_err(driver("reading a tensor"))?
                .into_iter()
                .map(|h| half::f16::from_bits(h).to_f32())
                .collect()),
            None => Err(CudaError::Shape(
                "read of a tensor whose allocation failed".into(),
            )),
        }
    }

    fn upload(&self, t: &mut CudaTensor, data: &[f32]) -> Result<(), CudaError> {
        let n = t.len();
        shape_unless(data.len() == n, || {
            format!(
                "write: {} values into a {}x{} tensor",
                data.len(),
                t.rows,
                t.cols
            )
        })?;
        match &mut t.buf {
            Some(Buf::F32(s)) => self
                .stream
                .memcpy_htod(data, &mut s.slice_mut(..n))
                .map_err(driver("writing a tensor")),
            Some(Buf::F16(s)) => {
                let bits: Vec<u16> = data
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect();
                self.stream
                    .memcpy_htod(&bits, &mut s.slice_mut(..n))
                    .map_err(driver("writing a tensor"))
            }
            None => Err(CudaError::Shape(
                "write to a tensor whose allocation failed".into(),
            )),
        }
    }

    /// Quantizes `x` (`n x cols`) into the scratch buffers for `kind`.
    fn quantize(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        cols: usize,
        kind: ActKind,
        act: &mut ActScratch,
    ) -> Result<(), CudaError> {
        let (name, block) = match kind {
            ActKind::Q8_0(_) => ("quantize_q8_0", 32),
            ActKind::Q8K => ("quantize_q8_k", 256),
            ActKind::F32 => return Ok(()),
        };
        let n_blocks = n * cols / block;
        let nb = int(n_blocks, "activation blocks")?;
        let cfg = LaunchConfig {
            grid_dim: (n_blocks.div_ceil(4) as u32, 1, 1),
            block_dim: (32, 4, 1),
            shared_mem_bytes: 0,
        };
        let f = self.function(name)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&nb);
        let sums = i32::from(kind == ActKind::Q8_0(true));
        match kind {
            ActKind::Q8_0(_) => b.arg(&sums).arg(&mut act.q).arg(&mut act.d).arg(&mut act.s),
            _ => b.arg(&mut act.q).arg(&mut act.d).arg(&mut act.bs),
        };
        // SAFETY: the argument list matches the kernel's; the scratch
        // buffers hold n·cols quants and n·cols/16 sums.
        unsafe { b.launch(cfg) }.map_err(driver(name))?;
        Ok(())
    }

    /// Scratch for `values` activation values, grown as needed.
    fn act_scratch<'a>(
        &self,
        slot: &'a mut Option<ActScratch>,
        values: usize,
    ) -> Result<&'a mut ActScratch, CudaError> {
        if slot.as_ref().is_some_and(|a| a.q.len() >= values) {
            return slot
                .as_mut()
                .ok_or_else(|| CudaError::Shape("scratch".into()));
        }
        let values = values.next_power_of_two();
        let alloc = |what| driver(what);
        let fresh = ActScratch {
            q: self
                .stream
                .alloc_zeros(values)
                .map_err(alloc("scratch quants"))?,
            d: self
                .stream
                .alloc_zeros(values / 32)
                .map_err(alloc("scratch scales"))?,
            s: self
                .stream
                .alloc_zeros(values / 32)
                .map_err(alloc("scratch sums"))?,
            bs: self
                .stream
                .alloc_zeros(values / 16)
                .map_err(alloc("scratch sums"))?,
        };
        Ok(slot.insert(fresh))
    }

    fn matmul_impl(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let (n, cols, rows) = (x.rows, w.cols, w.rows);
        shape_unless(x.cols == cols && out.rows == n && out.cols == rows, || {
            format!(
                "matmul: x {}x{}, weight {rows}x{cols}, out {}x{}",
                x.rows, x.cols, out.rows, out.cols
            )
        })?;
        if n == 0 || rows == 0 {
            return Ok(());
        }
        let suffix = type_suffix(w.ty)
            .ok_or_else(|| CudaError::Shape(format!("matmul of a {} weight", w.ty)))?;
        let name = format!("matmul_{suffix}");
        let f = self.function(&name)?;
        let (rows_i, cols_i, n_i) = (int(rows, "rows")?, int(cols, "cols")?, int(n, "rows")?);
        int(n * cols, "activation values")?;
        let xs = x.f32()?;
        let out_s = out.f32_mut()?;
        let cfg = matmul_grid(rows, n);
        let kind = act_kind(w.ty);
        if kind == ActKind::F32 {
            let mut b = self.stream.launch_builder(f);
            b.arg(&w.bytes)
                .arg(&rows_i)
                .arg(&cols_i)
                .arg(&n_i)
                .arg(xs)
                .arg(out_s);
            // SAFETY: arguments match `matmul_dense`'s wrappers; shapes checked.
            unsafe { b.launch(cfg) }.map_err(driver("matmul"))?;
            return Ok(());
        }
        let mut guard = self
            .act
            .lock()
            .map_err(|_| CudaError::Driver("scratch lock poisoned".into()))?;
        let act = self.act_scratch(&mut guard, n * cols)?;
        self.quantize(xs, n, cols, kind, act)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.bytes)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&n_i)
            .arg(&act.q)
            .arg(&act.d)
            .arg(&act.s)
            .arg(&act.bs)
            .arg(out_s);
        // SAFETY: arguments match `matmul_quant`'s wrappers; shapes checked.
        unsafe { b.launch(cfg) }.map_err(driver("matmul"))?;
        Ok(())
    }

    /// Rows `ids[(id0 + r) · stride]` (f32 ids) of `table`.
    fn embed_rows(
        &self,
        table: &CudaWeight,
        ids: &CudaSlice<f32>,
        stride: usize,
        id0: usize,
        out: &mut CudaTensor,
    ) -> Result<(), CudaError> {
        let n = out.rows;
        shape_unless(out.cols == table.cols, || {
            format!("embed: {}-wide rows into {} columns", table.cols, out.cols)
        })?;
        shape_unless(n == 0 || (id0 + n - 1) * stride < ids.len(), || {
            "embed: ids out of range".into()
        })?;
        if n == 0 {
            return Ok(());
        }
        let suffix = type_suffix(table.ty)
            .ok_or_else(|| CudaError::Shape(format!("embed from a {} table", table.ty)))?;
        let f = self.function(&format!("embed_{suffix}"))?;
        let (rows_i, cols_i) = (int(table.rows, "rows")?, int(table.cols, "cols")?);
        let (stride_i, id0_i) = (int(stride, "stride")?, int(id0, "row")?);
        let out_s = out.f32_mut()?;
        let cfg = LaunchConfig {
            grid_dim: (table.cols.div_ceil(256) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&table.bytes)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(ids)
            .arg(&stride_i)
            .arg(&id0_i)
            .arg(out_s);
        // SAFETY: arguments match the EMBED kernels; ids are bounds-checked
        // on the device.
        unsafe { b.launch(cfg) }.map_err(driver("embed"))?;
        Ok(())
    }

    /// An elementwise kernel `name(x, scalar, n)` over all of `x`.
    fn unary(&self, name: &str, x: &mut CudaTensor, s: f32) -> Result<(), CudaError> {
        let n = x.len();
        let n_i = int(n, "values")?;
        let f = self.function(name)?;
        let xs = x.f32_mut()?;
        let mut b = self.stream.launch_builder(f);
        b.arg(xs).arg(&s).arg(&n_i);
        // SAFETY: (float*, float, int) as the kernel takes.
        unsafe { b.launch(flat(n)) }.map_err(driver(name))?;
        Ok(())
    }
}

impl Device for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;

    fn name(&self) -> String {
        format!("cuda ({})", self.device_info())
    }

    fn load_weight(&self, src: WeightSource<'_>) -> Result<CudaWeight, BackendError> {
        if type_suffix(src.ty).is_none() {
            return Err(BackendError::Unsupported {
                what: format!("{} weights (`{}`) on CUDA", src.ty, src.name),
            });
        }
        let (rows, cols) = src.checked_shape()?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::Device(e.to_string()))?;
        let dense = if src.dims.len() == 1 {
            let mut v = vec![0.0; cols];
            blockdraft_gguf::quants::dequantize(src.ty, &src.data, &mut v)
                .map_err(|e| src.error(e.to_string()))?;
            Some(
                self.stream
                    .clone_htod(&v)
                    .map_err(|e| BackendError::Device(format!("uploading `{}`: {e}", src.name)))?,
            )
        } else {
            None
        };
        let bytes = self
            .stream
            .clone_htod(&src.data[..])
            .map_err(|e| BackendError::Device(format!("uploading `{}`: {e}", src.name)))?;
        self.loaded
            .fetch_add(src.data.len() as u64, Ordering::Relaxed);
        Ok(CudaWeight {
            ty: src.ty,
            rows,
            cols,
            bytes,
            dense,
        })
    }

    fn weight_bytes_loaded(&self) -> u64 {
        self.loaded.load(Ordering::Relaxed)
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        let mut buf = None;
        self.run(|| {
            buf = Some(Buf::F32(self.alloc_f32(rows * cols)?));
            Ok(())
        });
        CudaTensor { buf, rows, cols }
    }

    fn kv_tensor(&self, rows: usize, cols: usize, ty: KvType) -> CudaTensor {
        if ty == KvType::F32 {
            return self.tensor(rows, cols);
        }
        let mut buf = None;
        self.run(|| {
            let s = self
                .stream
                .alloc_zeros::<u16>((rows * cols).max(1))
                .map_err(driver("allocating a KV cache"))?;
            buf = Some(Buf::F16(s));
            Ok(())
        });
        CudaTensor { buf, rows, cols }
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: &mut CudaTensor, rows: usize, cols: usize) {
        assert!(
            rows * cols <= t.capacity(),
            "reshape to {rows}x{cols} exceeds capacity {}",
            t.capacity()
        );
        t.rows = rows;
        t.cols = cols;
    }

    fn write(&self, t: &mut CudaTensor, data: &[f32]) {
        self.run(|| self.upload(t, data));
    }

    async fn read(&self, t: &CudaTensor) -> Vec<f32> {
        let mut out = vec![0.0; t.len()];
        self.run(|| {
            out = self.download(t)?;
            Ok(())
        });
        out
    }

    fn read_blocking(&self, t: &CudaTensor) -> Result<Vec<f32>, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the context"))
            .and_then(|_| self.download(t))
            .map_err(|e| BackendError::Device(e.to_string()))
    }

    fn record_error(&self, e: BackendError) {
        self.keep_first_error(e.to_string());
    }

    fn device_error(&self) -> Option<BackendError> {
        let slot = self.error.lock().ok()?;
        slot.as_ref().map(|e| BackendError::Device(e.clone()))
    }

    fn memory_limits(&self) -> MemoryLimits {
        let free = self
            .ctx
            .bind_to_thread()
            .ok()
            .and_then(|_| self.ctx.mem_get_info().ok())
            .map(|(free, _)| free as u64);
        MemoryLimits {
            available: free,
            max_tensor: None,
        }
    }
}

impl ElementwiseOps for CudaBackend {
    fn rms_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaWeight,
        group: usize,
        eps: f32,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            let dense = weight
                .dense
                .as_ref()
                .ok_or_else(|| CudaError::Shape("rms_norm: the weight is not 1-D".into()))?;
            shape_unless(
                group > 0
                    && weight.cols == group
                    && x.cols % group == 0
                    && (out.rows, out.cols) == (x.rows, x.cols),
                || format!("rms_norm: {}x{} by groups of {group}", x.rows, x.cols),
            )?;
            if x.len() == 0 {
                return Ok(());
            }
            let (cols_i, group_i) = (int(x.cols, "cols")?, int(group, "group")?);
            let f = self.function("rms_norm")?;
            let cfg = LaunchConfig {
                grid_dim: ((x.cols / group) as u32, x.rows as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let xs = x.f32()?;
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs)
                .arg(dense)
                .arg(&cols_i)
                .arg(&group_i)
                .arg(&eps)
                .arg(os);
            // SAFETY: arguments as `rms_norm` takes them; shapes checked.
            unsafe { b.launch(cfg) }.map_err(driver("rms_norm"))?;
            Ok(())
        });
    }

    fn rope(&self, x: &mut CudaTensor, pos0: usize, p: RopeParams) {
        self.run(|| {
            shape_unless(
                p.n_rot % 2 == 0 && p.n_rot <= p.head_dim && p.n_head * p.head_dim <= x.cols,
                || format!("rope: {p:?} on {} columns", x.cols),
            )?;
            let half = p.n_rot / 2;
            if x.rows == 0 || half == 0 || p.n_head == 0 {
                return Ok(());
            }
            // The CPU backend's f32 sequence: the scale by powf on the host.
            let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
            let cols_i = int(x.cols, "cols")?;
            let pos_i = int(pos0 + x.rows, "position")? - x.rows as i32;
            let (heads, dim, rot) = (
                int(p.n_head, "heads")?,
                int(p.head_dim, "head_dim")?,
                int(p.n_rot, "n_rot")?,
            );
            let neox = i32::from(p.style == RopeStyle::Neox);
            let f = self.function("rope")?;
            let cfg = LaunchConfig {
                grid_dim: ((p.n_head * half).div_ceil(128) as u32, x.rows as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let xs = x.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs)
                .arg(&cols_i)
                .arg(&pos_i)
                .arg(&heads)
                .arg(&dim)
                .arg(&rot)
                .arg(&theta_scale)
                .arg(&neox);
            // SAFETY: arguments as `rope` takes them; shapes checked.
            unsafe { b.launch(cfg) }.map_err(driver("rope"))?;
            Ok(())
        });
    }

    fn gated(
        &self,
        act: GatedActivation,
        gate: &CudaTensor,
        up: &CudaTensor,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            shape_unless(
                (gate.rows, gate.cols) == (up.rows, up.cols)
                    && (out.rows, out.cols) == (gate.rows, gate.cols),
                || "gated: shapes differ".into(),
            )?;
            let n = gate.len();
            let (cols_i, rows_i) = (int(gate.cols, "cols")?, int(gate.rows, "rows")?);
            int(n, "values")?;
            let name = match act {
                GatedActivation::SwiGlu => "swiglu",
                GatedActivation::GeGlu => "geglu",
            };
            let f = self.function(name)?;
            let (g, u) = (gate.f32()?, up.f32()?);
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(g).arg(u).arg(&cols_i).arg(&rows_i).arg(os);
            // SAFETY: (gate, up, cols, n, out) as the kernels take.
            unsafe { b.launch(flat(n)) }.map_err(driver(name))?;
            Ok(())
        });
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        self.run(|| {
            shape_unless(x.len() == y.len(), || "add: sizes differ".into())?;
            let n = x.len();
            let n_i = int(n, "values")?;
            let f = self.function("add")?;
            let ys = y.f32()?;
            let xs = x.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs).arg(ys).arg(&n_i);
            // SAFETY: (float*, const float*, int).
            unsafe { b.launch(flat(n)) }.map_err(driver("add"))?;
            Ok(())
        });
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        self.run(|| self.unary("scale", x, s));
    }

    fn clamp_finite(&self, x: &mut CudaTensor, limit: f32) {
        self.run(|| self.unary("clamp_finite", x, limit));
    }

    fn copy_rows(
        &self,
        src: &CudaTensor,
        src_row: usize,
        dst: &mut CudaTensor,
        dst_row: usize,
        dst_col: usize,
        n_rows: usize,
    ) {
        self.run(|| {
            shape_unless(
                dst_col + src.cols <= dst.cols
                    && dst_row + n_rows <= dst.rows
                    && src_row + n_rows <= src.rows,
                || "copy_rows out of bounds".into(),
            )?;
            let n = n_rows * src.cols;
            if n == 0 {
                return Ok(());
            }
            let args = [
                int(src.cols, "cols")?,
                int(src_row, "row")?,
                int(dst.cols, "cols")?,
                int(dst_row, "row")?,
                int(dst_col, "col")?,
                int(n_rows, "rows")?,
            ];
            int(n, "values")?;
            let (sc, sr, dc, dr, dcol, nr) = (args[0], args[1], args[2], args[3], args[4], args[5]);
            macro_rules! copy {
                ($name:literal, $s:expr, $d:expr) => {{
                    let f = self.function($name)?;
                    let mut b = self.stream.launch_builder(f);
                    b.arg($s)
                        .arg(&sc)
                        .arg(&sr)
                        .arg($d)
                        .arg(&dc)
                        .arg(&dr)
                        .arg(&dcol)
                        .arg(&nr);
                    // SAFETY: arguments as the COPY kernels take; bounds checked.
                    unsafe { b.launch(flat(n)) }.map_err(driver($name))?;
                }};
            }
            match (&src.buf, &mut dst.buf) {
                (Some(Buf::F32(s)), Some(Buf::F32(d))) => copy!("copy_f32_f32", s, d),
                (Some(Buf::F32(s)), Some(Buf::F16(d))) => copy!("copy_f32_f16", s, d),
                (Some(Buf::F16(s)), Some(Buf::F16(d))) => copy!("copy_f16_f16", s, d),
                (Some(Buf::F16(s)), Some(Buf::F32(d))) => copy!("copy_f16_f32", s, d),
                _ => return Err(CudaError::Shape("copy_rows of a failed allocation".into())),
            }
            Ok(())
        });
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) {
        self.run(|| self.unary("softcap", x, cap));
    }
}

impl LinearOps for CudaBackend {
    fn embed(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaTensor) {
        self.run(|| {
            shape_unless(ids.len() == out.rows, || {
                format!("embed: {} ids into {} rows", ids.len(), out.rows)
            })?;
            if ids.is_empty() {
                return Ok(());
            }
            // f32 ids, as argmax_to leaves them on the device: exact below 2^24.
            if let Some(&big) = ids.iter().find(|&&id| id as usize >= table.rows) {
                return Err(CudaError::Shape(format!(
                    "embed: id {big} beyond the table's {} rows",
                    table.rows
                )));
            }
            let idf: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
            let dev = self
                .stream
                .clone_htod(&idf)
                .map_err(driver("uploading ids"))?;
            self.embed_rows(table, &dev, 1, 0, out)
        });
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaTensor, out: &mut CudaTensor) {
        self.run(|| self.matmul_impl(w, x, out));
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) {
        self.run(|| {
            let dense = bias
                .dense
                .as_ref()
                .ok_or_else(|| CudaError::Shape("add_bias: the bias is not 1-D".into()))?;
            shape_unless(bias.cols == x.cols, || {
                format!("add_bias: {} values for {} columns", bias.cols, x.cols)
            })?;
            let (n, cols) = (x.len(), x.cols);
            let (n_i, cols_i) = (int(n, "values")?, int(cols, "cols")?);
            let f = self.function("add_bias")?;
            let xs = x.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs).arg(dense).arg(&cols_i).arg(&n_i);
            // SAFETY: (float*, const float*, int, int).
            unsafe { b.launch(flat(n)) }.map_err(driver("add_bias"))?;
            Ok(())
        });
    }

    fn embed_from(&self, table: &CudaWeight, ids: &CudaTensor, row0: usize, out: &mut CudaTensor) {
        self.run(|| {
            shape_unless(row0 + out.rows <= ids.rows, || "embed_from shapes".into())?;
            let stride = ids.cols;
            self.embed_rows(table, ids.f32()?, stride, row0, out)
        });
    }
}

impl AttentionOps for CudaBackend {
    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            let (qc, kvc) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
            shape_unless(
                p.n_head_kv > 0
                    && p.n_head % p.n_head_kv == 0
                    && p.head_dim <= 256
                    && q.cols == qc
                    && out.cols == qc
                    && out.rows >= q.rows
                    && k.cols == kvc
                    && v.cols == kvc
                    && mask.kv_len <= k.rows.min(v.rows),
                || {
                    format!(
                        "attention: {p:?} {mask:?} on q {}x{}, k {}x{}",
                        q.rows, q.cols, k.rows, k.cols
                    )
                },
            )?;
            if q.rows == 0 || p.n_head == 0 {
                return Ok(());
            }
            let window = match mask.window {
                Some(w) => int(w, "window")?,
                None => -1,
            };
            let ints = [
                int(mask.q_pos0 + q.rows, "position")?,
                int(mask.kv_len, "kv_len")?,
                int(p.n_head, "heads")?,
                int(p.n_head_kv, "kv heads")?,
                int(p.head_dim, "head_dim")?,
            ];
            let (q_pos0, kv_len, heads, kv_heads, dim) =
                (mask.q_pos0 as i32, ints[1], ints[2], ints[3], ints[4]);
            let causal = i32::from(mask.causal);
            let cfg = LaunchConfig {
                grid_dim: (p.n_head as u32, q.rows as u32, 1),
                block_dim: (32, 4, 1),
                shared_mem_bytes: 0,
            };
            let qs = q.f32()?;
            let os = out.f32_mut()?;
            macro_rules! attend {
                ($name:literal, $k:expr, $v:expr) => {{
                    let f = self.function($name)?;
                    let mut b = self.stream.launch_builder(f);
                    b.arg(qs)
                        .arg($k)
                        .arg($v)
                        .arg(os)
                        .arg(&q_pos0)
                        .arg(&kv_len)
                        .arg(&causal)
                        .arg(&window)
                        .arg(&heads)
                        .arg(&kv_heads)
                        .arg(&dim)
                        .arg(&p.scale);
                    // SAFETY: arguments as the ATTENTION kernels take; shapes checked.
                    unsafe { b.launch(cfg) }.map_err(driver($name))?;
                }};
            }
            match (&k.buf, &v.buf) {
                (Some(Buf::F32(k)), Some(Buf::F32(v))) => attend!("attention_f32", k, v),
                (Some(Buf::F16(k)), Some(Buf::F16(v))) => attend!("attention_f16", k, v),
                _ => {
                    return Err(CudaError::Shape(
                        "attention: keys and values of different types".into(),
                    ))
                }
            }
            Ok(())
        });
    }
}

impl SamplingOps for CudaBackend {
    fn argmax_to(&self, x: &CudaTensor, out: &mut CudaTensor, row: usize, col: usize) {
        self.run(|| {
            shape_unless(row + x.rows <= out.rows && col < out.cols, || {
                "argmax_to out of bounds".into()
            })?;
            if x.rows == 0 {
                return Ok(());
            }
            let (cols, out_cols, row_i, col_i) = (
                int(x.cols, "cols")?,
                int(out.cols, "cols")?,
                int(row, "row")?,
                int(col, "col")?,
            );
            let f = self.function("argmax_rows")?;
            let cfg = LaunchConfig {
                grid_dim: (x.rows as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let xs = x.f32()?;
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs)
                .arg(&cols)
                .arg(os)
                .arg(&out_cols)
                .arg(&row_i)
                .arg(&col_i);
            // SAFETY: arguments as `argmax_rows` takes them; bounds checked.
            unsafe { b.launch(cfg) }.map_err(driver("argmax"))?;
            Ok(())
        });
    }
}

/// One thread per value in blocks of 256.
fn per_value(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl HybridOps for CudaBackend {
    fn runs_hybrid_blocks(&self) -> bool {
        true
    }

    fn causal_conv_silu(
        &self,
        x: &CudaTensor,
        weight: &CudaWeight,
        state: &mut CudaTensor,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            let taps = weight.cols;
            shape_unless(
                taps > 0
                    && weight.rows == x.cols
                    && (state.rows, state.cols) == (taps - 1, x.cols)
                    && (out.rows, out.cols) == (x.rows, x.cols),
                || "causal_conv_silu shapes".into(),
            )?;
            if weight.ty != GgmlType::F32 {
                return Err(CudaError::Shape(format!(
                    "causal_conv_silu: {} convolution taps (F32 only)",
                    weight.ty
                )));
            }
            if x.cols == 0 {
                return Ok(());
            }
            int(x.len(), "values")?;
            let (n, c, taps_i) = (
                int(x.rows, "rows")?,
                int(x.cols, "cols")?,
                int(taps, "taps")?,
            );
            let f = self.function("causal_conv_silu")?;
            let xs = x.f32()?;
            let ss = state.f32_mut()?;
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs)
                .arg(&weight.bytes)
                .arg(&n)
                .arg(&c)
                .arg(&taps_i)
                .arg(ss)
                .arg(os);
            // SAFETY: arguments as `causal_conv_silu` takes them; shapes and
            // the taps' type checked.
            unsafe { b.launch(per_value(x.cols)) }.map_err(driver("causal_conv_silu"))?;
            Ok(())
        });
    }

    fn gated_delta_rule(
        &self,
        x: &CudaTensor,
        alpha: &CudaTensor,
        beta: &CudaTensor,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
        from: Option<&CudaTensor>,
        state: &mut CudaTensor,
        out: &mut CudaTensor,
        p: DeltaNetParams,
    ) {
        // The kernel's block width and widest key head (delta_net.cu).
        const THREADS: usize = 128;
        const MAX_K: usize = 256;
        if let Some(from) = from {
            self.copy_rows(from, 0, state, 0, 0, from.rows);
        }
        self.run(|| {
            shape_unless(
                p.n_k_heads > 0
                    && p.n_v_heads % p.n_k_heads == 0
                    && p.k_dim <= MAX_K
                    && x.cols == p.input_dim()
                    && (alpha.rows, alpha.cols) == (x.rows, p.n_v_heads)
                    && (beta.rows, beta.cols) == (x.rows, p.n_v_heads)
                    && (dt_bias.cols, a.cols) == (p.n_v_heads, p.n_v_heads)
                    && (state.rows, state.cols) == p.state_shape()
                    && (out.rows, out.cols) == (x.rows, p.n_v_heads * p.v_dim),
                || format!("gated_delta_rule shapes ({p:?}, key heads of at most {MAX_K})"),
            )?;
            let (dt, decay) = match (&dt_bias.dense, &a.dense) {
                (Some(dt), Some(decay)) => (dt, decay),
                _ => {
                    return Err(CudaError::Shape(
                        "gated_delta_rule: dt_bias and a are 1-D".into(),
                    ))
                }
            };
            if x.rows == 0 || p.v_dim == 0 {
                return Ok(());
            }
            int(x.len().max(state.len()), "values")?;
            let dims = [
                int(x.rows, "rows")?,
                int(p.n_k_heads, "key heads")?,
                int(p.n_v_heads, "value heads")?,
                int(p.k_dim, "key width")?,
                int(p.v_dim, "value width")?,
            ];
            let f = self.function("gated_delta_rule")?;
            let cfg = LaunchConfig {
                grid_dim: (p.n_v_heads as u32, p.v_dim.div_ceil(THREADS) as u32, 1),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (xs, al, be) = (x.f32()?, alpha.f32()?, beta.f32()?);
            let ss = state.f32_mut()?;
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs).arg(al).arg(be).arg(dt).arg(decay);
            for d in &dims {
                b.arg(d);
            }
            b.arg(&p.eps).arg(ss).arg(os);
            // SAFETY: arguments as `gated_delta_rule` takes them; shapes checked.
            unsafe { b.launch(cfg) }.map_err(driver("gated_delta_rule"))?;
            Ok(())
        });
    }

    fn split_heads(
        &self,
        x: &CudaTensor,
        d: usize,
        first: &mut CudaTensor,
        second: &mut CudaTensor,
    ) {
        self.run(|| {
            let half = (x.rows, x.cols / 2);
            shape_unless(
                d > 0
                    && x.cols % (2 * d) == 0
                    && (first.rows, first.cols) == half
                    && (second.rows, second.cols) == half,
                || "split_heads shapes".into(),
            )?;
            if first.len() == 0 {
                return Ok(());
            }
            let (len, d_i) = (first.len(), int(d, "head width")?);
            let n = int(len, "values")?;
            let f = self.function("split_heads")?;
            let xs = x.f32()?;
            let fs = first.f32_mut()?;
            let ss = second.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs).arg(&n).arg(&d_i).arg(fs).arg(ss);
            // SAFETY: arguments as `split_heads` takes them; shapes checked.
            unsafe { b.launch(per_value(len)) }.map_err(driver("split_heads"))?;
            Ok(())
        });
    }

    fn sigmoid_mul(&self, x: &mut CudaTensor, gate: &CudaTensor) {
        self.run(|| {
            shape_unless((x.rows, x.cols) == (gate.rows, gate.cols), || {
                "sigmoid_mul shapes".into()
            })?;
            if x.len() == 0 {
                return Ok(());
            }
            let n = int(x.len(), "values")?;
            let f = self.function("sigmoid_mul")?;
            let gs = gate.f32()?;
            let len = x.len();
            let xs = x.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(gs).arg(&n).arg(xs);
            // SAFETY: arguments as `sigmoid_mul` takes them; shapes checked.
            unsafe { b.launch(per_value(len)) }.map_err(driver("sigmoid_mul"))?;
            Ok(())
        });
    }
}

impl DrafterOps for CudaBackend {
    fn grouped_conv(
        &self,
        x: &CudaTensor,
        base: &CudaTensor,
        dynamic: &CudaTensor,
        p: ConvParams,
        out: &mut CudaTensor,
    ) {
        self.run(|| {
            shape_unless(
                p.group > 0
                    && base.rows == 2 * p.taps
                    && base.cols == x.cols
                    && x.cols % p.group == 0
                    && dynamic.rows == x.rows
                    && dynamic.cols == 2 * p.taps * (x.cols / p.group)
                    && p.side < 2
                    && (out.rows, out.cols) == (x.rows, x.cols),
                || "grouped_conv shapes".into(),
            )?;
            let total = x.len();
            if total == 0 {
                return Ok(());
            }
            int(total, "values")?;
            let (n, d) = (int(x.rows, "rows")?, int(x.cols, "cols")?);
            let (taps, group, side) = (
                int(p.taps, "taps")?,
                int(p.group, "group")?,
                int(p.side, "side")?,
            );
            let f = self.function("grouped_conv")?;
            let (xs, bs, ds) = (x.f32()?, base.f32()?, dynamic.f32()?);
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs)
                .arg(bs)
                .arg(ds)
                .arg(&n)
                .arg(&d)
                .arg(&taps)
                .arg(&group)
                .arg(&side)
                .arg(os);
            // SAFETY: arguments as `grouped_conv` takes them; shapes checked.
            unsafe { b.launch(flat(total)) }.map_err(driver("grouped_conv"))?;
            Ok(())
        });
    }

    fn add_slices(&self, x: &CudaTensor, w: &[f32], out: &mut CudaTensor) {
        self.run(|| {
            shape_unless(x.rows == out.rows && x.cols == w.len() * out.cols, || {
                "add_slices shapes".into()
            })?;
            let n = out.len();
            if n == 0 || w.is_empty() {
                return Ok(());
            }
            let (n_w, d, n_i) = (
                int(w.len(), "weights")?,
                int(out.cols, "cols")?,
                int(n, "values")?,
            );
            int(x.len(), "values")?;
            let wd = self
                .stream
                .clone_htod(w)
                .map_err(driver("uploading weights"))?;
            let f = self.function("add_slices")?;
            let xs = x.f32()?;
            let os = out.f32_mut()?;
            let mut b = self.stream.launch_builder(f);
            b.arg(xs).arg(&wd).arg(&n_w).arg(&d).arg(&n_i).arg(os);
            // SAFETY: arguments as `add_slices` takes them; shapes checked.
            unsafe { b.launch(flat(n)) }.map_err(driver("add_slices"))?;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_launches_cover_every_row_and_tile() {
        let c = matmul_grid(37, 1);
        assert_eq!((c.grid_dim, c.block_dim), ((10, 1, 1), (32, 4, 1)));
        let c = matmul_grid(896, 16);
        assert_eq!(c.grid_dim, (224, 2, 1));
        let c = matmul_grid(4, 17);
        assert_eq!(c.grid_dim, (1, 3, 1));
        assert_eq!(flat(0).grid_dim, (1, 1, 1));
        assert_eq!(flat(257).grid_dim, (2, 1, 1));
    }

    #[test]
    fn every_conformance_type_has_kernels_and_an_activation_rule() {
        for &ty in blockdraft_core::conformance::WEIGHT_TYPES {
            let s = type_suffix(ty).expect("a kernel suffix");
            assert!(functions_of("matmul").contains(&format!("matmul_{s}").as_str()));
            assert!(functions_of("embed").contains(&format!("embed_{s}").as_str()));
            let want = match ty.block_len() {
                1 => ActKind::F32,
                32 | 64 => ActKind::Q8_0(matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1)),
                _ => ActKind::Q8K,
            };
            assert_eq!(act_kind(ty), want, "{ty}");
        }
        assert!(type_suffix(GgmlType::I32).is_none());
    }

    #[test]
    fn every_kernel_file_lists_its_functions() {
        for (file, _) in compile::KERNEL_FILES {
            assert!(!functions_of(file).is_empty(), "{file}");
        }
        assert_eq!(FUNCTIONS.len(), compile::KERNEL_FILES.len());
    }

    #[test]
    fn int_refuses_what_the_kernels_cannot_index() {
        assert_eq!(int(5, "x").ok(), Some(5));
        assert!(matches!(int(1 << 31, "x"), Err(CudaError::Shape(_))));
    }
}
