//! Speculative decoding: a proposer drafts, the target verifies the whole
//! draft in one multi-row pass, the verifier accepts a prefix, and both
//! memories commit the accepted rows. Split as mature runtimes do:
//! [`proposer`] (drafters), [`verifier`] (acceptance), [`policy`] (draft
//! length) and [`stats`]; the round itself is a step of
//! [`crate::engine`], which drives plain and speculative sequences alike.

pub mod policy;
pub mod proposer;
pub mod stats;
pub mod verifier;

pub use crate::engine::generate_speculative;
pub use policy::{DraftPolicy, PolicyConfig, MAX_DRAFT};
pub use proposer::{error_rate_for_tau, ForcedDrafter};
pub use proposer::{
    DFlash2Config, DFlashConfig, DFlashDrafter, DFlashModel, DFlashVariant, Draft,
    DraftModelDrafter, Drafter, Lattice, NgramDrafter, OracleDrafter, SharedDrafter,
    CATCH_UP_WINDOW,
};
pub use stats::{RoundStats, SpecStats};
