//! The vocabulary: token texts in one arena, with an open-addressing index
//! from text to id. Built once per model; for a 262k-token vocabulary this is
//! two allocations instead of half a million.

use std::hash::Hasher;

use super::FxHasher;

const EMPTY: u32 = u32::MAX;

pub(crate) struct Vocab {
    arena: String,
    /// `offs[i]..offs[i + 1]` is token `i`'s text in `arena`.
    offs: Vec<u32>,
    /// `(token id, high hash bits)` by hash slot; id `EMPTY` marks a free
    /// slot. The hash bits let most probes skip reading the text.
    table: Vec<(u32, u32)>,
    shift: u32,
}

#[inline]
fn hash(s: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(s.as_bytes());
    h.finish().wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Vocab {
    /// Indexes `texts`; a text given twice maps to its last id, as in llama.cpp.
    pub(crate) fn new<'a>(texts: impl ExactSizeIterator<Item = &'a str> + Clone) -> Vocab {
        let n = texts.len();
        let total: usize = texts.clone().map(str::len).sum();
        let mut arena = String::with_capacity(total);
        let mut offs = Vec::with_capacity(n + 1);
        offs.push(0u32);
        for t in texts {
            arena.push_str(t);
            offs.push(arena.len() as u32);
        }
        let bits = ((n.max(1) * 2).next_power_of_two().trailing_zeros()).max(4);
        let mut v = Vocab {
            arena,
            offs,
            table: vec![(EMPTY, 0); 1usize << bits],
            shift: 64 - bits,
        };
        for id in 0..n as u32 {
            let mask = v.table.len() - 1;
            let text = v.text(id);
            let h = hash(text);
            let fp = h as u32;
            let mut slot = (h >> v.shift) as usize;
            loop {
                let (cur, cur_fp) = v.table[slot];
                if cur == EMPTY || (cur_fp == fp && v.text(cur) == text) {
                    v.table[slot] = (id, fp);
                    break;
                }
                slot = (slot + 1) & mask;
            }
        }
        v
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.offs.len() - 1
    }

    #[inline]
    pub(crate) fn text(&self, id: u32) -> &str {
        let i = id as usize;
        &self.arena[self.offs[i] as usize..self.offs[i + 1] as usize]
    }

    #[inline]
    pub(crate) fn get(&self, s: &str) -> Option<u32> {
        let mask = self.table.len() - 1;
        let h = hash(s);
        let fp = h as u32;
        let mut slot = (h >> self.shift) as usize;
        loop {
            let (cur, cur_fp) = self.table[slot];
            if cur == EMPTY {
                return None;
            }
            if cur_fp == fp && self.text(cur) == s {
                return Some(cur);
            }
            slot = (slot + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        let words = ["a", "bb", "", "ccc", "bb"];
        let v = Vocab::new(words.iter().copied());
        assert_eq!(v.len(), 5);
        assert_eq!(v.get("a"), Some(0));
        assert_eq!(v.get("bb"), Some(4));
        assert_eq!(v.get(""), Some(2));
        assert_eq!(v.get("ccc"), Some(3));
        assert_eq!(v.get("d"), None);
        assert_eq!(v.text(3), "ccc");
    }
}
