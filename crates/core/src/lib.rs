//! The backend-independent engine: the [`backend::Backend`] trait, decoder
//! models driven by GGUF metadata, KV cache, hidden-state taps, sampling,
//! tokenizer and chat templates.

pub mod backend;
pub mod chat_template;
pub mod conformance;
pub mod engine;
pub mod error;
pub mod generate;
pub mod host_ops;
pub mod kv_cache;
pub mod model;
pub mod sampling;
pub mod speculative;
pub mod testing;
pub mod tokenizer;

pub use backend::Backend;
pub use error::ModelError;
