//! Split GGUF sets (`model-00001-of-00003.gguf`, …) as llama.cpp's
//! `gguf-split` writes them: every part is a complete GGUF file; the first
//! holds the model's metadata, every part holds `split.no` (0-based),
//! `split.count` and `split.tensors.count` (tensors in the whole set), and
//! the tensors are spread over the parts in order.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::parse::{TensorInfo, ALIGNMENT_KEY};
use crate::value::{Metadata, Value};
use crate::{GgufFile, GgufWriter};

pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The split keys of one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    /// 0-based index of this part.
    pub no: u32,
    /// Parts in the set.
    pub count: u32,
    /// Tensors in the whole set.
    pub tensors: u64,
}

impl SplitInfo {
    /// The split keys of `metadata`; `None` for a file outside any split set
    /// (no `split.count`, or a count of 1).
    pub fn from_metadata(metadata: &Metadata) -> Result<Option<SplitInfo>> {
        if !metadata.contains_key(SPLIT_COUNT) {
            return Ok(None);
        }
        let info = SplitInfo {
            no: metadata.get_u32(SPLIT_NO)?,
            count: metadata.get_u32(SPLIT_COUNT)?,
            tensors: metadata.get_u64(SPLIT_TENSORS_COUNT)?,
        };
        if info.count <= 1 && info.no == 0 {
            return Ok(None);
        }
        if info.count == 0 || info.no >= info.count {
            return Err(GgufError::Split(format!(
                "part number {} is out of range for a set of {} parts",
                info.no, info.count
            )));
        }
        Ok(Some(info))
    }
}

/// Checks that `parts` — each file's split keys and tensor count, in the
/// order given — form one complete set (or are one ordinary file).
pub fn check_split_set(parts: &[(Option<SplitInfo>, usize)]) -> Result<()> {
    let bad = |m: String| Err(GgufError::Split(m));
    match parts {
        [] => return bad("no files".into()),
        [(None, _)] => return Ok(()),
        _ => {}
    }
    let n = parts.len();
    let mut tensors = 0u64;
    let mut expected = None;
    for (i, (info, count)) in parts.iter().enumerate() {
        let Some(info) = info else {
            return bad(format!(
                "file {} of {n} has no split keys ({SPLIT_NO}, {SPLIT_COUNT})",
                i + 1
            ));
        };
        if info.count as usize != n {
            return bad(format!(
                "file {} says the set has {} parts, but {n} were given",
                i + 1,
                info.count
            ));
        }
        if info.no as usize != i {
            return bad(format!(
                "file {} is part {} of the set; give the parts in order",
                i + 1,
                info.no + 1
            ));
        }
        let first = *expected.get_or_insert(info.tensors);
        if info.tensors != first {
            return bad(format!(
                "parts disagree on the number of tensors ({} vs {first})",
                info.tensors
            ));
        }
        tensors += *count as u64;
    }
    let expected = expected.expect("at least two parts");
    if tensors != expected {
        return bad(format!(
            "the parts hold {tensors} tensors, the set should have {expected}"
        ));
    }
    Ok(())
}

/// `(prefix, no, count)` of a split file name `prefix-0000N-of-0000M.gguf`
/// (1-based `no`); `None` for any other name.
pub fn parse_split_name(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    let (no, count) = (no.parse().ok()?, count.parse().ok()?);
    (1..=count).contains(&no).then_some((prefix, no, count))
}

/// The file name of part `no` (1-based) of `count`, as gguf-split names it.
pub fn split_name(prefix: &str, no: u32, count: u32) -> String {
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

/// The paths of every part of the set that `path` (any part) belongs to,
/// or `None` when its name is not a split name.
pub fn split_paths(path: &Path) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let (prefix, _, count) = parse_split_name(name)?;
    Some(
        (1..=count)
            .map(|no| path.with_file_name(split_name(prefix, no, count)))
            .collect(),
    )
}

/// The tensors of each part when `tensors` are split, in order, into parts
/// whose data stays within `max_bytes` (a larger tensor gets a part of its
/// own), as gguf-split's `--split-max-size` does.
pub fn plan_split(tensors: &[TensorInfo], max_bytes: u64) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, t) in tensors.iter().enumerate() {
        if i > start && bytes.saturating_add(t.n_bytes) > max_bytes {
            parts.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(t.n_bytes);
    }
    if start < tensors.len() || parts.is_empty() {
        parts.push(start..tensors.len());
    }
    parts
}

