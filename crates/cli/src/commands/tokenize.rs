//! `blockdraft tokenize`: token ids of a text as a JSON array.

use crate::load::{open_gguf, tokenizer};
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Path to a GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: std::path::PathBuf,
    /// Do not add BOS/EOS even where the model asks for them.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Match special-token text (e.g. `<|im_start|>`) as special tokens.
    #[arg(long = "parse-special")]
    pub parse_special: bool,
    /// The text to tokenize.
    pub text: String,
}

pub fn run(args: Args) -> Result<()> {
    let file = open_gguf(&args.model)?;
    let tok = tokenizer(&file)?;
    let ids = tok.encode(&args.text, !args.no_bos, args.parse_special)?;
    crate::out::println(serde_json::to_string(&ids)?)
}
