//! Tokenizers built from GGUF metadata, matching llama.cpp's token ids.
//!
//! Two models are supported, chosen by `tokenizer.ggml.model`:
//! - `"gpt2"`: byte-level BPE ([`bpe`]) after a pre-tokenizer chosen by
//!   `tokenizer.ggml.pre` ([`PreTokenizer`]): SmolLM2, Qwen2.5, Llama 3...
//! - `"llama"`: SentencePiece-style merges by score with `<0xXX>` byte
//!   fallback ([`spm`]): Gemma 3, Llama 2...
//!
//! The rules follow llama.cpp at commit 34af94cd (`src/llama-vocab.cpp`,
//! `src/unicode.cpp`): special-token partitioning, BOS/EOS handling, the
//! token attributes it derives from token texts (end-of-generation set,
//! FIM tokens), and detokenization including its `clean_spaces` pass.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use blockdraft_core::tokenizer::Tokenizer;
//! let file = blockdraft_gguf::GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", true, false)?;
//! assert_eq!(tok.decode(&ids)?, "Hello world");
//! # Ok(()) }
//! ```

mod bpe;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;
mod unicode_data;
mod vocab;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use blockdraft_gguf::{GgufError, GgufFile, Metadata};

pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use special::Fragment;
use vocab::Vocab;

/// Everything that can go wrong building a tokenizer or using it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error("unknown tokenizer model '{0}' (supported: 'gpt2', 'llama')")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer type '{0}'")]
    UnknownPreTokenizer(String),
    #[error("{what} has {got} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("bad merge rule #{index} {line:?}: expected two parts separated by a space")]
    BadMerge { index: usize, line: String },
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("the vocabulary has no token for byte 0x{0:02X}")]
    MissingByteToken(u8),
    #[error("the model asks for a {0} token but has none")]
    MissingSpecialToken(&'static str),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// A small, fast, non-cryptographic hasher (FxHash) for the vocabulary maps.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// `tokenizer.ggml.token_type` values.
pub mod token_type {
    pub const UNDEFINED: i32 = 0;
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Token attributes (llama.cpp's `llama_token_attr` bits).
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
}

/// The `tokenizer.ggml.*` metadata a [`Tokenizer`] is built from.
#[derive(Clone, Debug, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (BPE only; absent means `"default"`).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Per-token scores (SPM merge priorities); absent means all 0.
    pub scores: Option<Vec<f32>>,
    /// Per-token types ([`token_type`]); absent means all normal.
    pub token_types: Option<Vec<i32>>,
    /// BPE merge rules `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; absent means the model type's default.
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; absent means the model type's default.
    pub add_space_prefix: Option<bool>,
}

impl TokenizerSpec {
    /// Reads the `tokenizer.ggml.*` keys. Only `model` and `tokens` are required.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let mut spec = Self::scalars_from_metadata(md)?;
        let arrays = Arrays::from_metadata(md)?;
        spec.tokens = arrays.tokens.iter().map(|s| s.to_string()).collect();
        spec.merges = arrays.merges.iter().map(|s| s.to_string()).collect();
        spec.scores = arrays.scores.map(Cow::into_owned);
        spec.token_types = arrays.token_types.map(Cow::into_owned);
        Ok(spec)
    }

    /// Everything but the per-token arrays and the merges.
    fn scalars_from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let key = |k: &str| format!("tokenizer.ggml.{k}");
        let model = md
            .opt_str(&key("model"))?
            .ok_or_else(|| TokenizerError::MissingKey(key("model")))?
            .to_owned();
        let id = |k: &str| md.opt_u32(&key(k));
        Ok(TokenizerSpec {
            model,
            pre: md.opt_str(&key("pre"))?.map(str::to_owned),
            tokens: Vec::new(),
            scores: None,
            token_types: None,
            merges: Vec::new(),
            bos: id("bos_token_id")?,
            eos: id("eos_token_id")?,
            eot: id("eot_token_id")?,
            eom: id("eom_token_id")?,
            unk: id("unknown_token_id")?,
            sep: id("seperator_token_id")?,
            pad: id("padding_token_id")?,
            mask: id("mask_token_id")?,
            // The deprecated keys come last in llama.cpp's list, so they win.
            fim_pre: id("prefix_token_id")?.or(id("fim_pre_token_id")?),
            fim_suf: id("suffix_token_id")?.or(id("fim_suf_token_id")?),
            fim_mid: id("middle_token_id")?.or(id("fim_mid_token_id")?),
            fim_pad: id("fim_pad_token_id")?,
            fim_rep: id("fim_rep_token_id")?,
            fim_sep: id("fim_sep_token_id")?,
            add_bos: md.opt_bool(&key("add_bos_token"))?,
            add_eos: md.opt_bool(&key("add_eos_token"))?,
            add_space_prefix: md.opt_bool(&key("add_space_prefix"))?,
        })
    }
}

