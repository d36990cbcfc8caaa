//! The backend trait: the kernels an LLM needs, and nothing more.
//!
//! The trait is open: each backend (CPU, wgpu, CUDA, Metal) implements it in
//! its own crate and all model code is generic over it. Tensors are backend
//! handles holding row-major f32 matrices; weights stay in their GGUF type on
//! the device. Ops record work; the read-backs (`read`, `argmax`) are
//! `async` because they synchronize: in the browser a readback is a
//! `mapAsync` that only completes once JS's event loop runs. Their futures
//! need not be `Send` (wasm's are not); native callers block on them.

use crate::sampling::SamplingParams;
use blockdraft_gguf::{GgmlType, TensorData};

/// Errors a backend reports.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend does not support {what}")]
    Unsupported { what: String },
    #[error("tensor `{name}`: {reason}")]
    BadWeight { name: String, reason: String },
    #[error("device: {0}")]
    Device(String),
}

/// Fails with the device's error ([`Backend::device_error`]), if any.
pub fn check_device<B: Backend + ?Sized>(be: &B) -> Result<(), BackendError> {
    be.device_error().map_or(Ok(()), Err)
}

/// What a backend can hold ([`Backend::memory_limits`]); `None` where it
/// cannot tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Bytes that new tensors may take in all (for the CPU backend, the
    /// host memory available now).
    pub available: Option<u64>,
    /// Bytes of the largest single tensor (a GPU's largest buffer).
    pub max_tensor: Option<u64>,
}

/// Bytes of a `rows x cols` tensor of `element_bytes` each (saturating,
/// so that sizes beyond u64 are refused rather than wrapped).
pub fn tensor_bytes(rows: usize, cols: usize, element_bytes: u64) -> u64 {
    (rows as u64)
        .saturating_mul(cols as u64)
        .saturating_mul(element_bytes)
}

impl MemoryLimits {
    /// Fails unless tensors of `sizes` bytes each fit, naming `what` they
    /// are for.
    pub fn check(&self, what: &str, sizes: &[u64]) -> Result<(), crate::ModelError> {
        if let Some(max) = self.max_tensor {
            if let Some(&big) = sizes.iter().find(|&&b| b > max) {
                return Err(crate::ModelError::MemoryLimit {
                    what: format!("one tensor of {what}"),
                    bytes: big,
                    limit: "the backend's largest buffer",
                    available: max,
                });
            }
        }
        let total = sizes.iter().fold(0u64, |a, &b| a.saturating_add(b));
        self.check_bytes(what, total)
    }

    /// Fails unless `bytes` in all fit in what is available, naming
    /// `what` they are for (a model's weights, before they are loaded).
    pub fn check_bytes(&self, what: &str, bytes: u64) -> Result<(), crate::ModelError> {
        match self.available {
            Some(available) if bytes > available => Err(crate::ModelError::MemoryLimit {
                what: what.to_string(),
                bytes,
                limit: "the memory available",
                available,
            }),
            _ => Ok(()),
        }
    }
}

/// How a KV cache stores its keys and values. F16 halves the cache's
/// memory and what attention reads at depth; with it the CPU backend
/// follows llama.cpp's default configuration (f16 cache, flash attention)
/// bit for bit, so the CLI and the browser package use it unless told
/// otherwise. F32 is the precise one (llama.cpp's `-fa off -ctk f32 -ctv f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    /// What a decoder's states use unless told otherwise: the precise
    /// cache, the library's reference.
    pub const DEFAULT: KvType = KvType::F32;
    /// What the front ends (CLI, browser package) use unless told
    /// otherwise: llama.cpp's default, so their users see the same tokens
    /// out of the box (and half the cache memory).
    pub const FRONT_END_DEFAULT: KvType = KvType::F16;

    pub fn element_bytes(self) -> u64 {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }

    /// The type [`KvType::name`] calls `name`.
    pub fn from_name(name: &str) -> Option<KvType> {
        [KvType::F32, KvType::F16]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

/// A weight tensor as the GGUF file stores it, handed to a backend to make resident.
pub struct WeightSource<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// ggml order: `dims[0]` is the row length.
    pub dims: &'a [u64],
    pub data: TensorData,
}

