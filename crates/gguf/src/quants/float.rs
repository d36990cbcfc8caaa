//! Plain element types: F32, F16, BF16, F64 and the integer types.

use crate::GgmlType;

/// Converts `bytes` of a scalar type to f32. Lengths are checked by the caller.
pub(super) fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    macro_rules! conv {
        ($n:expr, $f:expr) => {
            for (c, o) in bytes.chunks_exact($n).zip(out.iter_mut()) {
                *o = $f(c.try_into().unwrap_or([0; $n]));
            }
        };
    }
    match ty {
        GgmlType::F32 => conv!(4, f32::from_le_bytes),
        GgmlType::F16 => conv!(2, |b| half::f16::from_le_bytes(b).to_f32()),
        GgmlType::BF16 => conv!(2, bf16_to_f32),
        GgmlType::F64 => conv!(8, |b| f64::from_le_bytes(b) as f32),
        GgmlType::I8 => conv!(1, |b: [u8; 1]| b[0] as i8 as f32),
        GgmlType::I16 => conv!(2, |b| i16::from_le_bytes(b) as f32),
        GgmlType::I32 => conv!(4, |b| i32::from_le_bytes(b) as f32),
        GgmlType::I64 => conv!(8, |b| i64::from_le_bytes(b) as f32),
        _ => unreachable!("float::dequantize called with block type"),
    }
}

/// bf16 is the top half of an f32: widening is exact.
#[inline]
pub fn bf16_to_f32(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

/// Rounds to bf16 (nearest even, NaN kept quiet), like ggml.
#[inline]
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    (h as u16).to_le_bytes()
}

/// Encodes f32 values as a scalar type (integers round to nearest and saturate).
pub(super) fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    macro_rules! conv {
        ($n:expr, $f:expr) => {
            for (c, &v) in out.chunks_exact_mut($n).zip(x) {
                c.copy_from_slice(&$f(v));
            }
        };
    }
    match ty {
        GgmlType::F32 => conv!(4, |v: f32| v.to_le_bytes()),
        GgmlType::F16 => conv!(2, |v| half::f16::from_f32(v).to_le_bytes()),
        GgmlType::BF16 => conv!(2, f32_to_bf16),
        GgmlType::F64 => conv!(8, |v: f32| (v as f64).to_le_bytes()),
        GgmlType::I8 => conv!(1, |v: f32| [(v.round() as i8) as u8]),
        GgmlType::I16 => conv!(2, |v: f32| (v.round() as i16).to_le_bytes()),
        GgmlType::I32 => conv!(4, |v: f32| (v.round() as i32).to_le_bytes()),
        GgmlType::I64 => conv!(8, |v: f32| (v.round() as i64).to_le_bytes()),
        _ => unreachable!("float::quantize called with block type"),
    }
}
