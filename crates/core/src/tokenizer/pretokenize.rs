//! Pre-tokenizers for byte-level BPE: split text into words before merging.
//!
//! Each variant reproduces the splitting llama.cpp (commit 34af94cd) performs
//! for the `tokenizer.ggml.pre` values it maps to that variant: the regexes
//! are applied one after another, each one splitting the chunks the previous
//! one produced, and a chunk boundary acts like the end of the text (so
//! `\s+(?!\S)` takes a whole whitespace run when the run ends a chunk). The
//! big GPT-2 / Llama 3 / Qwen2 regexes are hand-written matchers that follow
//! llama.cpp's own hand-written versions, quirks included; the small ones are
//! character-class runs. Categories come from [`super::unicode`].

use super::unicode::{flags, Flags};

/// The splitting rules of one family of `tokenizer.ggml.pre` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback: punctuation runs, then the GPT-2 regex, then
    /// digit runs, then groups of three ASCII digits.
    Default,
    /// The GPT-2 regex alone.
    Gpt2,
    /// Every `\p{N}` on its own, then the GPT-2 regex (SmolLM, StarCoder).
    Smollm,
    /// The Llama 3 regex (digits in groups of up to three).
    Llama3,
    /// The Qwen2 regex (like Llama 3, but digits one at a time).
    Qwen2,
}

/// One split of the text: the chunk lengths, in codepoints.
type Offsets = Vec<usize>;

impl PreTokenizer {
    /// Splits `text` into words, returned as byte ranges of `text` in order.
    /// The ranges cover the whole text.
    pub fn split(self, text: &str) -> Vec<std::ops::Range<usize>> {
        let cpts: Vec<char> = text.chars().collect();
        if cpts.is_empty() {
            return Vec::new();
        }
        let mut offsets: Offsets = vec![cpts.len()];
        match self {
            PreTokenizer::Default => {
                offsets = split_runs(&cpts, &offsets, is_default_punct);
                offsets = split_gpt2(&cpts, &offsets);
                offsets = split_runs(&cpts, &offsets, is_collapsed_number);
                offsets = split_ascii_digit_triples(&cpts, &offsets);
            }
            PreTokenizer::Gpt2 => {
                offsets = split_gpt2(&cpts, &offsets);
            }
            PreTokenizer::Smollm => {
                offsets = split_singles(&cpts, &offsets, is_collapsed_number);
                offsets = split_gpt2(&cpts, &offsets);
            }
            PreTokenizer::Llama3 => {
                offsets = split_llama3(&cpts, &offsets, 3);
            }
            PreTokenizer::Qwen2 => {
                offsets = split_llama3(&cpts, &offsets, 1);
            }
        }
        let mut out = Vec::with_capacity(offsets.len());
        let mut byte = 0usize;
        let mut chars = cpts.iter();
        for len in offsets {
            let start = byte;
            for c in chars.by_ref().take(len) {
                byte += c.len_utf8();
            }
            out.push(start..byte);
        }
        out
    }
}

/// `\p{N}` as llama.cpp evaluates it on its "collapsed" text: ASCII digits,
/// or a non-ASCII, non-whitespace codepoint whose category is number.
fn is_collapsed_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    let f = flags(c);
    !f.is_whitespace() && f.category() == Flags::NUMBER
}

/// `[\p{P}\$\+<=>\^~\|]` on the collapsed text.
fn is_default_punct(c: char) -> bool {
    if c.is_ascii() {
        return matches!(
            c as u8,
            0x21..=0x23 | 0x25..=0x2A | 0x2C..=0x2F | 0x3A..=0x3B | 0x3F..=0x40 | 0x5B..=0x5D
                | 0x5F | 0x7B | 0x7D | b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'~' | b'|'
        );
    }
    let f = flags(c);
    !f.is_whitespace() && f.category() == Flags::PUNCTUATION
}

/// Pushes the pieces of one chunk: each match and each gap between matches.
fn push_split(out: &mut Offsets, chunk_len: usize, matches: &[(usize, usize)]) {
    let mut prev = 0;
    for &(s, e) in matches {
        if s > prev {
            out.push(s - prev);
        }
        out.push(e - s);
        prev = e;
    }
    if prev < chunk_len {
        out.push(chunk_len - prev);
    }
}

