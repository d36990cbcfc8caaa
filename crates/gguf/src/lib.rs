//! GGUF files: reading (from a memory map, a byte slice or a stream of chunks),
//! writing, and the ggml quantization formats.
//!
//! Everything here treats its input as untrusted: malformed files produce a
//! typed [`GgufError`] naming the file, key or tensor, never a panic, and no
//! allocation is sized from a length that was not first bounded by the bytes
//! actually left in the file.

mod error;
mod file;
mod parse;
pub mod quants;
mod stream;
mod types;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError, Result};
pub use file::{GgufFile, TensorData};
pub use parse::{GgufHeader, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use stream::{GgufStreamReader, StreamEnd, TensorChunk};
pub use types::GgmlType;
pub use value::{ArrayValue, Metadata, Value, ValueType};
pub use writer::GgufWriter;
