//! Splitting text around special tokens before BPE/SPM runs, the way
//! llama.cpp's `tokenizer_st_partition` does: special tokens are tried
//! longest first, and each one cuts every still-unprocessed text fragment at
//! each of its non-overlapping occurrences, left to right.

/// A piece of the input: raw text (a byte range) or an already known token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// Partitions `text`; `specials` yields `(id, token text)` in priority order.
pub(crate) fn partition<'a>(
    text: &str,
    specials: impl Iterator<Item = (u32, &'a str)>,
) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(0..text.len())];
    let mut next = Vec::new();
    for (id, tok) in specials {
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
            let mut pos = r.start;
            while let Some(found) = text[pos..r.end].find(tok) {
                let m = pos + found;
                if m > pos {
                    next.push(Fragment::Text(pos..m));
                }
                next.push(Fragment::Token(id));
                pos = m + tok.len();
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
        let f = partition(t, specials.iter().map(|&(i, s)| (i, s)));
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
        assert!(partition("", std::iter::once((1, "a"))).is_empty());
    }
}