/// Splits every chunk by the regex `[class]+`.
fn split_runs(cpts: &[char], offsets: &[usize], class: fn(char) -> bool) -> Offsets {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let mut matches = Vec::new();
    for &len in offsets {
        let chunk = &cpts[start..start + len];
        matches.clear();
        let mut i = 0;
        while i < len {
            if class(chunk[i]) {
                let s = i;
                while i < len && class(chunk[i]) {
                    i += 1;
                }
                matches.push((s, i));
            } else {
                i += 1;
            }
        }
        push_split(&mut out, len, &matches);
        start += len;
    }
    out
}

/// Splits every chunk by the regex `[class]` (each match one codepoint).
fn split_singles(cpts: &[char], offsets: &[usize], class: fn(char) -> bool) -> Offsets {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let mut matches = Vec::new();
    for &len in offsets {
        matches.clear();
        for (i, &c) in cpts[start..start + len].iter().enumerate() {
            if class(c) {
                matches.push((i, i + 1));
            }
        }
        push_split(&mut out, len, &matches);
        start += len;
    }
    out
}

/// Splits every chunk by the regex `[0-9][0-9][0-9]`.
fn split_ascii_digit_triples(cpts: &[char], offsets: &[usize]) -> Offsets {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let mut matches = Vec::new();
    for &len in offsets {
        let chunk = &cpts[start..start + len];
        matches.clear();
        let mut i = 0;
        while i + 3 <= len {
            if chunk[i..i + 3].iter().all(|c| c.is_ascii_digit()) {
                matches.push((i, i + 3));
                i += 3;
            } else {
                i += 1;
            }
        }
        push_split(&mut out, len, &matches);
        start += len;
    }
    out
}

/// A view of one chunk: codepoints and flags, with "nothing" outside it.
struct Chunk<'a> {
    cpts: &'a [char],
    flags: Vec<Flags>,
}

impl<'a> Chunk<'a> {
    fn new(cpts: &'a [char]) -> Self {
        Chunk {
            cpts,
            flags: cpts.iter().map(|&c| flags(c)).collect(),
        }
    }
    #[inline]
    fn len(&self) -> usize {
        self.cpts.len()
    }
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        self.cpts.get(pos).copied()
    }
    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        self.flags.get(pos).copied().unwrap_or(Flags::NONE)
    }
}

/// Collects word lengths of one chunk; `add(end)` closes the word ending at `end`.
struct Words<'o> {
    out: &'o mut Offsets,
    prev_end: usize,
}

impl Words<'_> {
    #[inline]
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

