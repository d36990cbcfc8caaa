//! Metadata values and the ordered key → value map with typed getters.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::{GgufError, Result};

/// The on-disk id of a metadata value type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Encoded size for fixed-size types; the minimum encoded size otherwise
    /// (a string is at least its 8-byte length, an array its type + count).
    /// Used to bound counts by the bytes left in the file before allocating.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value.
///
/// Arrays are typed ([`ArrayValue`]): a 262k-entry token list is one
/// `Vec<String>` and a score list one `Vec<f32>`, not 262k tagged enums.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(ArrayValue),
}

/// A homogeneous metadata array (GGUF arrays have one element type).
///
/// `Debug` shows at most 8 elements, so printing a file's metadata does not
/// dump a whole vocabulary.
#[derive(Clone, PartialEq)]
pub enum ArrayValue {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Array of arrays (each inner array may have its own element type).
    Array(Vec<ArrayValue>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Human-readable type, e.g. `u32` or `array<string>`, for error messages.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array<{}>", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer value, widened to i128 so every source type fits.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&ArrayValue> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl ArrayValue {
    pub fn elem_type(&self) -> ValueType {
        match self {
            ArrayValue::U8(_) => ValueType::U8,
            ArrayValue::I8(_) => ValueType::I8,
            ArrayValue::U16(_) => ValueType::U16,
            ArrayValue::I16(_) => ValueType::I16,
            ArrayValue::U32(_) => ValueType::U32,
            ArrayValue::I32(_) => ValueType::I32,
            ArrayValue::U64(_) => ValueType::U64,
            ArrayValue::I64(_) => ValueType::I64,
            ArrayValue::F32(_) => ValueType::F32,
            ArrayValue::F64(_) => ValueType::F64,
            ArrayValue::Bool(_) => ValueType::Bool,
            ArrayValue::String(_) => ValueType::String,
            ArrayValue::Array(_) => ValueType::Array,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ArrayValue::U8(v) => v.len(),
            ArrayValue::I8(v) => v.len(),
            ArrayValue::U16(v) => v.len(),
            ArrayValue::I16(v) => v.len(),
            ArrayValue::U32(v) => v.len(),
            ArrayValue::I32(v) => v.len(),
            ArrayValue::U64(v) => v.len(),
            ArrayValue::I64(v) => v.len(),
            ArrayValue::F32(v) => v.len(),
            ArrayValue::F64(v) => v.len(),
            ArrayValue::Bool(v) => v.len(),
            ArrayValue::String(v) => v.len(),
            ArrayValue::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a scalar [`Value`] (clones strings / inner arrays).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            ArrayValue::U8(v) => Value::U8(*v.get(i)?),
            ArrayValue::I8(v) => Value::I8(*v.get(i)?),
            ArrayValue::U16(v) => Value::U16(*v.get(i)?),
            ArrayValue::I16(v) => Value::I16(*v.get(i)?),
            ArrayValue::U32(v) => Value::U32(*v.get(i)?),
            ArrayValue::I32(v) => Value::I32(*v.get(i)?),
            ArrayValue::U64(v) => Value::U64(*v.get(i)?),
            ArrayValue::I64(v) => Value::I64(*v.get(i)?),
            ArrayValue::F32(v) => Value::F32(*v.get(i)?),
            ArrayValue::F64(v) => Value::F64(*v.get(i)?),
            ArrayValue::Bool(v) => Value::Bool(*v.get(i)?),
            ArrayValue::String(v) => Value::String(v.get(i)?.clone()),
            ArrayValue::Array(v) => Value::Array(v.get(i)?.clone()),
        })
    }

    /// Integer elements widened to i128 (None for non-integer arrays).
    fn ints(&self) -> Option<Vec<i128>> {
        fn w<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            ArrayValue::U8(v) => w(v),
            ArrayValue::I8(v) => w(v),
            ArrayValue::U16(v) => w(v),
            ArrayValue::I16(v) => w(v),
            ArrayValue::U32(v) => w(v),
            ArrayValue::I32(v) => w(v),
            ArrayValue::U64(v) => w(v),
            ArrayValue::I64(v) => w(v),
            _ => return None,
        })
    }
}

