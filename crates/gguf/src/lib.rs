//! GGUF files: reading (from a memory map, a byte slice or a stream of chunks),
//! writing, and the ggml quantization formats.
//!
//! Everything here treats its input as untrusted: malformed files produce a
//! typed [`GgufError`] naming the file, key or tensor, never a panic, and no
//! allocation is sized from a length that was not first bounded by the bytes
//! actually left in the file.
//!
//! ```
//! use blockdraft_gguf::{GgmlType, GgufFile, GgufWriter};
//!
//! let mut w = GgufWriter::new();
//! w.add("general.architecture", "llama").add("llama.block_count", 2u32);
//! w.add_f32_tensor("token_embd.weight", &[4, 2], &[0.5; 8])?;
//! let file = GgufFile::from_bytes(w.to_bytes()?)?; // or GgufFile::open(path)
//!
//! let n_layers = file.metadata().get_u32("llama.block_count")?;
//! let emb = file.tensor_data("token_embd.weight")?; // zero-copy view
//! assert_eq!((n_layers, emb.ty(), emb.dims()), (2, GgmlType::F32, &[4u64, 2][..]));
//! assert_eq!(emb.to_f32()?, vec![0.5; 8]);
//! # Ok::<(), blockdraft_gguf::GgufError>(())
//! ```
//!
//! Tensor dims are in ggml order: `dims[0]` is the contiguous row length.
//! [`TensorData`] carries the type and dims along with the bytes, so it can
//! be decoded on its own; the [`quants`] module has the scalar reference
//! (de)quantizers that backend kernels are tested against.

mod error;
mod file;
mod parse;
pub mod quants;
mod split;
mod stream;
mod types;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError, Result};
pub use file::{GgufFile, TensorData};
pub use parse::{GgufHeader, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use split::{
    add_split_keys, check_split_set, parse_split_name, plan_split, split_name, split_part,
    split_paths, SplitInfo, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT,
};
pub use stream::{GgufStreamReader, StreamEnd, TensorChunk};
pub use types::GgmlType;
pub use value::{ArrayValue, Metadata, Value, ValueType};
pub use writer::GgufWriter;
