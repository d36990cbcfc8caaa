//! `blockdraft split`: a GGUF file as a split set (`name-00001-of-0000N.gguf`,
//! …) in llama.cpp's gguf-split layout, e.g. to keep each file within a
//! host's or a browser cache's per-file size limit. Loading the first part
//! (natively or by URL in the browser) reads the whole set.

use crate::load::open_gguf;
use anyhow::{bail, Context, Result};
use blockdraft_gguf::{plan_split, split_name, split_part};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to split.
    pub model: PathBuf,
    /// Largest tensor data per part: bytes, or with a K, M or G suffix
    /// (powers of 1024). A larger tensor gets a part of its own.
    #[arg(long = "max-size", value_parser = parse_size)]
    pub max_size: u64,
    /// Path prefix of the parts (default: the model's path without `.gguf`).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_uppercase()),
        _ => (s, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return Err(format!("unknown size unit {unit:?} (use K, M or G)")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 500M"))?;
    n.checked_mul(1 << shift)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a positive size that fits in 64 bits"))
}

pub fn run(args: Args) -> Result<()> {
    let file = open_gguf(&args.model)?;
    let prefix = match args.output {
        Some(p) => p,
        None => args.model.with_extension(""),
    };
    let (dir, stem) = match (prefix.parent(), prefix.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(stem)) => (dir.to_path_buf(), stem.to_string()),
        _ => bail!("the output prefix {} has no file name", prefix.display()),
    };
    let plan = plan_split(file.tensors(), args.max_size);
    let count = u32::try_from(plan.len()).context("too many parts")?;
    let mut parts = Parts::default();
    let mut listing = String::new();
    for (no, range) in plan.into_iter().enumerate() {
        let path = dir.join(split_name(&stem, no as u32 + 1, count));
        let n = range.len();
        let temp = parts.add(&path)?;
        split_part(&file, range, no as u32, count)?
            .write_file(&temp)
            .context("cannot write a part")?;
        listing.push_str(&format!("{} ({n} tensors)\n", path.display()));
    }
    parts.commit()?;
    crate::out::print(&listing)
}

/// The parts of a set being written: each goes to a temporary name beside
/// its own and all are renamed once every one is complete, so that a
/// failure (a full disk, a bad path, an interrupted write) never leaves a
/// partial set that would look like a whole one. Dropped uncommitted, it
/// removes what it wrote.
#[derive(Default)]
struct Parts {
    /// (temporary, final) paths.
    paths: Vec<(PathBuf, PathBuf)>,
    /// How many of them are renamed.
    renamed: usize,
    committed: bool,
}

impl Parts {
    /// The temporary path to write `path` to.
    fn add(&mut self, path: &Path) -> Result<PathBuf> {
        let mut name = path
            .file_name()
            .context("a part has no file name")?
            .to_os_string();
        name.push(".tmp");
        let temp = path.with_file_name(name);
        self.paths.push((temp.clone(), path.to_path_buf()));
        Ok(temp)
    }

    fn commit(mut self) -> Result<()> {
        for (temp, path) in &self.paths {
            std::fs::rename(temp, path).with_context(|| {
                format!("cannot rename {} to {}", temp.display(), path.display())
            })?;
            self.renamed += 1;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (i, (temp, path)) in self.paths.iter().enumerate() {
            let _ = std::fs::remove_file(if i < self.renamed { path } else { temp });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "M", "5X", "-1K", "0", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