impl std::fmt::Debug for ArrayValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn show<T: std::fmt::Debug>(
            f: &mut std::fmt::Formatter<'_>,
            ty: &str,
            v: &[T],
        ) -> std::fmt::Result {
            write!(f, "{ty}[")?;
            for (i, x) in v.iter().take(8).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{x:?}")?;
            }
            if v.len() > 8 {
                write!(f, ", … ({} total)", v.len())?;
            }
            f.write_str("]")
        }
        match self {
            ArrayValue::U8(v) => show(f, "u8", v),
            ArrayValue::I8(v) => show(f, "i8", v),
            ArrayValue::U16(v) => show(f, "u16", v),
            ArrayValue::I16(v) => show(f, "i16", v),
            ArrayValue::U32(v) => show(f, "u32", v),
            ArrayValue::I32(v) => show(f, "i32", v),
            ArrayValue::U64(v) => show(f, "u64", v),
            ArrayValue::I64(v) => show(f, "i64", v),
            ArrayValue::F32(v) => show(f, "f32", v),
            ArrayValue::F64(v) => show(f, "f64", v),
            ArrayValue::Bool(v) => show(f, "bool", v),
            ArrayValue::String(v) => show(f, "string", v),
            ArrayValue::Array(v) => show(f, "array", v),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value { fn from(x: $t) -> Value { Value::$v(x) } }
        impl From<Vec<$t>> for Value { fn from(x: Vec<$t>) -> Value { Value::Array(ArrayValue::$v(x)) } }
        impl From<Vec<$t>> for ArrayValue { fn from(x: Vec<$t>) -> ArrayValue { ArrayValue::$v(x) } }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}
impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(ArrayValue::String(
            v.into_iter().map(str::to_string).collect(),
        ))
    }
}
impl From<ArrayValue> for Value {
    fn from(a: ArrayValue) -> Value {
        Value::Array(a)
    }
}

/// Ordered metadata: keys keep their file order, lookups are hashed.
///
/// Getters return [`GgufError::MissingKey`] / [`GgufError::WrongType`] naming
/// the key (and the file, when known), so model loaders can use `?` directly.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    path: Option<Arc<Path>>,
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    pub(crate) fn set_path(&mut self, path: Option<Arc<Path>>) {
        self.path = path;
    }

    /// Appends a key; a duplicate key is an error (GGUF keys are unique).
    pub fn insert(&mut self, key: String, value: Value) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Sets a key, replacing an existing value in place.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    fn err(&self, e: GgufError) -> GgufError {
        e.in_file(self.path.as_deref())
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> GgufError {
        self.err(GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_description(),
        })
    }

    /// The value of a key that must be present.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| {
            self.err(GgufError::MissingKey {
                key: key.to_string(),
            })
        })
    }

    fn int_in<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| self.wrong(key, expected, v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int_in(key, "integer in u32 range")
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int_in(key, "integer in u64 range")
    }

    /// Any integer type whose value fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.int_in(key, "integer in i32 range")
    }

    /// Any integer type whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int_in(key, "integer in i64 range")
    }

    /// Any integer type whose value fits in usize.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.int_in(key, "integer in usize range")
    }

    /// f32 or f64 (narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => Err(self.wrong(key, "f32 or f64", v)),
        }
    }

    /// f32 or f64.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            Value::F32(x) => Ok(*x as f64),
            Value::F64(x) => Ok(*x),
            v => Err(self.wrong(key, "f32 or f64", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.wrong(key, "bool", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&ArrayValue> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, "array", v))
    }

    /// Array of strings, borrowed (no copies of the strings).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        Ok(self
            .get_string_slice(key)?
            .iter()
            .map(String::as_str)
            .collect())
    }

    /// Array of strings as the stored slice.
    pub fn get_string_slice(&self, key: &str) -> Result<&[String]> {
        let v = self.require(key)?;
        match v {
            Value::Array(ArrayValue::String(s)) => Ok(s),
            v => Err(self.wrong(key, "array<string>", v)),
        }
    }

    /// Array of any integer type whose every element fits in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.int_array(key, "array of integers in i32 range")
    }

    /// Array of any integer type whose every element fits in u32.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        self.int_array(key, "array of integers in u32 range")
    }

    /// Array of any integer type whose every element fits in u64.
    pub fn get_u64_array(&self, key: &str) -> Result<Vec<u64>> {
        self.int_array(key, "array of integers in u64 range")
    }

    fn int_array<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<Vec<T>> {
        let v = self.require(key)?;
        let ints = match v {
            Value::Array(a) => a.ints(),
            _ => None,
        };
        ints.and_then(|ints| {
            ints.into_iter()
                .map(|i| T::try_from(i).ok())
                .collect::<Option<Vec<T>>>()
        })
        .ok_or_else(|| self.wrong(key, expected, v))
    }

    /// Array of f32 or f64 (narrowed).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        match self.require(key)? {
            Value::Array(ArrayValue::F32(v)) => Ok(v.clone()),
            Value::Array(ArrayValue::F64(v)) => Ok(v.iter().map(|&x| x as f32).collect()),
            v => Err(self.wrong(key, "array<f32>", v)),
        }
    }

    /// Borrowed f32 array (only when stored as f32).
    pub fn get_f32_slice(&self, key: &str) -> Result<&[f32]> {
        match self.require(key)? {
            Value::Array(ArrayValue::F32(v)) => Ok(v),
            v => Err(self.wrong(key, "array<f32>", v)),
        }
    }
}

