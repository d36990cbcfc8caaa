//! `blockdraft`: generate, tokenize, score, benchmark, inspect and split GGUF
//! models; convert HF drafter checkpoints.

// Stdout is written through `out`, which turns a closed pipe into an error.
#![warn(clippy::print_stdout)]

mod args;
mod chat;
mod commands;
mod drafter;
mod interrupt;
mod load;
mod out;
mod progress;

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

// Every subcommand takes negative numbers as values, so that `--temp -1`
// gets the range check's message rather than "unexpected argument".
#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    // A later flag overrides an earlier one, so a script's defaults
    // (examples/generate.sh) can be overridden by its caller's flags.
    #[command(allow_negative_numbers = true, args_override_self = true)]
    Run(commands::run::Args),
    /// Print the token ids of a text as a JSON array.
    #[command(allow_negative_numbers = true)]
    Tokenize(commands::tokenize::Args),
    /// Forced decoding of given token ids: argmax and log-prob per position.
    #[command(allow_negative_numbers = true)]
    Score(commands::score::Args),
    /// Prefill and decode speed, verify cost curve, peak memory.
    #[command(allow_negative_numbers = true)]
    Bench(commands::bench::Args),
    /// Metadata, tensors, types and sizes of a GGUF file.
    #[command(allow_negative_numbers = true)]
    Inspect(commands::inspect::Args),
    /// Convert an HF DFlash/DFlash2/DFly drafter checkpoint to GGUF (with the
    /// target's tokenizer), or write a drafter GGUF again with or without it.
    #[command(allow_negative_numbers = true)]
    Convert(commands::convert::Args),
    /// Write a GGUF file as a split set (gguf-split layout).
    #[command(allow_negative_numbers = true)]
    Split(commands::split::Args),
    /// Drafter training data: the target's greedy answers to prompts, with
    /// the hidden-state taps a drafter reads.
    #[command(allow_negative_numbers = true)]
    GenData(commands::gen_data::Args),
    /// An OpenAI-compatible HTTP server: /v1/chat/completions,
    /// /v1/completions, /v1/models, /health, /metrics.
    #[command(allow_negative_numbers = true)]
    Serve(commands::serve::Args),
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
        Command::Serve(a) => commands::serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.is::<interrupt::Interrupted>() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `run`: a later flag overrides an earlier one (examples/generate.sh
    /// sets defaults its caller may override); repeatable flags add up.
    #[test]
    fn a_later_run_flag_overrides_an_earlier_one() {
        let cli = Cli::try_parse_from([
            "blockdraft",
            "run",
            "-m",
            "m.gguf",
            "-p",
            "hi",
            "--temp",
            "0.8",
            "--draft",
            "drafter.gguf",
            "--stop",
            "a",
            "--temp",
            "0",
            "--draft",
            "ngram",
            "--stop",
            "b",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let Command::Run(args) = cli.command else {
            panic!("not a run");
        };
        assert_eq!(args.temperature, 0.0);
        assert_eq!(args.draft.draft.as_deref(), Some("ngram"));
        assert_eq!(args.stop, ["a", "b"]);
    }
}