/// Which keys each query row may attend to. Query row `i` sits at
/// position `q_pos0 + i`; the cache slot of a key is its position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionMask {
    /// Position of query row 0.
    pub q_pos0: usize,
    /// Keys visible to every row are `0..kv_len`, further cut per row by
    /// `causal` (key position <= query position) and `window`.
    pub kv_len: usize,
    pub causal: bool,
    /// Sliding window: a key is visible only if `q_pos - k_pos < window`.
    pub window: Option<usize>,
}

/// Shape and scaling of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Rotary embedding layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (qwen2, qwen3, gemma3).
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    pub n_head: usize,
    pub head_dim: usize,
    /// Dimensions rotated within each head (the rest pass through).
    pub n_rot: usize,
    pub base: f32,
}

/// Gated feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedActivation {
    /// `silu(gate) * up`
    SwiGlu,
    /// `gelu_tanh(gate) * up`
    GeGlu,
}

/// One side of a grouped dynamic depthwise convolution (DFlash2, spec §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvParams {
    /// Taps T: row `i` mixes rows `i − T + 1 ..= i`.
    pub taps: usize,
    /// Channels sharing one dynamic delta (contiguous: group of `c` is `c / group`).
    pub group: usize,
    /// 0 = before the sublayer, 1 = after it.
    pub side: usize,
}

/// GPU time of one kernel, summed over its dispatches
/// ([`Backend::take_kernel_timings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelTiming {
    pub kernel: String,
    pub dispatches: u64,
    pub gpu_ns: u64,
    /// Bytes of the buffer ranges its dispatches bound: an upper bound of
    /// what they moved (a KV cache is bound whole, read in part).
    pub bytes_bound: u64,
}

/// One projection of [`Backend::matmul_many`].
pub struct Projection<'a, B: Backend + ?Sized> {
    pub weight: &'a B::Weight,
    pub bias: Option<&'a B::Weight>,
    pub out: &'a mut B::Tensor,
}

/// What a device backend has recorded: on a GPU each of these costs the
/// host API time, which bounds small models more than the GPU does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandCounts {
    /// Kernel launches.
    pub dispatches: u64,
    /// Compute passes begun.
    pub passes: u64,
    /// Command buffers submitted.
    pub submits: u64,
    /// Bind groups (descriptor sets) created.
    pub bind_groups: u64,
    /// Results copied back to the host.
    pub readbacks: u64,
}

impl CommandCounts {
    /// The counts recorded after `earlier` was taken.
    pub fn since(&self, earlier: &CommandCounts) -> CommandCounts {
        CommandCounts {
            dispatches: self.dispatches - earlier.dispatches,
            passes: self.passes - earlier.passes,
            submits: self.submits - earlier.submits,
            bind_groups: self.bind_groups - earlier.bind_groups,
            readbacks: self.readbacks - earlier.readbacks,
        }
    }
}