/// Adds the split keys of part `no` (0-based) of `count`, in a set of
/// `n_tensors` tensors, with the types gguf-split writes (u16, u16, i32).
pub fn add_split_keys(w: &mut GgufWriter, no: u32, count: u32, n_tensors: usize) -> Result<()> {
    let narrow = |what: &str, v: u32| {
        u16::try_from(v).map_err(|_| GgufError::Split(format!("{what} {v} exceeds 65535")))
    };
    w.add(SPLIT_NO, Value::U16(narrow("part number", no)?));
    w.add(SPLIT_COUNT, Value::U16(narrow("part count", count)?));
    let total =
        i32::try_from(n_tensors).map_err(|_| GgufError::Split(format!("{n_tensors} tensors")))?;
    w.add(SPLIT_TENSORS_COUNT, Value::I32(total));
    Ok(())
}

/// Part `no` (0-based) of `count` of `file`, holding the tensors `range`:
/// the first part also holds the metadata; every part the split keys.
pub fn split_part(file: &GgufFile, range: Range<usize>, no: u32, count: u32) -> Result<GgufWriter> {
    let tensors = file.tensors();
    let mut w = GgufWriter::new();
    if no == 0 {
        for (key, value) in file.metadata().iter() {
            if !key.starts_with("split.") {
                w.add(key, value.clone());
            }
        }
    }
    // Every part keeps a non-default alignment (the first has the key).
    if no != 0 && file.metadata().contains_key(ALIGNMENT_KEY) {
        let a = file.alignment();
        w.set_alignment(u32::try_from(a).map_err(|_| GgufError::BadAlignment { value: a })?)?;
    }
    add_split_keys(&mut w, no, count, tensors.len())?;
    for t in &tensors[range] {
        let data = file.tensor_data(&t.name)?;
        w.add_tensor(&t.name, &t.dims, t.ty, data.as_bytes())?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(no: u32, count: u32, tensors: u64) -> Option<SplitInfo> {
        Some(SplitInfo { no, count, tensors })
    }

    #[test]
    fn split_names_round_trip() {
        assert_eq!(
            parse_split_name("smollm2-00002-of-00003.gguf"),
            Some(("smollm2", 2, 3))
        );
        assert_eq!(split_name("a-b", 1, 12), "a-b-00001-of-00012.gguf");
        for bad in [
            "model.gguf",
            "m-00004-of-00003.gguf",
            "m-00000-of-00003.gguf",
            "m-1-of-3.gguf",
            "m-00001-of-00003.bin",
        ] {
            assert_eq!(parse_split_name(bad), None, "{bad}");
        }
        let paths = split_paths(Path::new("/m/x-00003-of-00003.gguf")).unwrap();
        assert_eq!(
            paths,
            [
                "/m/x-00001-of-00003.gguf",
                "/m/x-00002-of-00003.gguf",
                "/m/x-00003-of-00003.gguf"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn plans_keep_parts_within_the_size() {
        let t = |n_bytes: u64| TensorInfo {
            name: String::new(),
            dims: vec![n_bytes],
            ty: crate::GgmlType::I8,
            offset: 0,
            n_bytes,
        };
        let tensors: Vec<_> = [40, 50, 20, 100, 10, 10].map(t).into();
        assert_eq!(plan_split(&tensors, 100), [0..2, 2..3, 3..4, 4..6]);
        assert_eq!(plan_split(&tensors, 1000), vec![0..6]);
        assert_eq!(
            plan_split(&tensors, 1),
            [0..1, 1..2, 2..3, 3..4, 4..5, 5..6]
        );
        assert_eq!(plan_split(&[], 10), vec![0..0]);
    }

    #[test]
    fn sets_must_be_complete_and_in_order() {
        assert!(check_split_set(&[(None, 5)]).is_ok());
        assert!(check_split_set(&[(info(0, 2, 5), 3), (info(1, 2, 5), 2)]).is_ok());
        let fails = [
            vec![],
            vec![(info(0, 2, 5), 3)],
            vec![(info(1, 2, 5), 2), (info(0, 2, 5), 3)],
            vec![(info(0, 2, 5), 3), (info(1, 2, 5), 1)],
            vec![(info(0, 2, 5), 3), (None, 2)],
            vec![(info(0, 2, 5), 3), (info(1, 2, 6), 2)],
            vec![(info(0, 3, 5), 3), (info(1, 3, 5), 2)],
        ];
        for parts in fails {
            let e = check_split_set(&parts).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Split, "{parts:?}: {e}");
        }
    }
}
