//! Scalar reference (de)quantization of the ggml block formats.

use crate::error::{GgufError, Result};
use crate::GgmlType;

/// Decodes `bytes` (whole blocks of `ty`) into `out`; `out.len()` must equal
/// the number of encoded elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let _ = (ty, bytes, out);
    Err(GgufError::UnsupportedType {
        what: "dequantize".into(),
        ty,
    })
}
