pub mod bench;
pub mod convert;
pub mod gen_data;
pub mod inspect;
pub mod run;
pub mod score;
pub mod split;
pub mod tokenize;