/// The large arrays of a spec, borrowed where possible.
struct Arrays<'a> {
    tokens: Vec<&'a str>,
    merges: Vec<&'a str>,
    scores: Option<Cow<'a, [f32]>>,
    token_types: Option<Cow<'a, [i32]>>,
}

impl<'a> Arrays<'a> {
    fn from_metadata(md: &'a Metadata) -> Result<Self, TokenizerError> {
        let key = |k: &str| format!("tokenizer.ggml.{k}");
        let tokens = md
            .opt_str_array(&key("tokens"))?
            .ok_or_else(|| TokenizerError::MissingKey(key("tokens")))?;
        let merges = md.opt_str_array(&key("merges"))?.unwrap_or_default();
        let scores = match md.get_f32_slice(&key("scores")) {
            Ok(s) => Some(Cow::Borrowed(s)),
            Err(_) => md.opt_f32_array(&key("scores"))?.map(Cow::Owned),
        };
        Ok(Arrays {
            tokens,
            merges,
            scores,
            token_types: md.opt_i32_array(&key("token_type"))?.map(Cow::Owned),
        })
    }

    fn from_spec(spec: &'a TokenizerSpec) -> Self {
        Arrays {
            tokens: spec.tokens.iter().map(String::as_str).collect(),
            merges: spec.merges.iter().map(String::as_str).collect(),
            scores: spec.scores.as_deref().map(Cow::Borrowed),
            token_types: spec.token_types.as_deref().map(Cow::Borrowed),
        }
    }
}

impl TokenizerSpec {
    /// A copy without the large arrays.
    fn clone_scalars(&self) -> TokenizerSpec {
        TokenizerSpec {
            model: self.model.clone(),
            pre: self.pre.clone(),
            tokens: Vec::new(),
            scores: None,
            token_types: None,
            merges: Vec::new(),
            ..*self
        }
    }
}

enum Model {
    Bpe {
        bpe: Box<bpe::BpeModel>,
        pre: PreTokenizer,
    },
    Spm {
        scores: Vec<f32>,
        byte_tokens: Box<[u32; 256]>,
    },
}

/// Settings llama.cpp attaches to each `tokenizer.ggml.pre` value that maps
/// to one of the supported pre-tokenizers.
struct PreInfo {
    pre: PreTokenizer,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
}

