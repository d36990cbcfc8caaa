//! The backend-independent engine: the [`backend::Backend`] trait, decoder
//! models driven by GGUF metadata, KV cache, hidden-state taps, sampling,
//! tokenizer and chat templates.

pub mod tokenizer;