// `async fn` without a `Send` bound on purpose: the trait is used
// generically only, and wasm's futures are not `Send`.
#[allow(async_fn_in_trait)]
pub trait Backend: Send + Sync + 'static {
    /// A row-major f32 matrix on the device with a fixed capacity.
    type Tensor: Send + Sync;
    /// A weight in its GGUF type, resident on the device.
    type Weight: Send + Sync;

    /// Human-readable backend and device name.
    fn name(&self) -> String;

    /// Makes a GGUF tensor resident. 1-D tensors (norms, biases) and 2-D
    /// matrices of every supported type are accepted.
    fn load_weight(&self, src: WeightSource<'_>) -> Result<Self::Weight, BackendError>;

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
    fn write(&self, t: &mut Self::Tensor, data: &[f32]);
    /// Waits for the recorded work and returns the tensor's values.
    async fn read(&self, t: &Self::Tensor) -> Vec<f32>;

    /// `out[r] = table[ids[r]]` (rows of the embedding table, dequantized).
    fn embed(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Tensor);
    /// `out = x · Wᵀ`: x is `n x cols`, W is `rows x cols`, out `n x rows`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Tensor, out: &mut Self::Tensor);
    /// Adds a 1-D weight to every row.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);

    /// The projections of one input (q|k|v, gate|up): for each,
    /// `out = x · Wᵀ`, plus its bias if it has one. The default runs them
    /// one by one; a backend may prepare `x` once for all of them (a GPU
    /// quantizes it once) and add the bias as each product is stored.
    fn matmul_many(&self, x: &Self::Tensor, projections: &mut [Projection<'_, Self>]) {
        for p in projections {
            self.matmul(p.weight, x, p.out);
            if let Some(b) = p.bias {
                self.add_bias(p.out, b);
            }
        }
    }

    /// A gated feed-forward's first half, `out = act(x · W_gateᵀ) ⊙
    /// (x · W_upᵀ)`. The default runs both projections into `gate` and `up`
    /// ([`Self::matmul_many`]), then [`Self::gated`]; a backend may apply
    /// the activation as the up projection is stored (`up` then stays
    /// unused).
    #[allow(clippy::too_many_arguments)]
    fn gated_projection(
        &self,
        act: GatedActivation,
        x: &Self::Tensor,
        w_gate: &Self::Weight,
        w_up: &Self::Weight,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        self.matmul_many(
            x,
            &mut [
                Projection {
                    weight: w_gate,
                    bias: None,
                    out: gate,
                },
                Projection {
                    weight: w_up,
                    bias: None,
                    out: up,
                },
            ],
        );
        self.gated(act, gate, up, out);
    }

    /// Rotates a layer's queries and keys, rows at positions `pos0..`
    /// (`q_p` and `k_p` differ in their head counts only). The default
    /// runs [`Self::rope`] on each; a backend may do both in one pass.
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        pos0: usize,
        q_p: RopeParams,
        k_p: RopeParams,
    ) {
        self.rope(q, pos0, q_p);
        self.rope(k, pos0, k_p);
    }

    /// Appends a layer's `n` key and value rows to its caches at `row`.
    /// The default runs [`Self::copy_rows`] on each; a backend may do both
    /// in one pass.
    fn append_kv(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        k_cache: &mut Self::Tensor,
        v_cache: &mut Self::Tensor,
        row: usize,
        n: usize,
    ) {
        self.copy_rows(k, 0, k_cache, row, 0, n);
        self.copy_rows(v, 0, v_cache, row, 0, n);
    }

    /// `acc += x · Wᵀ`, a residual branch's output projection. The default
    /// computes the product in `scratch` and adds it; a backend may add it
    /// as the product is stored (the same sums: f32 addition commutes).
    fn matmul_accumulate(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        acc: &mut Self::Tensor,
        scratch: &mut Self::Tensor,
    ) {
        self.matmul(w, x, scratch);
        self.add(acc, scratch);
    }
    /// RMS norm of every `group`-wide slice of each row, times `weight` (length `group`).
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Weight,
        group: usize,
        eps: f32,
        out: &mut Self::Tensor,
    );
    /// In-place rotary embedding; row `i` has position `pos0 + i`.
    fn rope(&self, x: &mut Self::Tensor, pos0: usize, p: RopeParams);
    /// `out = act(gate) * up`.
    fn gated(
        &self,
        act: GatedActivation,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    );
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Tensor, s: f32);
    /// NaN becomes 0 and values beyond `±limit` (infinities included) are
    /// clamped to it.
    fn clamp_finite(&self, x: &mut Self::Tensor, limit: f32);
    /// Copies `n_rows` whole rows of `src` (from `src_row`) into `dst`
    /// at row `dst_row`, column `dst_col`. Used for KV appends, tap capture
    /// and row selection.
    fn copy_rows(
        &self,
        src: &Self::Tensor,
        src_row: usize,
        dst: &mut Self::Tensor,
        dst_row: usize,
        dst_col: usize,
        n_rows: usize,
    );
    /// Scaled-dot-product attention of `q` (`n x n_head*head_dim`) over the
    /// cached keys/values (`capacity x n_head_kv*head_dim`), grouped-query.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        mask: AttentionMask,
        p: AttentionParams,
        out: &mut Self::Tensor,
    );
    /// Grouped dynamic depthwise convolution over the rows of `x` (`n x d`),
    /// one block whose row `i` is time step `i`:
    /// `out[i][c] = Σ_t (base[s·T + t][c] + dynamic[i][(s·T + t)·d/G + c/G]) · x[i − t][c]`
    /// for `t < T`, with rows before 0 taken as zero (taps never leave the
    /// block). `base` is `2T x d`, `dynamic` is `n x 2T·d/G`.
    fn grouped_conv(
        &self,
        x: &Self::Tensor,
        base: &Self::Tensor,
        dynamic: &Self::Tensor,
        p: ConvParams,
        out: &mut Self::Tensor,
    );
    /// Index of the largest value of each row (first on ties).
    async fn argmax(&self, x: &Self::Tensor) -> Vec<u32>;

    /// Whether tensors live in host memory, so that [`Self::read`] is a
    /// plain copy. The speculative engine then chooses every token on the
    /// host, where a readback costs nothing.
    fn host_memory(&self) -> bool {
        false
    }

    /// The first error the device reported (a GPU's validation failure,
    /// out-of-memory or loss), after which its results mean nothing; it
    /// stays until the backend is dropped. Backends whose ops cannot fail
    /// this way return `None`. Generation checks it after every readback.
    fn device_error(&self) -> Option<BackendError> {
        None
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

    /// `x = cap · tanh(x / cap)` (final logit softcapping).
    fn softcap(&self, x: &mut Self::Tensor, cap: f32);

    /// The `k` largest values of each row of `x` (`n x cols`, `k <= cols`),
    /// best first and the smaller index first on ties (NaN counting as −∞),
    /// into `values` and their column indices as f32 into `ids` (both
    /// `n x k`). [`crate::host_ops::top_k`] is the reference.
    fn top_k(&self, x: &Self::Tensor, k: usize, values: &mut Self::Tensor, ids: &mut Self::Tensor);

    /// The repetition penalty, in place, on the rows of logits `x` (`n x
    /// vocab`): row `r` penalizes each distinct token among the last
    /// `last_n` of `history ++ batch[1..=r]`, as
    /// [`crate::sampling::penalize`] does (positive logits divided by
    /// `penalty`, the others multiplied). `batch` is column `col` of a
    /// verify batch of f32 ids (row 0 its anchor, the last of `history`);
    /// `None` for one row of logits. [`crate::host_ops::penalize_rows`] is
    /// the reference.
    fn penalize(
        &self,
        x: &mut Self::Tensor,
        history: &[u32],
        batch: Option<(&Self::Tensor, usize)>,
        penalty: f32,
        last_n: usize,
    );

    /// Seeded sampling of one token per row of logits `x` (`n x cols`), as
    /// f32 ids down column `col` of `out` from row `row`: row `r` draws
    /// [`sample_index`] over its candidates with the uniform
    /// [`seeded_uniform`]`(p.seed, counter + r)`. The candidates are the
    /// row's top-k ([`Self::top_k`], sorted) when `p.top_k > 0`, else the
    /// whole row in index order, where top-p does not apply: the draw
    /// follows [`crate::sampling::Sampler::distribution`] when
    /// [`crate::sampling::samples_on_device`] holds. `p.repeat_penalty` is
    /// ignored ([`Self::penalize`] applies it).
    /// [`crate::host_ops::sample_rows`] is the reference.
    ///
    /// [`sample_index`]: crate::sampling::sample_index
    /// [`seeded_uniform`]: crate::sampling::seeded_uniform
    fn sample_to(
        &self,
        x: &Self::Tensor,
        p: &SamplingParams,
        counter: u64,
        out: &mut Self::Tensor,
        row: usize,
        col: usize,
    );

    /// `out[r][c] += Σ_j w[j] · x[r][j·d + c]` for `d` = `out`'s columns, in
    /// order of `j`: a weighted sum of the `d`-wide column slices of `x`
    /// (`n x w.len()·d`), DFly's per-layer fusion of the raw taps.
    fn add_slices(&self, x: &Self::Tensor, w: &[f32], out: &mut Self::Tensor);

    /// DFlash2's greedy candidate-selector walk (spec §3.3) over one block of
    /// `n` rows with `K` candidates each, row 0 being the anchor's. Row
    /// `r >= 1` scores its candidates `c` after the predecessor `p` as
    /// `unary[r][c] + Σ_j (pred[p][j] · gates[r][j]) · succ[r·K + c][j]`
    /// and takes the best (first on ties); `p` is row 0 of `pred` (the
    /// anchor's codebook row) for `r = 1`, else `(r − 1)·K + best[r − 1]`.
    /// `cand[r][best]` (an f32 id) is written to `out[r][col]` for every
    /// `r >= 1`. `gates` is `n x R`, `pred` and `succ` are `n·K x R`,
    /// `unary` and `cand` `n x K`. [`crate::host_ops::selector_walk`] is the
    /// reference.
    #[allow(clippy::too_many_arguments)]
    fn selector_walk(
        &self,
        gates: &Self::Tensor,
        pred: &Self::Tensor,
        succ: &Self::Tensor,
        unary: &Self::Tensor,
        cand: &Self::Tensor,
        out: &mut Self::Tensor,
        col: usize,
    );

    /// [`Self::argmax`] of each row of `x`, written as f32 down column
    /// `col` of `out` from row `row`, without leaving the device: drafts and
    /// verify choices stay there until one readback per round. (Token ids
    /// are exact in f32 below 2^24.)
    fn argmax_to(&self, x: &Self::Tensor, out: &mut Self::Tensor, row: usize, col: usize);

    /// [`Self::embed`] of the ids in column 0 of rows `row0 .. row0 + n` of
    /// `ids` (as [`Self::argmax_to`] writes them), `n` being `out`'s rows.
    fn embed_from(
        &self,
        table: &Self::Weight,
        ids: &Self::Tensor,
        row0: usize,
        out: &mut Self::Tensor,
    );
}

