//! Header parsing shared by the whole-file reader and the chunk stream.
//!
//! The parser works on a prefix of the file. When the prefix ends early it
//! reports how many bytes it needs ([`Halt::Need`]) if the file may still go
//! on, or a [`GgufError::Truncated`] when the file is known to be complete, so
//! the streaming reader can retry once more data arrived.

use std::collections::HashSet;

use crate::error::GgufError;
use crate::value::{ArrayValue, Metadata, Value, ValueType};
use crate::GgmlType;

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are rejected (bounds the recursion).
pub const MAX_NESTING: usize = 8;
/// Smallest possible encoded metadata entry: key length (8) + empty key
/// + type (4) + one-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Smallest possible tensor info: name length (8) + n_dims (4) + one dim (8)
/// + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;

/// Why parsing stopped.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The prefix is too short: at least this many bytes of file are needed.
    Need(u64),
    Err(GgufError),
}

impl From<GgufError> for Halt {
    fn from(e: GgufError) -> Halt {
        Halt::Err(e)
    }
}

type PResult<T> = Result<T, Halt>;

/// Description of one tensor from the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size of the tensor data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        // Checked at parse time; saturate for hand-built values.
        self.dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Number of rows: all elements divided by the row length `dims[0]`.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Byte range of this tensor within the data section.
    pub fn data_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.n_bytes)
    }
}

