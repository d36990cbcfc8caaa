//! The device: tensors and weights, transfers, errors and limits.

use super::{BackendError, CommandCounts, KernelTiming, KvType, MemoryLimits, WeightSource};

// `async fn` without a `Send` bound on purpose: the traits are used
// generically only, and wasm's futures are not `Send`.
#[allow(async_fn_in_trait)]
pub trait Device: Send + Sync + 'static {
    /// A row-major f32 matrix on the device with a fixed capacity.
    type Tensor: Send + Sync;
    /// A weight in its GGUF type, resident on the device.
    type Weight: Send + Sync;

    /// Human-readable backend and device name.
    fn name(&self) -> String;

    /// Makes a GGUF tensor resident. 1-D tensors (norms, biases) and 2-D
    /// matrices of every supported type are accepted.
    fn load_weight(&self, src: WeightSource<'_>) -> Result<Self::Weight, BackendError>;

    /// Weights that one pass reads together (a layer's q|k|v and their
    /// biases, its gate|up, its q/k head norms): a backend may move them
    /// side by side into one allocation, so that one pass reads them all
    /// ([`super::LinearOps::matmul_many`], `gated_projection`,
    /// [`super::AttentionOps::attention_step`]). Values and shapes do not
    /// change. The default leaves them where they are.
    fn colocate(&self, weights: &mut [&mut Self::Weight]) {
        let _ = weights;
    }

    /// Bytes of GGUF data made resident by [`Self::load_weight`] so far:
    /// what loading cost, and how a front end checks that a new sequence
    /// uploads nothing (models are shared; sequences own only state).
    fn weight_bytes_loaded(&self) -> u64;

    /// A zeroed `rows x cols` tensor; its capacity is `rows * cols`.
    fn tensor(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A zeroed `rows x cols` KV-cache tensor stored as `ty`. Only
    /// `copy_rows` (either side), `attention` (as keys or values), `read`
    /// and `write` take one; values pass through `ty` (f16 rounds them).
    fn kv_tensor(&self, rows: usize, cols: usize, ty: KvType) -> Self::Tensor;
    /// Current `(rows, cols)`.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    /// Changes the logical shape within the capacity (no allocation).
    fn reshape(&self, t: &mut Self::Tensor, rows: usize, cols: usize);
    /// Sets all `rows x cols` values of `t`.
    fn write(&self, t: &mut Self::Tensor, data: &[f32]);
    /// Waits for the recorded work and returns the tensor's values.
    async fn read(&self, t: &Self::Tensor) -> Vec<f32>;

    /// [`Self::read`] without a future, for the ops composed on the host
    /// (the defaults of [`super::SamplingOps`] and [`super::DrafterOps`]).
    /// A backend that cannot wait for its device in place (WebGPU in a
    /// browser) keeps this default and overrides those ops.
    fn read_blocking(&self, t: &Self::Tensor) -> Result<Vec<f32>, BackendError> {
        let _ = t;
        Err(BackendError::Unsupported {
            what: format!(
                "blocking reads on {}: it must override the ops composed on the host",
                self.name()
            ),
        })
    }

    /// Keeps the first error of an op (ops return nothing), for
    /// [`Self::device_error`] to report.
    fn record_error(&self, e: BackendError);

    /// The first error the device reported (a GPU's validation failure,
    /// out-of-memory or loss, or an op's [`Self::record_error`]), after
    /// which its results mean nothing; it stays until the backend is
    /// dropped. Generation checks it after every readback.
    fn device_error(&self) -> Option<BackendError>;

    /// Whether tensors live in host memory, so that [`Self::read`] is a
    /// plain copy. The speculative engine then chooses every token on the
    /// host, where a readback costs nothing.
    fn host_memory(&self) -> bool {
        false
    }

    /// The commands a device backend has recorded since it started (see
    /// [`CommandCounts`]); `None` for a backend that records none (the
    /// CPU). `bench` prints them per decoded token.
    fn command_counts(&self) -> Option<CommandCounts> {
        None
    }

    /// Per-kernel GPU time since the last call, where the backend profiles
    /// (wgpu with `BLOCKDRAFT_WGPU_PROFILE=1`); `None` otherwise.
    fn take_kernel_timings(&self) -> Option<Vec<KernelTiming>> {
        None
    }

    /// What new tensors may take, where the backend knows; checked before
    /// the allocations a user's numbers size (a context's KV cache), so
    /// that too large a request is an error rather than an abort.
    fn memory_limits(&self) -> MemoryLimits {
        MemoryLimits::default()
    }
}
