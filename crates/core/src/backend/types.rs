//! The plain data the backend traits take: shapes, parameters, limits and
//! counters.

use super::Device;
use blockdraft_gguf::{GgmlType, TensorData};

/// What a backend can hold ([`Device::memory_limits`]); `None` where it
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
/// memory and what attention reads at depth; with it the CPU backend's
/// attention follows llama.cpp's default configuration (f16 cache, flash
/// attention) bit for bit, so the CLI and the browser package use it unless told
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
    pub role: WeightRole,
}

/// Whose weight it is, which decides how exactly its products must follow
/// the reference float sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightRole {
    /// The target's (or a model's run on its own): its logits are the
    /// output, so a backend keeps the sequences it documents (on the CPU,
    /// llama.cpp's unless asked for its fast kernels).
    #[default]
    Target,
    /// A drafter's or draft model's: its products only propose tokens the
    /// target verifies, so a backend may run them in a faster float
    /// sequence of its own (the output does not change; acceptance moves
    /// only by rounding).
    Proposer,
}

impl WeightSource<'_> {
    /// `BackendError::BadWeight` naming this tensor.
    pub fn error(&self, reason: impl Into<String>) -> super::BackendError {
        super::BackendError::BadWeight {
            name: self.name.to_string(),
            reason: reason.into(),
        }
    }

    /// `(rows, cols)` after the checks every backend makes before trusting
    /// a file's tensor: a vector or a matrix, dimensions that fit `usize`,
    /// rows of whole blocks of its type, and exactly the bytes that shape
    /// takes (a vector is one row).
    pub fn checked_shape(&self) -> Result<(usize, usize), super::BackendError> {
        let (cols, rows) = match *self.dims {
            [c] => (c, 1),
            [c, r] => (c, r),
            _ => {
                return Err(self.error(format!(
                    "{} dimensions; only vectors and matrices are used",
                    self.dims.len()
                )))
            }
        };
        let too_large = || self.error("too large");
        let (rows_n, cols_n) = (
            usize::try_from(rows).map_err(|_| too_large())?,
            usize::try_from(cols).map_err(|_| too_large())?,
        );
        if cols == 0 || cols % self.ty.block_len() as u64 != 0 {
            return Err(self.error(format!(
                "row length {cols} is not a positive multiple of the {} block size {}",
                self.ty,
                self.ty.block_len()
            )));
        }
        let expected = (self.ty.bytes_for(cols))
            .and_then(|row| row.checked_mul(rows))
            .ok_or_else(too_large)?;
        if self.data.len() as u64 != expected {
            return Err(self.error(format!(
                "{} bytes of data, expected {expected}",
                self.data.len()
            )));
        }
        Ok((rows_n, cols_n))
    }
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
/// ([`Device::take_kernel_timings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelTiming {
    pub kernel: String,
    pub dispatches: u64,
    pub gpu_ns: u64,
    /// Bytes of the buffer ranges its dispatches bound: an upper bound of
    /// what they moved (a KV cache is bound whole, read in part).
    pub bytes_bound: u64,
}

/// A layer's attention step ([`super::AttentionOps::attention_step`]) for
/// the rows of `q` at positions `mask.q_pos0 ..`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionStep {
    pub q_rope: RopeParams,
    pub k_rope: RopeParams,
    /// A factor for the rotated queries (Gemma scales them before
    /// attention rather than the scores).
    pub q_scale: Option<f32>,
    pub mask: AttentionMask,
    pub params: AttentionParams,
}

/// One projection of [`super::LinearOps::matmul_many`].
pub struct Projection<'a, B: Device + ?Sized> {
    pub weight: &'a B::Weight,
    pub bias: Option<&'a B::Weight>,
    pub out: &'a mut B::Tensor,
}