/// Everything before the data section (what [`crate::GgufStreamReader`]
/// yields once the header has arrived).
#[derive(Clone, Debug)]
pub struct GgufHeader {
    pub version: u32,
    /// `general.alignment`, default 32.
    pub alignment: u64,
    pub metadata: Metadata,
    /// Tensors in header order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl GgufHeader {
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Known or assumed upper bound of the file length. Lengths read from the
    /// file are checked against `limit - pos` before anything is allocated.
    limit: u64,
    /// `buf` is the whole file: running out is a hard truncation error.
    complete: bool,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], limit: u64, complete: bool) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            limit,
            complete,
        }
    }

    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.pos as u64)
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> PResult<&'a [u8]> {
        let end = (self.pos as u64)
            .checked_add(n)
            .ok_or_else(|| GgufError::Overflow { what: what() })?;
        if end <= self.buf.len() as u64 {
            let s = &self.buf[self.pos..end as usize];
            self.pos = end as usize;
            return Ok(s);
        }
        if self.complete || end > self.limit {
            return Err(Halt::Err(GgufError::Truncated {
                what: what(),
                needed: end,
                len: if self.complete {
                    self.buf.len() as u64
                } else {
                    self.limit
                },
            }));
        }
        Err(Halt::Need(end))
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> PResult<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> PResult<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> PResult<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed byte string, its length bounded by the bytes left.
    fn bytes(&mut self, what: &dyn Fn() -> String) -> PResult<&'a [u8]> {
        let len = self.u64(what)?;
        let remaining = self.remaining();
        if len > remaining {
            return Err(Halt::Err(GgufError::LengthTooLarge {
                what: what(),
                len,
                remaining,
            }));
        }
        self.take(len, what)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> PResult<String> {
        let b = self.bytes(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(Halt::Err(GgufError::InvalidUtf8 { what: what() })),
        }
    }

    /// Checks that `count` items of at least `min_size` bytes can fit in
    /// what is left of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &dyn Fn() -> String) -> PResult<()> {
        let remaining = self.remaining();
        match count.checked_mul(min_size) {
            Some(n) if n <= remaining => Ok(()),
            _ => Err(Halt::Err(GgufError::CountTooLarge {
                what: what(),
                count,
                remaining,
            })),
        }
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> PResult<ValueType> {
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| Halt::Err(GgufError::UnknownValueType { what: what(), id }))
    }

    fn bool(&mut self, what: &dyn Fn() -> String) -> PResult<bool> {
        match self.take(1, what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(Halt::Err(GgufError::InvalidBool {
                what: what(),
                value,
            })),
        }
    }

    fn value(&mut self, ty: ValueType, what: &dyn Fn() -> String, depth: usize) -> PResult<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth)?),
        })
    }

    fn array_value(&mut self, what: &dyn Fn() -> String, depth: usize) -> PResult<ArrayValue> {
        if depth >= MAX_NESTING {
            return Err(Halt::Err(GgufError::NestingTooDeep {
                what: what(),
                max: MAX_NESTING,
            }));
        }
        let ety = self.value_type(what)?;
        let n = self.u64(what)?;
        let elem = ety.min_encoded_size();
        self.check_count(n, elem, what)?;
        // `check_count` bounded n by the bytes left, so n fits in usize
        // whenever it is small enough to matter; fixed-size elements are read
        // from one slice.
        macro_rules! fixed {
            ($t:ty, $v:ident) => {{
                let raw = self.take(n * elem, what)?;
                ArrayValue::$v(
                    raw.chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            }};
        }
        Ok(match ety {
            ValueType::U8 => ArrayValue::U8(self.take(n, what)?.to_vec()),
            ValueType::I8 => ArrayValue::I8(self.take(n, what)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => fixed!(u16, U16),
            ValueType::I16 => fixed!(i16, I16),
            ValueType::U32 => fixed!(u32, U32),
            ValueType::I32 => fixed!(i32, I32),
            ValueType::U64 => fixed!(u64, U64),
            ValueType::I64 => fixed!(i64, I64),
            ValueType::F32 => fixed!(f32, F32),
            ValueType::F64 => fixed!(f64, F64),
            ValueType::Bool => {
                let raw = self.take(n, what)?;
                let mut out = Vec::with_capacity(raw.len());
                for &b in raw {
                    match b {
                        0 => out.push(false),
                        1 => out.push(true),
                        value => {
                            return Err(Halt::Err(GgufError::InvalidBool {
                                what: what(),
                                value,
                            }))
                        }
                    }
                }
                ArrayValue::Bool(out)
            }
            ValueType::String => {
                // Capacity bounded by what is already buffered, not by n.
                let cap = (n as usize).min((self.buf.len() - self.pos) / 8);
                let mut out = Vec::with_capacity(cap);
                for _ in 0..n {
                    out.push(self.string(what)?);
                }
                ArrayValue::String(out)
            }
            ValueType::Array => {
                let cap = (n as usize).min((self.buf.len() - self.pos) / 12);
                let mut out = Vec::with_capacity(cap);
                for _ in 0..n {
                    out.push(self.array_value(what, depth + 1)?);
                }
                ArrayValue::Array(out)
            }
        })
    }
}

/// Parses the header from a prefix `buf` of the file.
///
/// `limit` bounds the file length (the exact length when known); `complete`
/// says whether `buf` is the whole file.
pub(crate) fn parse_header(buf: &[u8], limit: u64, complete: bool) -> PResult<GgufHeader> {
    let mut c = Cursor::new(buf, limit, complete);
    let magic: [u8; 4] = c.array(&|| "magic".to_string())?;
    if magic != MAGIC {
        return Err(Halt::Err(GgufError::BadMagic { found: magic }));
    }
    let version = c.u32(&|| "version".to_string())?;
    if version != 2 && version != 3 {
        // A byte-swapped 2 or 3 means a big-endian v3 file.
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(Halt::Err(GgufError::BigEndian));
        }
        return Err(Halt::Err(GgufError::UnsupportedVersion { version }));
    }
    let n_tensors = c.u64(&|| "tensor count".to_string())?;
    let n_kv = c.u64(&|| "metadata count".to_string())?;
    c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, &|| {
        "tensor count".to_string()
    })?;
    c.check_count(n_kv, MIN_KV_BYTES, &|| "metadata count".to_string())?;
    // Both counts together must fit too.
    let min_total = n_tensors.checked_mul(MIN_TENSOR_INFO_BYTES).and_then(|a| {
        n_kv.checked_mul(MIN_KV_BYTES)
            .and_then(|b| a.checked_add(b))
    });
    if min_total.is_none_or(|t| t > c.remaining()) {
        return Err(Halt::Err(GgufError::CountTooLarge {
            what: "tensor + metadata count".to_string(),
            count: n_tensors.saturating_add(n_kv),
            remaining: c.remaining(),
        }));
    }

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata key \"{key}\"");
        let ty = c.value_type(&what)?;
        let value = c.value(ty, &what, 0)?;
        metadata.insert(key.clone(), value)?;
    }

    let alignment = alignment_of(&metadata)?;

    let cap = (n_tensors as usize).min(buf.len().saturating_sub(c.pos) / 32 + 1);
    let mut tensors = Vec::with_capacity(cap);
    let mut names = HashSet::with_capacity(cap);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let what = || format!("tensor \"{name}\"");
        let n_dims = c.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(Halt::Err(GgufError::BadDims {
                tensor: name,
                n_dims,
            }));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let ty_id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let Some(ty) = GgmlType::from_id(ty_id) else {
            return Err(Halt::Err(GgufError::UnknownTensorType {
                tensor: name,
                id: ty_id,
            }));
        };
        let n_bytes = tensor_bytes(&name, &dims, ty)?;
        if !names.insert(name.clone()) {
            return Err(Halt::Err(GgufError::DuplicateTensor { tensor: name }));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_bytes,
        });
    }

    let header_end = c.pos();
    let data_offset = align_up(header_end, alignment).ok_or_else(|| GgufError::Overflow {
        what: "data section offset".to_string(),
    })?;
    Ok(GgufHeader {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}

/// Byte size of a tensor, checking the shape (ggml `ne` are int64 and the row
/// length must be a whole number of blocks).
pub(crate) fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let bad = |reason: &str| GgufError::BadShape {
        tensor: name.to_string(),
        dims: dims.to_vec(),
        reason: reason.to_string(),
    };
    if dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(bad("dimension exceeds i64::MAX"));
    }
    let n = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::Overflow {
            what: format!("tensor \"{name}\" element count"),
        })?;
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_len() as u64 != 0 {
        return Err(bad(&format!(
            "row length is not a multiple of the {} block size {}",
            ty,
            ty.block_len()
        )));
    }
    ty.bytes_for(n).ok_or_else(|| GgufError::Overflow {
        what: format!("tensor \"{name}\" byte size"),
    })
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    let mask = alignment - 1;
    x.checked_add(mask).map(|v| v & !mask)
}

