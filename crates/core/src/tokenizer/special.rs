//! Splitting text around special tokens before BPE/SPM runs, the way
//! llama.cpp's `tokenizer_st_partition` does: special tokens are tried
//! longest first, and each one cuts every still-unprocessed text fragment at
//! each of its non-overlapping occurrences, left to right.
//!
//! Chat prompts add one rule ([`partition`]'s `plain` ranges): a token marked
//! as matching only outside them (a control token) is not cut out where its
//! occurrence overlaps such a range (message content), so that text stays
//! plain text.

use std::ops::Range;

/// A piece of the input: raw text (a byte range) or an already known token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// Whether `r` overlaps one of `plain` (sorted, disjoint ranges).
fn overlaps(plain: &[Range<usize>], r: &Range<usize>) -> bool {
    // The first range that ends after r starts.
    let i = plain.partition_point(|p| p.end <= r.start);
    plain.get(i).is_some_and(|p| p.start < r.end)
}

/// Partitions `text`; `specials` yields `(id, token text, anywhere)` in
/// priority order. A token with `anywhere == false` is only cut out where its
/// occurrence overlaps none of `plain` (sorted, disjoint byte ranges).
pub(crate) fn partition<'a>(
    text: &str,
    specials: impl Iterator<Item = (u32, &'a str, bool)>,
    plain: &[Range<usize>],
) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(0..text.len())];
    let mut next = Vec::new();
    for (id, tok, anywhere) in specials {
        if tok.is_empty() {
            continue;
        }
        // Cheap check first: most special tokens do not occur at all.
        let occurs = frags.iter().any(|f| match f {
            Fragment::Text(r) => r.len() >= tok.len() && text[r.clone()].contains(tok),
            Fragment::Token(_) => false,
        });
        if !occurs {
            continue;
        }
        next.clear();
        for f in frags.drain(..) {
            let Fragment::Text(r) = f else {
                next.push(f);
                continue;
            };
            // `pos`: where the pending text starts; `from`: where to search.
            let mut pos = r.start;
            let mut from = r.start;
            while let Some(found) = text[from..r.end].find(tok) {
                let m = from + found;
                if !anywhere && overlaps(plain, &(m..m + tok.len())) {
                    // Stays text; look again one character further.
                    from = m + text[m..].chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                if m > pos {
                    next.push(Fragment::Text(pos..m));
                }
                next.push(Fragment::Token(id));
                pos = m + tok.len();
                from = pos;
            }
            if pos < r.end {
                next.push(Fragment::Text(pos..r.end));
            }
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_first_and_repeated() {
        let specials = [(1u32, "<|im_start|>"), (2, "<|im_end|>"), (3, "<|")];
        let t = "<|im_start|>user\nhi<|im_end|><|x<|im_end|>";
        let f = partition(t, specials.iter().map(|&(i, s)| (i, s, false)), &[]);
        assert_eq!(
            f,
            vec![
                Fragment::Token(1),
                Fragment::Text(12..19),
                Fragment::Token(2),
                Fragment::Token(3),
                Fragment::Text(31..32),
                Fragment::Token(2),
            ]
        );
    }

    #[test]
    fn empty_text() {
        assert!(partition("", std::iter::once((1, "a", true)), &[]).is_empty());
    }

    #[test]
    fn plain_ranges_keep_restricted_tokens_as_text() {
        let specials = [
            (1u32, "<|im_start|>", false),
            (2, "<|im_end|>", false),
            (7, "<b>", true),
        ];
        let t = "<|im_start|>u\nA<|im_end|><b>x<|im_end|><|im_end|>";
        // The content "A<|im_end|><b>x" is 14..29: only the template's own
        // <|im_start|> and the two last <|im_end|> are cut, and <b>, which
        // matches anywhere.
        let f = partition(t, specials.iter().copied(), std::slice::from_ref(&(14..29)));
        assert_eq!(
            f,
            vec![
                Fragment::Token(1),
                Fragment::Text(12..25),
                Fragment::Token(7),
                Fragment::Text(28..29),
                Fragment::Token(2),
                Fragment::Token(2),
            ]
        );
        // A token straddling the edge of a plain range stays text as well.
        let f = partition(
            "ab<|im_end|>",
            specials.iter().copied(),
            std::slice::from_ref(&(0..4)),
        );
        assert_eq!(f, vec![Fragment::Text(0..12)]);
        // Overlapping occurrences after a skipped one are still found.
        let f = partition(
            "aXaX",
            [(5u32, "aX", false)].into_iter(),
            std::slice::from_ref(&(0..1)),
        );
        assert_eq!(f, vec![Fragment::Text(0..2), Fragment::Token(5)]);
    }
}
