//! A drafter every sequence of a front end may use: its weights loaded
//! once, each sequence's drafter holding only its own state.

use super::{DFlashDrafter, DFlashModel, DraftModelDrafter, Drafter, NgramDrafter};
use crate::backend::Backend;
use crate::error::ModelError;
use crate::model::Decoder;
use std::sync::Arc;

pub enum SharedDrafter<B: Backend> {
    None,
    Ngram,
    /// A DFlash block drafter's weights (sharing the target's embeddings
    /// where it has none); each sequence gets its own caches.
    DFlash(Arc<DFlashModel<B>>),
    /// A smaller model of the same vocabulary.
    Model(Arc<Decoder<B>>),
}

impl<B: Backend> SharedDrafter<B> {
    pub fn is_some(&self) -> bool {
        !matches!(self, SharedDrafter::None)
    }

    /// A drafter for one sequence of a target with `n_vocab` tokens whose
    /// cache holds `n_ctx` positions, observing up to `max_batch` rows a
    /// pass; `None` without one. Uploads no weights.
    pub fn for_sequence(
        &self,
        n_vocab: usize,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Option<Box<dyn Drafter<B>>>, ModelError> {
        Ok(match self {
            SharedDrafter::None => None,
            SharedDrafter::Ngram => Some(Box::new(NgramDrafter::default())),
            SharedDrafter::DFlash(m) => {
                Some(Box::new(DFlashDrafter::new(m.clone(), n_ctx, max_batch)))
            }
            SharedDrafter::Model(m) => {
                Some(Box::new(DraftModelDrafter::new(m.clone(), n_vocab, n_ctx)?))
            }
        })
    }
}
