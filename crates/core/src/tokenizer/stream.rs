//! Incremental detokenization for streaming generated text.

use super::{Tokenizer, TokenizerError};

/// Turns token ids, given one at a time, into text that is always complete
/// UTF-8: bytes of a character split across tokens (an emoji made of byte
/// tokens, say) are held back until the character is complete.
///
/// Pieces are rendered like [`Tokenizer::decode`] renders them (control
/// tokens as nothing unless built with [`StreamDecoder::with_special`], the
/// first piece's prefix space removed when the model adds one). The
/// `clean_spaces` post-pass of the GPT-2 and Llama 3 pre-tokenizers, which
/// looks across token boundaries, is not applied; for SmolLM2, Qwen2 and
/// Gemma it is off anyway, so there the streamed text equals `decode`.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    special: bool,
    pending: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder that renders control tokens as nothing.
    pub fn new(tok: &'a Tokenizer) -> Self {
        StreamDecoder {
            tok,
            special: false,
            pending: Vec::new(),
            first: true,
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
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Flushes what is left: an incomplete trailing sequence becomes U+FFFD.
    pub fn finish(&mut self) -> String {
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
