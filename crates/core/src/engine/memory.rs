//! What a sequence remembers in one model, behind one interface.

use crate::backend::Backend;
use crate::error::ModelError;
use crate::model::DecoderState;

/// Where a [`SequenceMemory`] stood before a pass whose rows may be taken
/// back ([`SequenceMemory::checkpoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    len: usize,
}

impl Checkpoint {
    /// Positions held when it was taken.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A sequence's memory of its tokens: forward passes append to it, and a
/// speculative round commits only the rows its verdict keeps. The attention
/// KV cache is the first kind, for which a rollback is a length change;
/// recurrent state (a hybrid model's gated DeltaNet) keeps what it needs
/// between the checkpoint and the commit to restore the state after the
/// kept row, and the engine does not change.
pub trait SequenceMemory {
    /// Positions held.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks the current end, before a pass whose rows may be taken back.
    fn checkpoint(&mut self) -> Checkpoint {
        Checkpoint { len: self.len() }
    }

    /// Keeps the first `keep` rows appended since `at` and forgets the
    /// rest.
    fn commit(&mut self, at: Checkpoint, keep: usize) -> Result<(), ModelError>;
}

impl<B: Backend> SequenceMemory for DecoderState<B> {
    fn len(&self) -> usize {
        self.kv.len()
    }

    fn checkpoint(&mut self) -> Checkpoint {
        self.begin_checkpoint();
        Checkpoint { len: self.len() }
    }

    fn commit(&mut self, at: Checkpoint, keep: usize) -> Result<(), ModelError> {
        let kept = self.truncate(at.len + keep);
        self.end_checkpoint();
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory that is only a length, like the KV cache.
    struct Rows(usize);

    impl SequenceMemory for Rows {
        fn len(&self) -> usize {
            self.0
        }
        fn commit(&mut self, at: Checkpoint, keep: usize) -> Result<(), ModelError> {
            self.0 = self.0.min(at.len + keep);
            Ok(())
        }
    }

    #[test]
    fn a_commit_keeps_the_rows_after_its_checkpoint_that_it_names() {
        let mut m = Rows(10);
        let at = m.checkpoint();
        assert_eq!(at.len(), 10);
        m.0 += 5; // a verify pass of 5 rows
        m.commit(at, 2).unwrap();
        assert_eq!(m.len(), 12);
        let at = m.checkpoint();
        m.0 += 3;
        m.commit(at, 3).unwrap();
        assert_eq!(m.len(), 15, "a verdict that keeps every row");
    }
}
