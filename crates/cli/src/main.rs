//! `blockdraft`: generate, tokenize, score, benchmark, inspect and split GGUF
//! models; convert HF drafter checkpoints.

mod chat;
mod commands;
mod drafter;
mod load;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "blockdraft",
    version,
    about = "Speculative LLM decoding with block drafters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(commands::run::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(commands::tokenize::Args),
    /// Forced decoding of given token ids: argmax and log-prob per position.
    Score(commands::score::Args),
    /// Prefill and decode speed, verify cost curve, peak memory.
    Bench(commands::bench::Args),
    /// Metadata, tensors, types and sizes of a GGUF file.
    Inspect(commands::inspect::Args),
    /// Convert an HF DFlash/DFlash2/DFly drafter checkpoint to GGUF.
    Convert(commands::convert::Args),
    /// Write a GGUF file as a split set (gguf-split layout).
    Split(commands::split::Args),
    /// Drafter training data: the target's greedy answers to prompts, with
    /// the hidden-state taps a drafter reads.
    GenData(commands::gen_data::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => commands::run::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Score(a) => commands::score::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Convert(a) => commands::convert::run(a),
        Command::Split(a) => commands::split::run(a),
        Command::GenData(a) => commands::gen_data::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
