//! Speculative decoding: a proposer drafts, the target verifies the whole
//! draft in one multi-row pass, the verifier accepts a prefix, and both
//! caches roll back to the accepted length. Split as mature runtimes do:
//! [`proposer`] (drafters), [`verifier`] (acceptance), [`policy`] (draft
//! length), and [`engine`] (the round loop).

pub mod engine;
pub mod policy;
pub mod proposer;
pub mod verifier;

pub use engine::{generate_speculative, RoundStats, SpecStats};
pub use policy::{DraftPolicy, PolicyConfig, MAX_DRAFT};
pub use proposer::{error_rate_for_tau, ForcedDrafter};
pub use proposer::{
    DFlash2Config, DFlashConfig, DFlashDrafter, Draft, DraftModelDrafter, Drafter, Lattice,
    NgramDrafter, OracleDrafter, CATCH_UP_WINDOW,
};