#[cfg(test)]
mod tests {
    use super::{tensor_bytes, KvType, MemoryLimits};

    #[test]
    fn memory_limits_refuse_what_does_not_fit() {
        let shapes = [tensor_bytes(1000, 250, 4), tensor_bytes(10, 10, 4)]; // 1 MB + 400 B
        assert!(MemoryLimits::default().check("x", &shapes).is_ok());
        let roomy = MemoryLimits {
            available: Some(2_000_000),
            max_tensor: Some(1_000_000),
        };
        assert!(roomy.check("x", &shapes).is_ok());
        let small = MemoryLimits {
            available: Some(1_000_000),
            max_tensor: None,
        };
        let e = small.check("a context", &shapes).unwrap_err().to_string();
        assert!(e.contains("a context needs 1.0 MB"), "{e}");
        assert!(e.contains("the memory available is 1.0 MB"), "{e}");
        let narrow = MemoryLimits {
            available: None,
            max_tensor: Some(999_999),
        };
        assert!(narrow.check("x", &shapes).is_err());
        // Sizes beyond u64 saturate rather than wrap.
        let huge = [tensor_bytes(usize::MAX, usize::MAX, 4)];
        assert!(roomy.check("x", &huge).is_err());
        // An f16 cache takes half an f32 one's bytes.
        let kv = |ty: KvType| [tensor_bytes(1000, 500, ty.element_bytes())];
        assert!(roomy.check("x", &kv(KvType::F16)).is_ok());
        assert!(roomy.check("x", &kv(KvType::F32)).is_err());
    }
}
