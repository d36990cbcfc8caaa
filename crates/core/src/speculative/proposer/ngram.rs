//! N-gram prompt lookup: propose what followed the most recent earlier
//! occurrence of the sequence's last few tokens. Free to run, and strong on
//! repetitive text (code edits, quoting, summaries).

use super::{Draft, Drafter};
use crate::backend::Backend;
use crate::error::ModelError;

pub struct NgramDrafter {
    /// Longest suffix tried first.
    max_ngram: usize,
    min_ngram: usize,
}

impl NgramDrafter {
    pub fn new(min_ngram: usize, max_ngram: usize) -> Self {
        let min_ngram = min_ngram.max(1);
        NgramDrafter {
            min_ngram,
            max_ngram: max_ngram.max(min_ngram),
        }
    }

    /// The continuation after the most recent earlier match of the longest
    /// matching suffix.
    pub fn lookup(&self, history: &[u32], n_max: usize) -> Vec<u32> {
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if history.len() <= n {
                continue;
            }
            let key = &history[history.len() - n..];
            // Match windows end before the suffix itself; most recent first.
            let found = (0..history.len() - n)
                .rev()
                .find(|&start| &history[start..start + n] == key);
            if let Some(start) = found {
                let from = start + n;
                let to = (from + n_max).min(history.len());
                return history[from..to].to_vec();
            }
        }
        Vec::new()
    }
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter::new(1, 4)
    }
}

#[async_trait::async_trait(?Send)]
impl<B: Backend> Drafter<B> for NgramDrafter {
    fn kind(&self) -> &'static str {
        "ngram"
    }

    async fn propose(&mut self, history: &[u32], n_max: usize) -> Result<Draft, ModelError> {
        Ok(Draft {
            tokens: self.lookup(history, n_max),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let d = NgramDrafter::new(1, 3);
        // suffix [1, 2] occurred at 0 (followed by 3, 4) and at 5 (followed by 9)
        let h = [1, 2, 3, 4, 0, 1, 2, 9, 7, 1, 2];
        assert_eq!(d.lookup(&h, 3), vec![9, 7, 1]);
        assert_eq!(d.lookup(&[5, 6, 7], 4), Vec::<u32>::new());
        // The continuation may run into the suffix itself.
        assert_eq!(d.lookup(&[4, 4, 4], 5), vec![4]);
    }
}