/// Contractions `'s 't 're 've 'm 'll 'd` at `pos`: the length matched (0 if none).
fn contraction_len(ch: &Chunk, pos: usize, case_insensitive: bool) -> usize {
    if ch.cpt(pos) != Some('\'') || pos + 1 >= ch.len() {
        return 0;
    }
    let lower = |c: Option<char>| -> Option<char> {
        if case_insensitive {
            c.map(|c| c.to_ascii_lowercase())
        } else {
            c
        }
    };
    let next = lower(ch.cpt(pos + 1));
    if matches!(next, Some('s' | 't' | 'm' | 'd')) {
        return 2;
    }
    if pos + 2 < ch.len() {
        let next2 = lower(ch.cpt(pos + 2));
        if matches!(
            (next, next2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return 3;
        }
    }
    0
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(cpts: &[char], offsets: &[usize]) -> Offsets {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let ch = Chunk::new(&cpts[start..start + len]);
        start += len;
        let mut w = Words {
            out: &mut out,
            prev_end: 0,
        };
        let mut pos = 0;
        while pos < len {
            let cpt = ch.cpts[pos];
            let fl = ch.flags(pos);

            let n = contraction_len(&ch, pos, false);
            if n > 0 {
                pos += w.add(pos + n);
                continue;
            }

            let space = cpt == ' ';
            let mut f2 = if space { ch.flags(pos + 1) } else { fl };
            // ` ?\p{L}+`
            if f2.is_letter() {
                pos += space as usize;
                while f2.is_letter() {
                    pos += 1;
                    f2 = ch.flags(pos);
                }
                w.add(pos);
                continue;
            }
            // ` ?\p{N}+`
            if f2.is_number() {
                pos += space as usize;
                while f2.is_number() {
                    pos += 1;
                    f2 = ch.flags(pos);
                }
                w.add(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+`
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(f2) {
                pos += space as usize;
                while other(f2) {
                    pos += 1;
                    f2 = ch.flags(pos);
                }
                w.add(pos);
                continue;
            }

            let mut n_ws = 0;
            while ch.flags(pos + n_ws).is_whitespace() {
                n_ws += 1;
            }
            // `\s+(?!\S)`: leave the last space for the next word, unless the
            // run ends the chunk.
            if n_ws > 1 && pos + n_ws < len {
                pos += n_ws - 1;
                w.add(pos);
                continue;
            }
            // `\s+`
            if n_ws > 0 {
                pos += n_ws;
                w.add(pos);
                continue;
            }
            pos += 1;
            w.add(pos);
        }
    }
    out
}

/// Llama 3 (`max_digits` = 3) and Qwen2 (`max_digits` = 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cpts: &[char], offsets: &[usize], max_digits: usize) -> Offsets {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let ch = Chunk::new(&cpts[start..start + len]);
        start += len;
        let mut w = Words {
            out: &mut out,
            prev_end: 0,
        };
        let mut pos = 0;
        while pos < len {
            let cpt = ch.cpts[pos];
            let fl = ch.flags(pos);

            let n = contraction_len(&ch, pos, true);
            if n > 0 {
                pos += w.add(pos + n);
                continue;
            }

            // `[^\r\n\p{L}\p{N}]?\p{L}+`
            if !(cpt == '\r' || cpt == '\n' || fl.is_number())
                && (fl.is_letter() || ch.flags(pos + 1).is_letter())
            {
                pos += 1;
                while ch.flags(pos).is_letter() {
                    pos += 1;
                }
                w.add(pos);
                continue;
            }

            // `\p{N}{1,max}`
            if fl.is_number() {
                let mut ini = pos;
                while ch.flags(pos).is_number() {
                    pos += 1;
                    if pos - ini >= max_digits {
                        w.add(pos);
                        ini = pos;
                    }
                }
                w.add(pos);
                continue;
            }

            // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (the first test looks at the
            // current codepoint's own flags, as llama.cpp does)
            let space = cpt == ' ';
            let mut f2 = if space { ch.flags(pos + 1) } else { fl };
            if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && fl.any() {
                pos += space as usize;
                while !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && f2.any() {
                    pos += 1;
                    f2 = ch.flags(pos);
                }
                while matches!(ch.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                w.add(pos);
                continue;
            }

            let mut n_ws = 0;
            let mut last_rn_end = None;
            while ch.flags(pos + n_ws).is_whitespace() {
                if matches!(ch.cpt(pos + n_ws), Some('\r' | '\n')) {
                    last_rn_end = Some(pos + n_ws + 1);
                }
                n_ws += 1;
            }
            // `\s*[\r\n]+`
            if let Some(end) = last_rn_end {
                pos = end;
                w.add(pos);
                continue;
            }
            // `\s+(?!\S)`
            if n_ws > 1 && pos + n_ws < len {
                pos += n_ws - 1;
                w.add(pos);
                continue;
            }
            // `\s+`
            if n_ws > 0 {
                pos += n_ws;
                w.add(pos);
                continue;
            }
            pos += 1;
            w.add(pos);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(p: PreTokenizer, text: &str) -> Vec<&str> {
        p.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_basic() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's  end 123!!\n\n x"),
            vec!["Hello", " world", "'s", " ", " end", " 123", "!!", "\n\n", " x"]
        );
        // trailing whitespace run at the end of the text stays whole
        assert_eq!(words(PreTokenizer::Gpt2, "a   "), vec!["a", "   "]);
    }

    #[test]
    fn smollm_digits_alone() {
        assert_eq!(
            words(PreTokenizer::Smollm, "x 2024 y"),
            vec!["x", " ", "2", "0", "2", "4", " y"]
        );
    }

    #[test]
    fn llama3_and_qwen2_digits() {
        assert_eq!(
            words(PreTokenizer::Llama3, "abc 12345 I'M"),
            vec!["abc", " ", "123", "45", " I", "'M"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, "a 123\n\n  b"),
            vec!["a", " ", "1", "2", "3", "\n\n", " ", " b"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, "x!?\n\ny"),
            vec!["x", "!?\n\n", "y"]
        );
    }

    #[test]
    fn ranges_cover_text() {
        let t = "héllo, 世界! 42 \u{3000}end\r\n";
        for p in [
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
            PreTokenizer::Smollm,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
        ] {
            let joined: String = words(p, t).concat();
            assert_eq!(joined, t, "{p:?}");
        }
    }
}