/// The RMS norm of whole rows that feeds the projections of
/// [`super::LinearOps::normed_matmul_many`] and
/// [`super::LinearOps::normed_gated_projection`]: `out = rms_norm(x) ·
/// weight`, kept in `out` (the projections' input) as
/// [`super::ElementwiseOps::rms_norm`] writes it.
///
/// With `pending`, the previous residual branch's output goes into `x`
/// first, through its post-norm, so that a backend may do both in the
/// norm's pass.
pub struct RowNorm<'a, B: Device + ?Sized> {
    pub weight: &'a B::Weight,
    pub eps: f32,
    pub out: &'a mut B::Tensor,
    pub pending: Option<PendingBranch<'a, B>>,
}

/// A residual branch's output not yet added to the residual stream `x`
/// (Gemma 3's post-norms): `x += rms_norm(output) · post_norm`, as
/// [`super::ElementwiseOps::add_normed`] adds it.
pub struct PendingBranch<'a, B: Device + ?Sized> {
    pub output: &'a B::Tensor,
    pub post_norm: &'a B::Weight,
    pub eps: f32,
}

/// Per-head RMS norms of a layer's queries and keys before their rotation
/// (Qwen3, Gemma 3) in [`super::AttentionOps::attention_step`]: weights of
/// `head_dim` values, and tensors of the queries' and keys' shapes a
/// backend may normalize into.
pub struct HeadNorms<'a, B: Device + ?Sized> {
    pub q_weight: &'a B::Weight,
    pub k_weight: &'a B::Weight,
    pub eps: f32,
    pub q_out: &'a mut B::Tensor,
    pub k_out: &'a mut B::Tensor,
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

#[cfg(test)]
mod tests {
    use super::{tensor_bytes, KvType, MemoryLimits, WeightRole, WeightSource};
    use blockdraft_gguf::{GgmlType, TensorData};

    #[test]
    fn weight_shapes_are_checked_before_a_backend_trusts_them() {
        let q8 = |dims: &[u64], data_dims: Vec<u64>| {
            let n: u64 = data_dims.iter().product();
            let bytes = vec![0u8; GgmlType::Q8_0.bytes_for(n).unwrap() as usize];
            let data = TensorData::from_vec(GgmlType::Q8_0, data_dims, bytes).unwrap();
            let src = WeightSource {
                name: "w",
                ty: GgmlType::Q8_0,
                dims,
                data,
                role: WeightRole::Target,
            };
            src.checked_shape().map_err(|e| e.to_string())
        };
        assert_eq!(q8(&[64, 3], vec![64, 3]), Ok((3, 64)));
        assert_eq!(q8(&[64], vec![64]), Ok((1, 64)));
        let err = |r: Result<(usize, usize), String>| r.unwrap_err();
        assert!(err(q8(&[64, 3, 2], vec![64, 6])).contains("3 dimensions"));
        assert!(err(q8(&[48, 2], vec![96])).contains("row length 48 is not a positive multiple"));
        assert!(err(q8(&[0, 2], vec![32])).contains("row length 0"));
        assert!(err(q8(&[64, 4], vec![64, 3])).contains("204 bytes of data, expected 272"));
        assert!(err(q8(&[64, u64::MAX], vec![64])).starts_with("tensor `w`"));
    }

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

/// Sizes of one gated-DeltaNet block for [`super::HybridOps::gated_delta_rule`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetParams {
    /// Query and key heads; value head `j` reads key head `j mod n_k_heads`.
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Width of a query/key head: columns of a head's state.
    pub k_dim: usize,
    /// Width of a value head: rows of a head's state.
    pub v_dim: usize,
    /// Floor of the L2 norm of queries and keys.
    pub eps: f32,
}

impl DeltaNetParams {
    /// Columns of the rule's input rows: queries, keys, values.
    pub fn input_dim(&self) -> usize {
        2 * self.n_k_heads * self.k_dim + self.n_v_heads * self.v_dim
    }

    /// `(rows, cols)` of the state of all heads: head `h`'s `k_dim x v_dim`
    /// matrix `S` (key index by value index) is rows `h·k_dim..`, so that
    /// a key's row runs over the value columns that vectors (CPU lanes, GPU
    /// invocations) share.
    pub fn state_shape(&self) -> (usize, usize) {
        (self.n_v_heads * self.k_dim, self.v_dim)
    }
}
