//! GGUF files: reading (from a memory map, a byte slice or a stream of chunks),
//! writing, and the ggml quantization formats.

mod types;

pub use types::GgmlType;
