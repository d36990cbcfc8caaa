//! Incremental detokenization for streaming generated text.

use super::{Tokenizer, TokenizerError};

/// Turns token ids, given one at a time, into text that is always complete
/// UTF-8: bytes of a character split across tokens (an emoji made of byte
/// tokens, say) are held back until the character is complete.
///
/// Pieces are rendered like [`Tokenizer::decode`] renders them (control
/// tokens as nothing unless built with [`StreamDecoder::with_special`], the
/// first piece's prefix space removed when the model adds one, llama.cpp's
/// `clean_spaces` pass where the model has it), so the concatenated output
/// equals `decode` of all the ids. With `clean_spaces`, a trailing space or
/// apostrophe is held back until the next bytes show whether it stays.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    special: bool,
    pending: Vec<u8>,
    first: bool,
    clean: Option<[CleanPass; 3]>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder that renders control tokens as nothing.
    pub fn new(tok: &'a Tokenizer) -> Self {
        StreamDecoder {
            tok,
            special: false,
            pending: Vec::new(),
            first: true,
            clean: tok.clean_spaces().then(|| [1, 2, 3].map(CleanPass::new)),
        }
    }

    /// A decoder that renders control tokens by their text.
    pub fn with_special(tok: &'a Tokenizer) -> Self {
        StreamDecoder {
            special: true,
            ..Self::new(tok)
        }
    }

    /// Adds one token; returns the text that became complete (maybe empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tok.piece(id, self.special)?;
        let piece = if self.first && self.tok.add_space_prefix() {
            piece.strip_prefix(b" ").unwrap_or(piece)
        } else {
            piece
        };
        self.first = false;
        match &mut self.clean {
            None => self.pending.extend_from_slice(piece),
            Some(passes) => run_passes(passes, piece, false, &mut self.pending),
        }
        Ok(self.take_complete())
    }

    /// Flushes what is left: an incomplete trailing sequence becomes U+FFFD.
    /// The decoder can then be reused for a new sequence.
    pub fn finish(&mut self) -> String {
        if let Some(passes) = &mut self.clean {
            run_passes(passes, &[], true, &mut self.pending);
            *passes = [1, 2, 3].map(CleanPass::new);
        }
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.first = true;
        out
    }

    /// Bytes received but not yet returned (an incomplete character).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `good` was just validated.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes can never become valid: replace them.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        // An incomplete sequence at the end: wait for more.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }
}

fn run_passes(passes: &mut [CleanPass; 3], input: &[u8], fin: bool, out: &mut Vec<u8>) {
    let mut data = input.to_vec();
    for p in passes.iter_mut() {
        p.inp.extend_from_slice(&data);
        data = p.run(fin);
    }
    out.extend_from_slice(&data);
}

/// One pass of llama.cpp's `clean_spaces`, run incrementally: index `i` is
/// decided only once the two bytes after it are known (or the input ended),
/// so the result equals the batch pass over the whole text. A trailing space
/// of the output is held back, as the next decision may remove it.
struct CleanPass {
    kind: u8,
    /// Input from absolute index `base` on.
    inp: Vec<u8>,
    base: usize,
    /// Next absolute index to decide.
    i: usize,
    /// Pass 2: absolute index blanked by a `" ' "` match.
    zeroed: usize,
    out: Vec<u8>,
}

impl CleanPass {
    fn new(kind: u8) -> Self {
        CleanPass {
            kind,
            inp: Vec::new(),
            base: 0,
            i: 0,
            zeroed: usize::MAX,
            out: Vec::new(),
        }
    }

    /// Decides what it can; returns the output that is final.
    fn run(&mut self, fin: bool) -> Vec<u8> {
        let end = self.base + self.inp.len();
        while self.i < end && (fin || self.i + 2 < end) {
            let i = self.i;
            let at = |k: usize| self.inp[k - self.base];
            let x = at(i);
            if i == 0 {
                self.out.push(x);
                self.i = 1;
                continue;
            }
            let prev = at(i - 1);
            match self.kind {
                1 => {
                    if prev == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
                        self.out.pop();
                    }
                    self.i += 1;
                }
                2 => {
                    let prev = if self.zeroed == i - 1 { 0 } else { prev };
                    if x == b'\'' && i + 1 < end && prev == b' ' && at(i + 1) == b' ' {
                        self.out.pop();
                        self.zeroed = i + 1;
                        self.i += 2;
                    } else {
                        self.i += 1;
                    }
                }
                _ => {
                    if prev == b' ' && x == b'\'' && i + 1 < end {
                        let x1 = at(i + 1);
                        let contraction = x1 == b's'
                            || x1 == b'm'
                            || (i + 2 < end && (x1 == b'r' || x1 == b'v') && at(i + 2) == b'e');
                        if contraction {
                            self.out.pop();
                        }
                    }
                    self.i += 1;
                }
            }
            self.out.push(x);
        }
        // Keep one byte of history before the next undecided index.
        let keep_from = self.i.saturating_sub(1).max(self.base);
        self.inp.drain(..keep_from - self.base);
        self.base = keep_from;
        let hold = usize::from(!fin && self.out.last() == Some(&b' '));
        let n = self.out.len() - hold;
        self.out.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streaming the passes over any chunking equals the batch pass.
    #[test]
    fn incremental_clean_spaces_equals_batch() {
        let alphabet = b" '.,?!smrevlx";
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..3000 {
            let len = rnd(14);
            let text: Vec<u8> = (0..len).map(|_| alphabet[rnd(alphabet.len())]).collect();
            let want = super::super::clean_spaces(&text);
            let mut passes = [1, 2, 3].map(CleanPass::new);
            let mut got = Vec::new();
            let mut pos = 0;
            while pos < text.len() {
                let n = 1 + rnd(3).min(text.len() - pos - 1);
                run_passes(&mut passes, &text[pos..pos + n], false, &mut got);
                pos += n;
            }
            run_passes(&mut passes, &[], true, &mut got);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "text {:?}",
                String::from_utf8_lossy(&text)
            );
        }
    }
}
