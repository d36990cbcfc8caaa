//! The one error type of this crate.
//!
//! GGUF files are untrusted input, so every failure is a value that says which
//! file, key or tensor was wrong and what was expected instead of a panic.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing or decoding GGUF data.
///
/// Errors raised while parsing a file opened by path are wrapped in
/// [`GgufError::File`]; use [`GgufError::kind`] to classify an error without
/// caring about that wrapper.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Wraps any other error with the path of the file it came from.
    /// (The inner error is in the message, not a `source()`, so that error
    /// chains do not print it twice.)
    #[error("{}: {error}", path.display())]
    File {
        path: PathBuf,
        error: Box<GgufError>,
    },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "truncated file: {what} needs bytes up to offset {needed}, but the file has only {len}"
    )]
    Truncated { what: String, needed: u64, len: u64 },
    #[error("bad magic {found:02x?}: expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} (supported: 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("{what}: length {len} exceeds the {remaining} bytes left in the file")]
    LengthTooLarge {
        what: String,
        len: u64,
        remaining: u64,
    },
    #[error("{what}: count {count} is impossible with {remaining} bytes left in the file")]
    CountTooLarge {
        what: String,
        count: u64,
        remaining: u64,
    },
    #[error("{what}: arrays nested deeper than {max} levels")]
    NestingTooDeep { what: String, max: usize },
    #[error("{what}: unknown metadata value type id {id}")]
    UnknownValueType { what: String, id: u32 },
    #[error("{what}: bool byte must be 0 or 1, found {value}")]
    InvalidBool { what: String, value: u8 },
    #[error("{what}: invalid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("duplicate metadata key \"{key}\"")]
    DuplicateKey { key: String },
    #[error("duplicate tensor name \"{tensor}\"")]
    DuplicateTensor { tensor: String },
    #[error("tensor \"{tensor}\": {n_dims} dimensions, expected 1 to 4")]
    BadDims { tensor: String, n_dims: u32 },
    #[error("tensor \"{tensor}\": unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error("tensor \"{tensor}\": bad shape {dims:?}: {reason}")]
    BadShape {
        tensor: String,
        dims: Vec<u64>,
        reason: String,
    },
    #[error("tensor \"{tensor}\": offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor \"{tensor}\": bytes {offset}..{end} lie outside the {data_len}-byte data section"
    )]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensors \"{first}\" and \"{second}\" overlap in the data section")]
    OverlappingTensors { first: String, second: String },
    #[error("{what}: size arithmetic overflows")]
    Overflow { what: String },
    #[error("alignment {value} is not a power of two")]
    BadAlignment { value: u64 },
    #[error("missing metadata key \"{key}\"")]
    MissingKey { key: String },
    #[error("metadata key \"{key}\": expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("no tensor named \"{tensor}\"")]
    MissingTensor { tensor: String },
    #[error("{what}: expected {expected} bytes/elements, got {found}")]
    BadLength {
        what: String,
        expected: u64,
        found: u64,
    },
    #[error("{what}: ggml type {ty} is not supported here")]
    UnsupportedType { what: String, ty: crate::GgmlType },
    #[error("stream: {0}")]
    Stream(String),
    #[error("split GGUF: {0}")]
    Split(String),
}

/// A coarse, `Copy` classification of [`GgufError`], handy for tests and for
/// callers that only branch on the kind of failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    Io,
    Truncated,
    BadMagic,
    UnsupportedVersion,
    BigEndian,
    LengthTooLarge,
    CountTooLarge,
    NestingTooDeep,
    UnknownValueType,
    InvalidBool,
    InvalidUtf8,
    DuplicateKey,
    DuplicateTensor,
    BadDims,
    UnknownTensorType,
    BadShape,
    MisalignedTensor,
    TensorOutOfBounds,
    OverlappingTensors,
    Overflow,
    BadAlignment,
    MissingKey,
    WrongType,
    MissingTensor,
    BadLength,
    UnsupportedType,
    Stream,
    Split,
}

