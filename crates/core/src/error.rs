//! Errors of model loading and running.

use crate::backend::BackendError;
use blockdraft_gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("unsupported architecture `{0}` (supported: llama, qwen2, qwen3, gemma3, qwen35)")]
    UnsupportedArchitecture(String),
    /// A block drafter's file where a model belongs: it has no embeddings
    /// or head of its own and runs only beside its target.
    #[error("this file is a DFlash block drafter, not a model: load its target model and give this file as the drafter (`--draft` on the CLI, `drafter` in the npm package)")]
    DrafterAsModel,
    #[error("metadata `{key}`: {reason}")]
    InvalidMetadata { key: String, reason: String },
    #[error("tensor `{name}` is missing")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("context full: {needed} positions needed, the KV cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("{needed} positions exceed the model's trained context of {trained}")]
    ContextTooLong { needed: usize, trained: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("tap {layer} is beyond the model's {n_layer} layers")]
    TapOutOfRange { layer: usize, n_layer: usize },
    /// A drafter's file holds tensors that the variant it was detected as
    /// never reads: loading it would run the drafter as something it is not.
    #[error("DFlash drafter: the file holds {} that a {variant} drafter does not use (another variant's, stale or misnamed?); loading would silently ignore them", tensor_list(names))]
    UnusedTensors {
        variant: &'static str,
        names: Vec<String>,
    },
    #[error("the draft model's vocabulary ({drafter}) differs from the model's ({target}); use a drafter made for this model")]
    VocabularyMismatch { drafter: usize, target: usize },
    #[error("{0}")]
    Usage(String),
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory { what: String, bytes: u64 },
    /// Refused before allocating: more than the backend says it can hold.
    #[error(
        "not enough memory: {what} needs {:.1} MB, but {limit} is {:.1} MB",
        *.bytes as f64 / 1e6,
        *.available as f64 / 1e6
    )]
    MemoryLimit {
        what: String,
        bytes: u64,
        /// What bounds it: "the memory available", "the largest buffer".
        limit: &'static str,
        available: u64,
    },
}

/// "tensors `a`, `b` and 3 more": at most eight of `names`, by name.
fn tensor_list(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s = format!("tensor{} ", if names.len() == 1 { "" } else { "s" });
    let shown: Vec<String> = names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    s += &shown.join(", ");
    if names.len() > SHOWN {
        s += &format!(" and {} more", names.len() - SHOWN);
    }
    s
}

impl ModelError {
    pub fn invalid(key: String, reason: String) -> Self {
        ModelError::InvalidMetadata { key, reason }
    }
}