/// Checks tensor placement: aligned offsets, no overlaps, and (when the data
/// section length is known) everything in bounds.
pub(crate) fn validate_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_len: Option<u64>,
) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let end = t
            .offset
            .checked_add(t.n_bytes)
            .ok_or_else(|| GgufError::Overflow {
                what: format!("tensor \"{}\" data range", t.name),
            })?;
        if let Some(data_len) = data_len {
            if end > data_len {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    end,
                    data_len,
                });
            }
        }
    }
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].n_bytes));
    let mut prev: Option<&TensorInfo> = None;
    for &i in &order {
        let t = &tensors[i];
        if t.n_bytes == 0 {
            continue;
        }
        if let Some(p) = prev {
            // Both ranges are overflow-checked above.
            if p.offset + p.n_bytes > t.offset {
                return Err(GgufError::OverlappingTensors {
                    first: p.name.clone(),
                    second: t.name.clone(),
                });
            }
        }
        prev = Some(t);
    }
    Ok(())
}

/// The data alignment `metadata` declares (`general.alignment`), or the
/// default; it must be an unsigned power of two.
pub(crate) fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(v) = metadata.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = v
        .as_int()
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| GgufError::WrongType {
            key: ALIGNMENT_KEY.to_string(),
            expected: "unsigned integer",
            found: v.type_description(),
        })?;
    if !a.is_power_of_two() {
        return Err(GgufError::BadAlignment { value: a });
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn align_up_is_checked() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(33, 32), Some(64));
        assert_eq!(align_up(u64::MAX - 3, 32), None);
    }

    #[test]
    fn tensor_bytes_checks_shape() {
        assert_eq!(tensor_bytes("t", &[256, 2], GgmlType::Q4_K).unwrap(), 288);
        let kind = |r: Result<u64, GgufError>| r.unwrap_err().kind();
        assert_eq!(
            kind(tensor_bytes("t", &[100], GgmlType::Q4_K)),
            ErrorKind::BadShape
        );
        assert_eq!(
            kind(tensor_bytes("t", &[1 << 40, 1 << 40], GgmlType::F32)),
            ErrorKind::Overflow
        );
        assert_eq!(
            kind(tensor_bytes("t", &[u64::MAX], GgmlType::F32)),
            ErrorKind::BadShape
        );
    }

    #[test]
    fn partial_prefix_asks_for_more() {
        // Incomplete prefix of an unknown-length stream: Need, not an error.
        match parse_header(b"GGUF\x03\0", u64::MAX, false) {
            Err(Halt::Need(8)) => {}
            other => panic!("{other:?}"),
        }
        match parse_header(b"GGUF\x03\0", 6, true) {
            Err(Halt::Err(e)) => assert_eq!(e.kind(), ErrorKind::Truncated),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn layout_rejects_overlap_but_allows_empty_tensors() {
        let t = |name: &str, offset, n_bytes| TensorInfo {
            name: name.into(),
            dims: vec![n_bytes / 4],
            ty: GgmlType::F32,
            offset,
            n_bytes,
        };
        assert!(validate_layout(&[t("a", 0, 64), t("b", 64, 32)], 32, Some(96)).is_ok());
        assert!(validate_layout(&[t("a", 0, 64), t("e", 32, 0)], 32, Some(64)).is_ok());
        let e = validate_layout(&[t("a", 0, 64), t("b", 32, 32)], 32, Some(96)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OverlappingTensors);
        let e = validate_layout(&[t("a", 0, 64)], 32, Some(63)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TensorOutOfBounds);
    }
}
