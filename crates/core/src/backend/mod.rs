//! The backend traits: the kernels an LLM needs, and nothing more.
//!
//! Each backend (CPU, wgpu, CUDA) implements them in its own crate and all
//! model code is generic over [`Backend`]. Tensors are backend handles
//! holding row-major f32 matrices; weights stay in their GGUF type on the
//! device. The ops are grouped by family, one trait each:
//!
//! - [`Device`]: tensors, weights, transfers, errors and limits;
//! - [`ElementwiseOps`]: norms, rotary embedding, activations, row copies;
//! - [`LinearOps`]: embeddings and matrix products;
//! - [`AttentionOps`]: the KV cache's appends and attention;
//! - [`SamplingOps`]: choosing tokens from logits;
//! - [`HybridOps`]: the recurrent and gated blocks of hybrid models;
//! - [`DrafterOps`]: what only some drafter variants use.
//!
//! A family's fused or rare ops have default compositions of the basic ones
//! (a backend overrides them for speed), so a new backend runs every model
//! and drafter once it has the basic ops. Ops record work; the read-backs
//! (`read`, `argmax`) are `async` because they synchronize: in the browser
//! a readback is a `mapAsync` that only completes once JS's event loop
//! runs. Their futures need not be `Send` (wasm's are not); native callers
//! block on them.

mod attention;
pub mod composed;
mod device;
mod drafter;
mod elementwise;
mod hybrid;
mod linear;
mod sampling;
mod types;

pub use attention::{attention_step_by_parts, AttentionOps};
pub use device::Device;
pub use drafter::DrafterOps;
pub use elementwise::ElementwiseOps;
pub use hybrid::HybridOps;
pub use linear::{norm_rows, LinearOps};
pub use sampling::SamplingOps;
pub use types::*;

/// Errors a backend reports.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend does not support {what}")]
    Unsupported { what: String },
    #[error("tensor `{name}`: {reason}")]
    BadWeight { name: String, reason: String },
    #[error("{op}: tensor shapes do not agree ({detail})")]
    Shape { op: &'static str, detail: String },
    #[error("device: {0}")]
    Device(String),
}

/// Every op family: what model code asks of a backend. Implement the
/// families and this follows.
pub trait Backend:
    Device + ElementwiseOps + LinearOps + AttentionOps + SamplingOps + DrafterOps + HybridOps
{
}

impl<B> Backend for B where
    B: Device + ElementwiseOps + LinearOps + AttentionOps + SamplingOps + DrafterOps + HybridOps
{
}

/// Fails with the device's error ([`Device::device_error`]), if any.
pub fn check_device<B: Device + ?Sized>(be: &B) -> Result<(), BackendError> {
    be.device_error().map_or(Ok(()), Err)
}

/// Runs `op`, a default composition on the host, and records its error on
/// `be` (ops return nothing; [`Device::device_error`] reports it).
pub(crate) fn record<B: Device + ?Sized>(be: &B, op: impl FnOnce() -> Result<(), BackendError>) {
    if let Err(e) = op() {
        be.record_error(e);
    }
}

/// `Ok` when `ok`, else the [`BackendError::Shape`] of `op`.
pub(crate) fn shapes_agree(
    ok: bool,
    op: &'static str,
    detail: impl FnOnce() -> String,
) -> Result<(), BackendError> {
    if ok {
        Ok(())
    } else {
        Err(BackendError::Shape {
            op,
            detail: detail(),
        })
    }
}

/// Every backend trait, for code that calls ops on a concrete backend
/// type (generic code needs only [`Backend`]):
/// `use blockdraft_core::backend::prelude::*;`.
pub mod prelude {
    pub use super::{
        AttentionOps, Backend, Device, DrafterOps, ElementwiseOps, HybridOps, LinearOps,
        SamplingOps,
    };
}
