pub mod bench;
pub mod convert;
pub mod inspect;
pub mod run;
pub mod score;
pub mod split;
pub mod tokenize;
