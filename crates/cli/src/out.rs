//! Everything the commands print to stdout goes through here, so that a
//! closed pipe (`inspect M | head`) or a full disk (`> /dev/full`) is one
//! clean `error: cannot write to stdout: ...` in every command, never a
//! panic (`println!` panics on both; clippy's `print_stdout` lint keeps it
//! out of the crate). Warnings, progress and errors go to stderr.

use anyhow::{Context, Result};
use std::io::Write;

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// [`print`] of `text` and a newline.
pub fn println(text: impl std::fmt::Display) -> Result<()> {
    print(&format!("{text}\n"))
}

/// A flag or setting the command honours differently than asked (capped,
/// ignored): said on stderr, and the command goes on.
pub fn warn(message: impl std::fmt::Display) {
    eprintln!("warning: {message}");
}
