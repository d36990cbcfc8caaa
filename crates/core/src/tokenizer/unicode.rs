//! Codepoint classification and the GPT-2 byte <-> unicode mapping.

use super::unicode_data::{CATEGORY_RANGES, WHITESPACE};

/// Category bits of one codepoint, plus a whitespace bit, in the grouping the
/// pre-tokenizers test (`\p{L}`, `\p{N}`, `\s`, ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x01;
    pub const NUMBER: u16 = 0x02;
    pub const LETTER: u16 = 0x04;
    pub const PUNCTUATION: u16 = 0x20;
    pub const CATEGORIES: u16 = 0xFF;
    pub const WHITESPACE: u16 = 0x100;

    /// Flags of a position outside the current chunk: nothing set.
    pub const NONE: Flags = Flags(0);

    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// True for every real codepoint (each has a category), false for [`Flags::NONE`].
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

/// Classifies a codepoint.
pub(crate) fn flags(c: char) -> Flags {
    let cp = c as u32;
    // Binary search for the last range starting at or before `cp`.
    let idx = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cp);
    let cat = if idx == 0 {
        Flags::UNDEFINED
    } else {
        CATEGORY_RANGES[idx - 1].1 as u16
    };
    let ws = if is_whitespace_cp(cp) {
        Flags::WHITESPACE
    } else {
        0
    };
    Flags(cat | ws)
}

#[inline]
fn is_whitespace_cp(cp: u32) -> bool {
    match cp {
        0x09..=0x0D | 0x20 => true,
        _ if cp < 0x80 => false,
        _ => WHITESPACE.binary_search(&cp).is_ok(),
    }
}

/// True for bytes that GPT-2's byte-level encoding maps to themselves.
#[inline]
const fn byte_is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if byte_is_printable(b as u8) {
            b as u32
        } else {
            let cp = 256 + n;
            n += 1;
            cp
        };
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

/// GPT-2 byte-level encoding: every byte is shown as one printable character.
pub(crate) static BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

const fn build_extra_to_byte() -> [u8; 68] {
    let mut table = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !byte_is_printable(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
}

/// Bytes shown as U+0100 + i, for the 68 bytes that are not printable.
static EXTRA_TO_BYTE: [u8; 68] = build_extra_to_byte();

/// Inverse of [`BYTE_TO_CHAR`]; `None` for characters outside the 256 used.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && byte_is_printable(cp as u8) {
        return Some(cp as u8);
    }
    EXTRA_TO_BYTE.get(cp.checked_sub(256)? as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_mapping_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(char_to_byte('x'), Some(b'x'));
        assert_eq!(char_to_byte('\u{4e00}'), None);
    }

    #[test]
    fn categories() {
        assert!(flags('a').is_letter());
        assert!(flags('é').is_letter());
        assert!(flags('漢').is_letter());
        assert!(flags('7').is_number());
        assert!(flags('²').is_number());
        assert!(flags(' ').is_whitespace());
        assert!(flags('\u{3000}').is_whitespace());
        assert!(!flags('!').is_letter());
        assert_eq!(flags('!').category(), Flags::PUNCTUATION);
        assert!(flags('\u{10FFFF}').any());
    }
}
