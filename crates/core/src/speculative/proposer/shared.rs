//! A drafter every sequence of a front end may use: its weights loaded
//! once, each sequence's drafter holding only its own state.

use super::{DFlashDrafter, DFlashModel, DraftModelDrafter, Drafter, NgramDrafter};
use crate::backend::{Backend, WeightRole};
use crate::error::ModelError;
use crate::model::Decoder;
use blockdraft_gguf::GgufFile;
use std::sync::Arc;

pub enum SharedDrafter<B: Backend> {
    None,
    Ngram,
    /// A DFlash block drafter's weights (sharing the target's embeddings
    /// where it has none); each sequence gets its own caches. `p_min`: a
    /// draft stops at the first token less likely than this.
    DFlash {
        model: Arc<DFlashModel<B>>,
        p_min: f32,
    },
    /// A smaller model of the same vocabulary.
    Model(Arc<Decoder<B>>),
}

impl<B: Backend> SharedDrafter<B> {
    /// The drafter in `file` for `target`: a DFlash drafter (architecture
    /// `dflash`), or else a draft model, which must share the target's
    /// vocabulary and uses its KV cache type.
    pub fn from_gguf(file: &GgufFile, target: &Decoder<B>) -> Result<Self, ModelError> {
        if file.architecture()? == "dflash" {
            let model = DFlashModel::load(file, target)?;
            return Ok(SharedDrafter::DFlash {
                model: Arc::new(model),
                p_min: 0.0,
            });
        }
        let model = Decoder::load_as(
            file,
            target.backend.clone(),
            WeightRole::Proposer,
            &mut |_| {},
        )?
        .with_kv_type(target.kv_type());
        if model.config.n_vocab != target.config.n_vocab {
            return Err(ModelError::VocabularyMismatch {
                drafter: model.config.n_vocab,
                target: target.config.n_vocab,
            });
        }
        Ok(SharedDrafter::Model(Arc::new(model)))
    }

    /// A draft model's or DFlash drafter's first pass (paging, repacking),
    /// which belongs to loading, as the target's does, not to the first
    /// probe.
    pub async fn warm_up(&self) -> Result<(), ModelError> {
        match self {
            SharedDrafter::Model(m) => m.warm_up().await,
            SharedDrafter::DFlash { model, .. } => model.warm_up().await,
            SharedDrafter::None | SharedDrafter::Ngram => Ok(()),
        }
    }

    /// The name the statistics give it.
    pub fn kind(&self) -> &'static str {
        match self {
            SharedDrafter::None => "none",
            SharedDrafter::Ngram => "ngram",
            SharedDrafter::DFlash { .. } => "dflash",
            SharedDrafter::Model(_) => "draft-model",
        }
    }

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
            SharedDrafter::DFlash { model, p_min } => {
                let mut d = DFlashDrafter::new(model.clone(), n_ctx, max_batch);
                d.p_min = *p_min;
                Some(Box::new(d))
            }
            SharedDrafter::Model(m) => {
                Some(Box::new(DraftModelDrafter::new(m.clone(), n_vocab, n_ctx)?))
            }
        })
    }
}