fn pre_info(name: &str) -> Option<PreInfo> {
    use PreTokenizer::*;
    let p = |pre, clean_spaces| PreInfo {
        pre,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
    };
    Some(match name {
        "" | "default" => p(Default, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreInfo {
            pre: Llama3,
            clean_spaces: true,
            ignore_merges: true,
            add_bos: true,
        },
        "dbrx" | "smaug-bpe" => p(Llama3, true),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "mpt" | "olmo" | "jais" => {
            p(Gpt2, true)
        }
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => p(Qwen2, false),
        "megrez" | "stablelm2" => p(Qwen2, true),
        "smollm" | "command-r" => p(Smollm, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            p(Smollm, true)
        }
        _ => return None,
    })
}

/// Token texts llama.cpp treats as end of generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// A tokenizer for one model: encodes text to token ids and back.
///
/// It is immutable once built, `Send + Sync`, and cheap to share by reference.
pub struct Tokenizer {
    model: Model,
    /// Token texts as stored in the GGUF (empty ones renamed `[EMPTY_i]`).
    vocab: Vocab,
    attrs: Vec<u16>,
    /// Each token's bytes as llama.cpp renders it with `special = true`:
    /// token `i` is `pieces[piece_offs[i]..piece_offs[i + 1]]`.
    pieces: Vec<u8>,
    piece_offs: Vec<u32>,
    /// Control / user-defined / unknown tokens, longest text first.
    special_order: Vec<u32>,
    eog: HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    sep: Option<u32>,
    fim: [Option<u32>; 6],
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    model_name: String,
    pre_name: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name)
            .field("pre", &self.pre_name)
            .field("vocab_size", &self.vocab.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_metadata(file.metadata())
    }

    /// Builds the tokenizer from GGUF metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let spec = TokenizerSpec::scalars_from_metadata(md)?;
        Self::build(spec, Arrays::from_metadata(md)?)
    }

    /// Builds the tokenizer from already extracted metadata.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Self, TokenizerError> {
        Self::build(spec.clone_scalars(), Arrays::from_spec(&spec))
    }

    fn build(spec: TokenizerSpec, arrays: Arrays<'_>) -> Result<Self, TokenizerError> {
        let n = arrays.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        // Model-type defaults (llama.cpp `llama_vocab::impl::load`).
        let is_spm = match spec.model.as_str() {
            "llama" => true,
            "gpt2" => false,
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };
        let (mut bos, mut eos, mut unk) = if is_spm {
            (Some(1), Some(2), Some(0))
        } else {
            (Some(11), Some(11), None)
        };
        let pre = if is_spm {
            None
        } else {
            let name = spec.pre.as_deref().unwrap_or("");
            Some(
                pre_info(name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(name.to_owned()))?,
            )
        };
        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces) = match &pre {
            None => (true, false, true, false),
            Some(p) => (p.add_bos, false, false, p.clean_spaces),
        };
        if let Some(v) = spec.add_space_prefix {
            add_space_prefix = v;
        }

        if let Some(s) = &arrays.scores {
            if s.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.scores",
                    got: s.len(),
                    expected: n,
                });
            }
        }
        if let Some(t) = &arrays.token_types {
            if t.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.token_type",
                    got: t.len(),
                    expected: n,
                });
            }
        }

        let texts: Vec<Cow<'_, str>> = arrays
            .tokens
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                if w.is_empty() {
                    Cow::Owned(format!("[EMPTY_{i}]"))
                } else {
                    Cow::Borrowed(w)
                }
            })
            .collect();
        let vocab = Vocab::new(texts.iter().map(|t| &**t));
        drop(texts);
        let mut attrs: Vec<u16> = (0..n)
            .map(|i| match arrays.token_types.as_ref().map(|t| t[i]) {
                None => attr::NORMAL,
                Some(token_type::UNKNOWN) => attr::UNKNOWN,
                Some(token_type::UNUSED) => attr::UNUSED,
                Some(token_type::NORMAL) => attr::NORMAL,
                Some(token_type::CONTROL) => attr::CONTROL,
                Some(token_type::USER_DEFINED) => attr::USER_DEFINED,
                Some(token_type::BYTE) => attr::BYTE,
                Some(_) => 0,
            })
            .collect();

        // Special ids: defaults out of range are disabled, metadata values in
        // range replace them.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |default: Option<u32>, meta: Option<u32>| in_range(meta).or(in_range(default));
        bos = pick(bos, spec.bos);
        eos = pick(eos, spec.eos);
        unk = pick(unk, spec.unk);
        let mut eot = in_range(spec.eot);
        let mut eom = in_range(spec.eom);
        let sep = in_range(spec.sep);
        let pad = in_range(spec.pad);
        let mut fim = [
            in_range(spec.fim_pre),
            in_range(spec.fim_suf),
            in_range(spec.fim_mid),
            in_range(spec.fim_pad),
            in_range(spec.fim_rep),
            in_range(spec.fim_sep),
        ];
        if let Some(v) = spec.add_bos {
            add_bos = v;
        }
        if let Some(v) = spec.add_eos {
            add_eos = v;
        }

        // Auto-detect EOT/EOM/FIM tokens by text when the metadata has none;
        // a detected token becomes a control token. (llama.cpp walks a hash
        // map here, so with several candidates its choice is arbitrary; we
        // take the lowest id.)
        let find =
            |names: &[&str]| -> Option<u32> { names.iter().filter_map(|s| vocab.get(s)).min() };
        let detect = |slot: &mut Option<u32>, names: &[&str], attrs: &mut Vec<u16>| {
            if slot.is_none() {
                if let Some(id) = find(names) {
                    *slot = Some(id);
                    attrs[id as usize] |= attr::CONTROL;
                }
            }
        };
        detect(&mut eot, EOT_TEXTS, &mut attrs);
        detect(&mut eom, EOM_TEXTS, &mut attrs);
        let fim_names = [
            FIM_PRE_TEXTS,
            FIM_SUF_TEXTS,
            FIM_MID_TEXTS,
            FIM_PAD_TEXTS,
            FIM_REP_TEXTS,
            FIM_SEP_TEXTS,
        ];
        for (slot, names) in fim.iter_mut().zip(fim_names) {
            detect(slot, names, &mut attrs);
        }

        // Control tokens named "unused..." are unused.
        for (i, a) in attrs.iter_mut().enumerate() {
            if *a & attr::CONTROL != 0 && vocab.text(i as u32).contains("unused") {
                *a |= attr::UNUSED;
            }
        }

        // End-of-generation set.
        let mut eog: HashSet<u32> = HashSet::new();
        eog.extend(fim[3..].iter().flatten());
        for name in EOG_TEXTS {
            if let Some(id) = vocab.get(name) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = vocab.get(name) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let has = |eog: &HashSet<u32>, name: &str| vocab.get(name).filter(|id| eog.contains(id));
        if let Some(end) = has(&eog, "<|end|>") {
            let ret = has(&eog, "<|return|>").is_some();
            let call = has(&eog, "<|call|>").is_some() || has(&eog, "<|calls|>").is_some();
            let flush = has(&eog, "<|flush|>").is_some();
            if call && (ret || flush) {
                eog.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        if has(&eog, "<|tool_response>").is_some() {
            if let Some(s) = has(&eog, "</s>") {
                eog.remove(&s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        // Special tokens, longest first (stable: equal lengths by id).
        let mut special_order: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_order.sort_by_key(|&i| std::cmp::Reverse(vocab.text(i).len()));

        let model = match pre {
            Some(p) => Model::Bpe {
                bpe: Box::new(bpe::BpeModel::new(
                    &vocab,
                    n as u32,
                    &arrays.merges,
                    p.ignore_merges,
                )?),
                pre: p.pre,
            },
            None => {
                let mut byte_tokens = Box::new([u32::MAX; 256]);
                for (b, slot) in byte_tokens.iter_mut().enumerate() {
                    let hex = format!("<0x{b:02X}>");
                    if let Some(id) = vocab.get(&hex) {
                        *slot = id;
                    } else if let Ok(s) = std::str::from_utf8(&[b as u8]) {
                        if let Some(id) = vocab.get(s) {
                            *slot = id;
                        }
                    }
                }
                let mut scores = arrays.scores.map(Cow::into_owned).unwrap_or_default();
                scores.resize(n, 0.0);
                Model::Spm {
                    scores,
                    byte_tokens,
                }
            }
        };

        let is_bpe = matches!(model, Model::Bpe { .. });
        let mut pieces = Vec::with_capacity(vocab.len() * 4);
        let mut piece_offs = Vec::with_capacity(n + 1);
        piece_offs.push(0u32);
        for (i, &a) in attrs.iter().enumerate() {
            render_piece(vocab.text(i as u32), a, is_bpe, &mut pieces);
            piece_offs.push(pieces.len() as u32);
        }

        Ok(Tokenizer {
            model,
            vocab,
            attrs,
            pieces,
            piece_offs,
            special_order,
            eog,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            sep,
            fim,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            model_name: spec.model,
            pre_name: spec.pre,
        })
    }

    /// Encodes `text` like llama.cpp's `llama_tokenize`.
    ///
    /// With `add_special`, BOS is prepended when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`) and EOS appended when it asks for
    /// that. With `parse_special`, control tokens written in the text (such as
    /// `<|im_start|>`) become their ids; without it they are tokenized as plain
    /// text. User-defined tokens are matched either way, as in llama.cpp.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let all = 0..text.len();
        let plain = if parse_special {
            &[][..]
        } else {
            std::slice::from_ref(&all)
        };
        self.encode_with_plain(text, add_special, plain)
    }

    /// Like [`Tokenizer::encode`] with `parse_special`, except inside the
    /// `plain` byte ranges: there special tokens ([`Tokenizer::is_special`])
    /// are not parsed, as with `parse_special = false`, also where an
    /// occurrence would reach across a range's edge. The text is otherwise
    /// tokenized in one piece, so text without special-token text in the
    /// ranges gives exactly the ids of `encode(text, add_special, true)`.
    ///
    /// This keeps untrusted text (chat message content) inside a prompt
    /// from becoming control tokens; see
    /// [`ChatTemplate::encode`](crate::chat_template::ChatTemplate::encode).
    /// The ranges must be sorted, disjoint, and on character boundaries.
    pub fn encode_with_plain(
        &self,
        text: &str,
        add_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Result<Vec<u32>, TokenizerError> {
        let everywhere = plain.len() == 1 && plain[0] == (0..text.len());
        let frags = special::partition(
            text,
            self.special_order
                .iter()
                .map(|&id| (id, self.vocab.text(id), !self.is_special(id)))
                .filter(|&(_, _, anywhere)| anywhere || !everywhere),
            plain,
        );
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(self.bos.ok_or(TokenizerError::MissingSpecialToken("BOS"))?);
        }
        match &self.model {
            Model::Spm {
                scores,
                byte_tokens,
            } => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match f {
                        Fragment::Text(r) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[r.clone()].chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm::encode(&buf, &self.vocab, scores, byte_tokens, &mut out)?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe { bpe, pre } => {
                let mut cache: FxHashMap<&str, (usize, usize)> = FxHashMap::default();
                let mut scratch = Vec::new();
                for f in &frags {
                    match f {
                        Fragment::Text(r) => {
                            let frag = &text[r.clone()];
                            for w in pre.split(frag) {
                                let word = &frag[w];
                                if let Some(&(s, e)) = cache.get(word) {
                                    scratch.clear();
                                    scratch.extend_from_slice(&out[s..e]);
                                    out.extend_from_slice(&scratch);
                                    continue;
                                }
                                let s = out.len();
                                bpe.encode_word(word, &self.vocab, &mut out);
                                cache.insert(word, (s, out.len()));
                            }
                        }
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.eos.ok_or(TokenizerError::MissingSpecialToken("EOS"))?);
        }
        Ok(out)
    }

    /// Decodes ids to text like llama.cpp's `common_detokenize(.., special =
    /// false)`: control tokens render as nothing, the prefix space SentencePiece
    /// models add is removed from the first piece, and the model's
    /// `clean_spaces` pass is applied. Invalid UTF-8 (an incomplete character
    /// at the very end, say) is replaced by U+FFFD only here, after all pieces
    /// are joined.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_opts(ids, false)
    }

    /// Like [`Tokenizer::decode`] but control tokens are rendered by their text.
    pub fn decode_special(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_opts(ids, true)
    }

    /// Raw bytes of [`Tokenizer::decode`] / [`Tokenizer::decode_special`].
    pub fn decode_bytes(&self, ids: &[u32], special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let piece = self.piece(id, special)?;
            let piece = if remove_space {
                piece.strip_prefix(b" ").unwrap_or(piece)
            } else {
                piece
            };
            remove_space = false;
            out.extend_from_slice(piece);
        }
        if self.clean_spaces {
            out = clean_spaces(&out);
        }
        Ok(out)
    }

    fn decode_opts(&self, ids: &[u32], special: bool) -> Result<String, TokenizerError> {
        let bytes = self.decode_bytes(ids, special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes of one token (control tokens as nothing). Out-of-range ids
    /// give nothing; use [`Tokenizer::piece`] to get an error instead.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id, false)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// The bytes of one token; with `special`, control tokens render as their text.
    pub fn piece(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        let a = *self.attrs.get(i).ok_or(TokenizerError::IdOutOfRange {
            id,
            vocab_size: self.vocab.len(),
        })?;
        if !special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return Ok(&[]);
        }
        Ok(&self.pieces[self.piece_offs[i] as usize..self.piece_offs[i + 1] as usize])
    }

    /// The token's text as stored in the vocabulary (`Ġ`/`▁` not undone).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.vocab.len()).then(|| self.vocab.text(id))
    }

    /// The id of the token with exactly this vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// End of turn (`<|im_end|>`, `<end_of_turn>`...), from metadata or detected.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    pub fn sep(&self) -> Option<u32> {
        self.sep
    }
    /// FIM tokens: prefix, suffix, middle, pad, repo, file separator.
    pub fn fim_tokens(&self) -> [Option<u32>; 6] {
        self.fim
    }

    /// True when generation should stop at this token: EOS, EOT, EOM, and
    /// every token llama.cpp puts in its end-of-generation set.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_tokens(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// True for control tokens (rendered as nothing by [`Tokenizer::decode`]).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// True for the special tokens: control and unknown tokens, which text
    /// becomes only when it is encoded with `parse_special` (user-defined
    /// tokens are matched in any text, as in llama.cpp).
    pub fn is_special(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// The special tokens in `text`, in order, found by the longest-first
    /// partition `encode` with `parse_special` uses (user-defined tokens
    /// aside).
    pub(crate) fn special_ids(&self, text: &str) -> Vec<u32> {
        self.special_fragments(text)
            .filter_map(|f| match f {
                Fragment::Token(id) => Some(id),
                Fragment::Text(_) => None,
            })
            .collect()
    }

    fn special_fragments(&self, text: &str) -> impl Iterator<Item = Fragment> {
        special::partition(
            text,
            self.special_order
                .iter()
                .filter(|&&id| self.is_special(id))
                .map(|&id| (id, self.vocab.text(id), true)),
            &[],
        )
        .into_iter()
    }

    /// The first special token ([`Tokenizer::is_special`]) in `text`, as
    /// `encode` with `parse_special` would find it, or `None` when the text
    /// holds no special-token text.
    pub fn find_special(&self, text: &str) -> Option<u32> {
        self.special_fragments(text).find_map(|f| match f {
            Fragment::Token(id) => Some(id),
            Fragment::Text(_) => None,
        })
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// Whether decoding applies llama.cpp's `clean_spaces` pass (GPT-2,
    /// Llama 3 and default pre-tokenizers).
    pub fn clean_spaces(&self) -> bool {
        self.clean_spaces
    }

    /// Whether SentencePiece text gets a leading space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// `tokenizer.ggml.model`.
    pub fn model_type(&self) -> &str {
        &self.model_name
    }

    /// `tokenizer.ggml.pre`, if present.
    pub fn pre_type(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    /// The pre-tokenizer in use (BPE models only).
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe { pre, .. } => Some(*pre),
            Model::Spm { .. } => None,
        }
    }

    /// Number of BPE merge rules (0 for SentencePiece models).
    pub fn n_merges(&self) -> usize {
        match &self.model {
            Model::Bpe { bpe, .. } => bpe.n_merges(),
            Model::Spm { .. } => 0,
        }
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// Appends a token's bytes as llama.cpp's `token_to_piece(.., special =
/// true)` gives them.
fn render_piece(text: &str, a: u16, is_bpe: bool, out: &mut Vec<u8>) {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        if !is_bpe {
            for (i, part) in text.split('▁').enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(part.as_bytes());
            }
            return;
        }
        for c in text.chars() {
            match unicode::char_to_byte(c) {
                Some(b) => out.push(b),
                None => {
                    // llama.cpp's marker for characters outside the byte map.
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut tmp = [0u8; 4];
                    for b in c.encode_utf8(&mut tmp).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
    } else if a & attr::BYTE != 0 {
        out.push(parse_hex_prefix(text.get(3..5).unwrap_or("")));
    }
}

/// `strtol(s, 16)` truncated to a byte: leading hex digits, 0 if none.
fn parse_hex_prefix(s: &str) -> u8 {
    let mut v: u32 = 0;
    for c in s.chars() {
        match c.to_digit(16) {
            Some(d) => v = v * 16 + d,
            None => break,
        }
    }
    v as u8
}

/// llama.cpp's `clean_spaces` pass over detokenized bytes: drop the space
/// before `? ! . ,`, around a lone `'`, and before `'s 'm 're 've`.
fn clean_spaces(t: &[u8]) -> Vec<u8> {
    if t.is_empty() {
        return Vec::new();
    }
    // 1: " ?", " !", " .", " ,"
    let mut a = Vec::with_capacity(t.len());
    a.push(t[0]);
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // 2: " ' " -> "'"
    let mut b = Vec::with_capacity(a.len());
    b.push(a[0]);
    let mut zeroed = usize::MAX;
    let mut i = 1;
    while i < a.len() {
        let x = a[i];
        let prev = if zeroed == i - 1 { 0 } else { a[i - 1] };
        if x == b'\'' && i + 1 < a.len() && prev == b' ' && a[i + 1] == b' ' {
            b.pop();
            zeroed = i + 1;
            i += 1;
        }
        b.push(x);
        i += 1;
    }
    // 3: " 's", " 'm", " 're", " 've"
    let mut c = Vec::with_capacity(b.len());
    c.push(b[0]);
    let n = b.len();
    for i in 1..n {
        let x = b[i];
        if b[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = b[i + 1];
            if x1 == b's' || x1 == b'm' {
                c.pop();
            } else if i + 2 < n {
                let x2 = b[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    c.pop();
                }
            }
        }
        c.push(x);
    }
    c
}

#[cfg(test)]
mod tests;