impl ErrorKind {
    /// All kinds, for lookups by name.
    pub const ALL: [ErrorKind; 28] = [
        ErrorKind::Io,
        ErrorKind::Truncated,
        ErrorKind::BadMagic,
        ErrorKind::UnsupportedVersion,
        ErrorKind::BigEndian,
        ErrorKind::LengthTooLarge,
        ErrorKind::CountTooLarge,
        ErrorKind::NestingTooDeep,
        ErrorKind::UnknownValueType,
        ErrorKind::InvalidBool,
        ErrorKind::InvalidUtf8,
        ErrorKind::DuplicateKey,
        ErrorKind::DuplicateTensor,
        ErrorKind::BadDims,
        ErrorKind::UnknownTensorType,
        ErrorKind::BadShape,
        ErrorKind::MisalignedTensor,
        ErrorKind::TensorOutOfBounds,
        ErrorKind::OverlappingTensors,
        ErrorKind::Overflow,
        ErrorKind::BadAlignment,
        ErrorKind::MissingKey,
        ErrorKind::WrongType,
        ErrorKind::MissingTensor,
        ErrorKind::BadLength,
        ErrorKind::UnsupportedType,
        ErrorKind::Stream,
        ErrorKind::Split,
    ];

    /// snake_case name, used e.g. in the malformed-file corpus file names.
    pub fn name(self) -> &'static str {
        use ErrorKind::*;
        match self {
            Io => "io",
            Truncated => "truncated",
            BadMagic => "bad_magic",
            UnsupportedVersion => "unsupported_version",
            BigEndian => "big_endian",
            LengthTooLarge => "length_too_large",
            CountTooLarge => "count_too_large",
            NestingTooDeep => "nesting_too_deep",
            UnknownValueType => "unknown_value_type",
            InvalidBool => "invalid_bool",
            InvalidUtf8 => "invalid_utf8",
            DuplicateKey => "duplicate_key",
            DuplicateTensor => "duplicate_tensor",
            BadDims => "bad_dims",
            UnknownTensorType => "unknown_tensor_type",
            BadShape => "bad_shape",
            MisalignedTensor => "misaligned_tensor",
            TensorOutOfBounds => "tensor_out_of_bounds",
            OverlappingTensors => "overlapping_tensors",
            Overflow => "overflow",
            BadAlignment => "bad_alignment",
            MissingKey => "missing_key",
            WrongType => "wrong_type",
            MissingTensor => "missing_tensor",
            BadLength => "bad_length",
            UnsupportedType => "unsupported_type",
            Stream => "stream",
            Split => "split",
        }
    }

    pub fn from_name(name: &str) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl GgufError {
    /// The kind of this error, looking through [`GgufError::File`].
    pub fn kind(&self) -> ErrorKind {
        use GgufError as E;
        match self {
            E::File { error, .. } => error.kind(),
            E::Io(_) => ErrorKind::Io,
            E::Truncated { .. } => ErrorKind::Truncated,
            E::BadMagic { .. } => ErrorKind::BadMagic,
            E::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            E::BigEndian => ErrorKind::BigEndian,
            E::LengthTooLarge { .. } => ErrorKind::LengthTooLarge,
            E::CountTooLarge { .. } => ErrorKind::CountTooLarge,
            E::NestingTooDeep { .. } => ErrorKind::NestingTooDeep,
            E::UnknownValueType { .. } => ErrorKind::UnknownValueType,
            E::InvalidBool { .. } => ErrorKind::InvalidBool,
            E::InvalidUtf8 { .. } => ErrorKind::InvalidUtf8,
            E::DuplicateKey { .. } => ErrorKind::DuplicateKey,
            E::DuplicateTensor { .. } => ErrorKind::DuplicateTensor,
            E::BadDims { .. } => ErrorKind::BadDims,
            E::UnknownTensorType { .. } => ErrorKind::UnknownTensorType,
            E::BadShape { .. } => ErrorKind::BadShape,
            E::MisalignedTensor { .. } => ErrorKind::MisalignedTensor,
            E::TensorOutOfBounds { .. } => ErrorKind::TensorOutOfBounds,
            E::OverlappingTensors { .. } => ErrorKind::OverlappingTensors,
            E::Overflow { .. } => ErrorKind::Overflow,
            E::BadAlignment { .. } => ErrorKind::BadAlignment,
            E::MissingKey { .. } => ErrorKind::MissingKey,
            E::WrongType { .. } => ErrorKind::WrongType,
            E::MissingTensor { .. } => ErrorKind::MissingTensor,
            E::BadLength { .. } => ErrorKind::BadLength,
            E::UnsupportedType { .. } => ErrorKind::UnsupportedType,
            E::Stream(_) => ErrorKind::Stream,
            E::Split(_) => ErrorKind::Split,
        }
    }

    /// Wraps `self` with a file path (no-op when there is none or when it is
    /// already wrapped).
    pub fn in_file(self, path: Option<&std::path::Path>) -> GgufError {
        match (path, self) {
            (_, e @ GgufError::File { .. }) => e,
            (Some(p), e) => GgufError::File {
                path: p.to_path_buf(),
                error: Box::new(e),
            },
            (None, e) => e,
        }
    }
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
