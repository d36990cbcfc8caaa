//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`):
//! start from single characters and repeatedly merge the adjacent pair whose
//! concatenation is the vocabulary token with the highest score, as
//! llama.cpp's `llm_tokenizer_spm_session` does. Characters left without a
//! token fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;
use super::TokenizerError;

struct Bigram {
    left: u32,
    right: u32,
    score: f32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

struct Sym {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// Tokenizes `text` (spaces already replaced by `▁`) and appends the ids.
pub(crate) fn encode(
    text: &str,
    vocab: &Vocab,
    scores: &[f32],
    byte_tokens: &[u32; 256],
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    if text.is_empty() {
        return Ok(());
    }
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        syms.push(Sym {
            start: start as u32,
            len: c.len_utf8() as u32,
            prev: i as i32 - 1,
            next: i as i32 + 1,
        });
    }
    if let Some(last) = syms.last_mut() {
        last.next = -1;
    }

    let mut heap: BinaryHeap<Bigram> = BinaryHeap::with_capacity(syms.len());
    let try_add = |syms: &[Sym], heap: &mut BinaryHeap<Bigram>, l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
        let start = ls.start as usize;
        let end = (ls.start + ls.len + rs.len) as usize;
        if let Some(id) = vocab.get(&text[start..end]) {
            heap.push(Bigram {
                left: l as u32,
                right: r as u32,
                score: scores.get(id as usize).copied().unwrap_or(0.0),
                size: (end - start) as u32,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&syms, &mut heap, i as i32 - 1, i as i32);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left as usize, b.right as usize);
        let (ll, rl) = (syms[l].len, syms[r].len);
        if ll == 0 || rl == 0 || ll + rl != b.size {
            continue;
        }
        let right_next = syms[r].next;
        syms[l].len += rl;
        syms[r].len = 0;
        syms[l].next = right_next;
        if right_next >= 0 {
            syms[right_next as usize].prev = l as i32;
        }
        let prev = syms[l].prev;
        try_add(&syms, &mut heap, prev, l as i32);
        try_add(&syms, &mut heap, l as i32, right_next);
    }

    let mut i = 0i32;
    while i != -1 {
        let s = &syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match vocab.get(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    let id = byte_tokens[b as usize];
                    if id == u32::MAX {
                        return Err(TokenizerError::MissingByteToken(b));
                    }
                    out.push(id);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}
