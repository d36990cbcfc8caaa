//! GGUF writer: metadata of every value type and tensors of any ggml type.
//!
//! Used for tests, fixtures and small converted models; everything is held in
//! memory until written.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::parse::{align_up, tensor_bytes, ALIGNMENT_KEY, MAGIC};
use crate::value::{ArrayValue, Metadata, Value};
use crate::GgmlType;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file (v3 by default).
///
/// Tensors are laid out in insertion order, each at an offset that is a
/// multiple of the alignment (`general.alignment` if set, else 32).
#[derive(Debug)]
pub struct GgufWriter {
    version: u32,
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            metadata: Metadata::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// GGUF version to write: 2 or 3 (same layout for little-endian files).
    pub fn set_version(&mut self, version: u32) -> Result<&mut Self> {
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version });
        }
        self.version = version;
        Ok(self)
    }

    /// Sets `general.alignment` (stored as u32, as llama.cpp expects).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                value: alignment as u64,
            });
        }
        self.metadata.set(ALIGNMENT_KEY, alignment);
        Ok(self)
    }

    /// Adds or replaces a metadata key (keeps first-insertion order).
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        self.metadata.set(key, value);
        self
    }

    /// Copies every entry of `metadata`.
    pub fn add_all(&mut self, metadata: &Metadata) -> &mut Self {
        for (k, v) in metadata.iter() {
            self.metadata.set(k, v.clone());
        }
        self
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Adds a tensor from its raw encoded bytes (ggml order dims).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Vec<u8>>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let data = data.into();
        if dims.is_empty() || dims.len() > 4 {
            return Err(GgufError::BadDims {
                tensor: name,
                n_dims: dims.len() as u32,
            });
        }
        let n_bytes = tensor_bytes(&name, dims, ty)?;
        if n_bytes != data.len() as u64 {
            return Err(GgufError::BadLength {
                what: format!("tensor \"{name}\" data"),
                expected: n_bytes,
                found: data.len() as u64,
            });
        }
        if !self.names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor { tensor: name });
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// Adds an F32 tensor.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
    ) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, bytes)
    }

    fn alignment(&self) -> Result<u64> {
        crate::parse::alignment_of(&self.metadata)
    }

    /// Writes the file.
    pub fn write_to<W: Write>(&self, mut w: W) -> Result<()> {
        let alignment = self.alignment()?;
        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = align_up(offset + t.data.len() as u64, alignment).ok_or_else(|| {
                GgufError::Overflow {
                    what: "data section size".to_string(),
                }
            })?;
        }
        let data_start =
            align_up(head.len() as u64, alignment).ok_or_else(|| GgufError::Overflow {
                what: "data section offset".to_string(),
            })?;
        head.resize(data_start as usize, 0);
        w.write_all(&head)?;
        let mut pos = 0u64;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            write_zeros(&mut w, off - pos)?;
            w.write_all(&t.data)?;
            pos = off + t.data.len() as u64;
        }
        // Pad the end so the data section is a multiple of the alignment,
        // like ggml's writer does.
        write_zeros(&mut w, offset - pos)?;
        w.flush()?;
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let run = || -> Result<()> {
            let f = std::fs::File::create(path)?;
            let mut w = std::io::BufWriter::new(f);
            self.write_to(&mut w)?;
            w.flush()?;
            Ok(())
        };
        run().map_err(|e| e.in_file(Some(path)))
    }
}

impl std::fmt::Debug for PendingTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {} ({} bytes)",
            self.name,
            self.dims,
            self.ty,
            self.data.len()
        )
    }
}

fn write_zeros<W: Write>(w: &mut W, n: u64) -> Result<()> {
    const Z: [u8; 256] = [0; 256];
    let mut n = n;
    while n > 0 {
        let k = n.min(Z.len() as u64) as usize;
        w.write_all(&Z[..k])?;
        n -= k as u64;
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Encodes a value without its type tag.
pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &ArrayValue) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        ArrayValue::U8(v) => out.extend_from_slice(v),
        ArrayValue::I8(v) => le!(v),
        ArrayValue::U16(v) => le!(v),
        ArrayValue::I16(v) => le!(v),
        ArrayValue::U32(v) => le!(v),
        ArrayValue::I32(v) => le!(v),
        ArrayValue::U64(v) => le!(v),
        ArrayValue::I64(v) => le!(v),
        ArrayValue::F32(v) => le!(v),
        ArrayValue::F64(v) => le!(v),
        ArrayValue::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        ArrayValue::String(v) => {
            for s in v {
                put_str(out, s);
            }
        }
        ArrayValue::Array(v) => {
            for inner in v {
                put_array(out, inner);
            }
        }
    }
}
