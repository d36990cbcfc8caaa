//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): merges by rank inside
//! each pre-tokenized word, as llama.cpp's `llm_tokenizer_bpe_session` does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::unicode::BYTE_TO_CHAR;
use super::vocab::Vocab;
use super::{FxHashMap, TokenizerError};

const NONE: u32 = u32::MAX;

/// The merge table, over interned strings: vocabulary strings keep their
/// token id; other strings named by merges get ids past the vocabulary.
pub(crate) struct BpeModel {
    /// `(left, right)` -> `(rank, merged)`.
    ranks: FxHashMap<(u32, u32), (u32, u32)>,
    /// Interned id of the byte-encoded character of each raw byte.
    byte_sym: [u32; 256],
    /// Token of the single ASCII character, for llama.cpp's fallback.
    ascii_tok: [u32; 128],
    n_vocab: u32,
    pub(crate) ignore_merges: bool,
}

impl BpeModel {
    pub(crate) fn new(
        vocab: &Vocab,
        n_vocab: u32,
        merges: &[&str],
        ignore_merges: bool,
    ) -> Result<Self, TokenizerError> {
        let mut extra: FxHashMap<String, u32> = FxHashMap::default();
        let mut next = n_vocab;
        let mut intern = |s: &str| -> u32 {
            if let Some(id) = vocab.get(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = next;
            next += 1;
            extra.insert(s.to_owned(), id);
            id
        };
        let mut ranks = FxHashMap::default();
        ranks.reserve(merges.len());
        let mut buf = String::new();
        for (i, line) in merges.iter().enumerate() {
            // Split at the first space after the first byte, like llama.cpp.
            let pos = line
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
                .ok_or_else(|| TokenizerError::BadMerge {
                    index: i,
                    line: line.to_string(),
                })?;
            let (left, right) = (&line[..pos], &line[pos + 1..]);
            buf.clear();
            buf.push_str(left);
            buf.push_str(right);
            let l = intern(left);
            let r = intern(right);
            let m = intern(&buf);
            ranks.entry((l, r)).or_insert((i as u32, m));
        }
        let mut byte_sym = [NONE; 256];
        for (b, sym) in byte_sym.iter_mut().enumerate() {
            let mut tmp = [0u8; 4];
            let s = BYTE_TO_CHAR[b].encode_utf8(&mut tmp);
            if let Some(id) = vocab.get(s) {
                *sym = id;
            } else if let Some(&id) = extra.get(&*s) {
                *sym = id;
            }
        }
        let mut ascii_tok = [NONE; 128];
        for (b, tok) in ascii_tok.iter_mut().enumerate() {
            let s = [b as u8];
            if let Ok(s) = std::str::from_utf8(&s) {
                if let Some(id) = vocab.get(s) {
                    *tok = id;
                }
            }
        }
        Ok(BpeModel {
            ranks,
            byte_sym,
            ascii_tok,
            n_vocab,
            ignore_merges,
        })
    }

    /// Number of merge rules.
    pub(crate) fn n_merges(&self) -> usize {
        self.ranks.len()
    }

    /// Encodes one pre-tokenized word (raw text) and appends its tokens.
    pub(crate) fn encode_word(&self, word: &str, vocab: &Vocab, out: &mut Vec<u32>) {
        let bytes = word.as_bytes();
        if bytes.is_empty() {
            return;
        }
        if self.ignore_merges {
            let encoded: String = bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]).collect();
            if let Some(id) = vocab.get(&encoded) {
                out.push(id);
                return;
            }
        }
        if bytes.len() == 1 {
            self.emit(self.byte_sym[bytes[0] as usize], bytes, out);
            return;
        }

        struct Sym {
            id: u32,
            start: u32,
            len: u32,
            prev: i32,
            next: i32,
        }
        let n = bytes.len();
        let mut syms: Vec<Sym> = bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                id: self.byte_sym[b as usize],
                start: i as u32,
                len: 1,
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
            })
            .collect();

        // (rank, left, right, size, merged); lowest rank first, then leftmost.
        type Entry = Reverse<(u32, u32, u32, u32, u32)>;
        let mut heap: BinaryHeap<Entry> = BinaryHeap::with_capacity(n);
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<Entry>, l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            if ls.id == NONE || rs.id == NONE {
                return;
            }
            if let Some(&(rank, merged)) = self.ranks.get(&(ls.id, rs.id)) {
                heap.push(Reverse((rank, l as u32, r as u32, ls.len + rs.len, merged)));
            }
        };
        for i in 1..n {
            try_add(&syms, &mut heap, i as i32 - 1, i as i32);
        }
        while let Some(Reverse((_, l, r, size, merged))) = heap.pop() {
            let (l, r) = (l as usize, r as usize);
            let (ll, rl) = (syms[l].len, syms[r].len);
            // Outdated: one side was merged away or grew since the push.
            if ll == 0 || rl == 0 || ll + rl != size {
                continue;
            }
            let right_next = syms[r].next;
            syms[l].len += rl;
            syms[l].id = merged;
            syms[l].next = right_next;
            syms[r].len = 0;
            if right_next >= 0 {
                syms[right_next as usize].prev = l as i32;
            }
            let prev = syms[l].prev;
            try_add(&syms, &mut heap, prev, l as i32);
            try_add(&syms, &mut heap, l as i32, right_next);
        }
        for s in syms.iter().filter(|s| s.len > 0) {
            let piece = &bytes[s.start as usize..(s.start + s.len) as usize];
            self.emit(s.id, piece, out);
        }
    }

    /// Emits a finished symbol: its token, or llama.cpp's per-byte fallback
    /// (which only finds tokens for printable ASCII bytes).
    fn emit(&self, id: u32, piece: &[u8], out: &mut Vec<u32>) {
        if id < self.n_vocab {
            out.push(id);
            return;
        }
        for &b in piece {
            if (0x21..=0x7E).contains(&b) {
                let t = self.ascii_tok[b as usize];
                if t != NONE {
                    out.push(t);
                }
            }
        }
    }
}