macro_rules! optional_getters {
    ($($opt:ident => $get:ident -> $t:ty),* $(,)?) => {
        impl Metadata {$(
            #[doc = concat!("Like [`Metadata::", stringify!($get), "`] but `Ok(None)` when the key is absent; a present key of the wrong type is still an error.")]
            pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
                if self.contains_key(key) { self.$get(key).map(Some) } else { Ok(None) }
            }
        )*}
    };
}

optional_getters!(
    opt_u32 => get_u32 -> u32,
    opt_u64 => get_u64 -> u64,
    opt_i32 => get_i32 -> i32,
    opt_i64 => get_i64 -> i64,
    opt_usize => get_usize -> usize,
    opt_f32 => get_f32 -> f32,
    opt_f64 => get_f64 -> f64,
    opt_bool => get_bool -> bool,
    opt_i32_array => get_i32_array -> Vec<i32>,
    opt_u32_array => get_u32_array -> Vec<u32>,
    opt_f32_array => get_f32_array -> Vec<f32>,
);

impl Metadata {
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        if self.contains_key(key) {
            self.get_str(key).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        if self.contains_key(key) {
            self.get_str_array(key).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&ArrayValue>> {
        if self.contains_key(key) {
            self.get_array(key).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn getters_convert_and_name_the_key() {
        let mut m = Metadata::new();
        m.set("a", 7u8);
        m.set("neg", -1i32);
        m.set("f", 1.5f64);
        m.set("s", "hi");
        m.set("toks", vec!["a", "b"]);
        m.set("types", vec![1u8, 2, 3]);
        assert_eq!(m.get_u32("a").unwrap(), 7);
        assert_eq!(m.get_u64("a").unwrap(), 7);
        assert_eq!(m.get_f32("f").unwrap(), 1.5);
        assert_eq!(m.get_str("s").unwrap(), "hi");
        assert_eq!(m.get_str_array("toks").unwrap(), vec!["a", "b"]);
        assert_eq!(m.get_i32_array("types").unwrap(), vec![1, 2, 3]);
        let e = m.get_u32("neg").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongType);
        assert!(e.to_string().contains("\"neg\""), "{e}");
        let e = m.get_str("nope").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingKey);
        assert!(e.to_string().contains("nope"));
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        assert_eq!(m.opt_u32("a").unwrap(), Some(7));
        assert!(m.opt_u32("s").is_err());
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["a", "neg", "f", "s", "toks", "types"]
        );
    }

    #[test]
    fn duplicate_insert_is_rejected() {
        let mut m = Metadata::new();
        m.insert("k".into(), Value::U8(1)).unwrap();
        let e = m.insert("k".into(), Value::U8(2)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DuplicateKey);
    }
}
