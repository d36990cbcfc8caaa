//! Split GGUF sets written by llama.cpp's `gguf-split` read as the whole
//! file they came from; broken sets are typed errors.

use blockdraft_gguf::{ErrorKind, GgufFile, GgufStreamReader, SplitInfo};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn part(no: u32) -> PathBuf {
    fixture(&format!("gguf/split/target-qwen3-{no:05}-of-00003.gguf"))
}

#[test]
fn a_split_set_reads_as_the_whole_file() {
    let whole = GgufFile::open(fixture("dflash/target-qwen3.gguf")).unwrap();
    let split = GgufFile::open(part(1)).unwrap();
    assert_eq!(split.n_parts(), 3);
    assert_eq!(whole.n_parts(), 1);
    // The model's metadata is all in the first part.
    for (key, value) in whole.metadata().iter() {
        assert_eq!(split.metadata().get(key), Some(value), "{key}");
    }
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for t in whole.tensors() {
        let s = split.tensor(&t.name).unwrap();
        assert_eq!((s.ty, &s.dims), (t.ty, &t.dims), "{}", t.name);
        assert_eq!(
            &*split.tensor_data(&t.name).unwrap(),
            &*whole.tensor_data(&t.name).unwrap(),
            "{}",
            t.name
        );
    }
    // Every part carries the split keys.
    for no in 1..=3 {
        let p = std::fs::read(part(no)).unwrap();
        let info = SplitInfo::from_metadata(GgufFile::from_vec(p).unwrap().metadata())
            .unwrap()
            .unwrap();
        assert_eq!((info.no, info.count, info.tensors), (no - 1, 3, 68));
    }
}

#[test]
fn parts_in_memory_and_streamed_assemble_the_same_set() {
    let parts: Vec<GgufFile> = (1..=3)
        .map(|no| GgufFile::from_vec(std::fs::read(part(no)).unwrap()).unwrap())
        .collect();
    let from_memory = GgufFile::from_parts(parts.clone()).unwrap();
    let opened = GgufFile::open(part(1)).unwrap();
    for t in opened.tensors() {
        assert_eq!(
            &*from_memory.tensor_data(&t.name).unwrap(),
            &*opened.tensor_data(&t.name).unwrap()
        );
    }
    // Out of order, incomplete, or one part twice: typed errors.
    let bad_sets = [
        vec![parts[1].clone(), parts[0].clone(), parts[2].clone()],
        vec![parts[0].clone(), parts[1].clone()],
        vec![parts[0].clone(), parts[1].clone(), parts[1].clone()],
        vec![parts[0].clone(), parts[2].clone(), parts[1].clone()],
    ];
    for set in bad_sets {
        let e = GgufFile::from_parts(set).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Split, "{e}");
    }
    // A stream of one part parses like the part.
    let bytes = std::fs::read(part(2)).unwrap();
    let mut r = GgufStreamReader::new().with_total_len(bytes.len() as u64);
    for c in bytes.chunks(4096) {
        r.push(c).unwrap();
    }
    assert_eq!(r.finish().unwrap().header.tensors, parts[1].tensors());
}

#[test]
fn opening_a_later_part_or_a_set_with_a_missing_part_fails_clearly() {
    let e = GgufFile::open(part(2)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Split);
    assert!(e.to_string().contains("open the first part"), "{e}");

    let dir = std::env::temp_dir().join(format!("blockdraft-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = dir.join("m-00001-of-00003.gguf");
    std::fs::copy(part(1), &first).unwrap();
    std::fs::copy(part(2), dir.join("m-00002-of-00003.gguf")).unwrap();
    let e = GgufFile::open(&first).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("m-00003-of-00003.gguf"), "{e}");
    // A first part renamed away from the split naming cannot find the rest.
    let renamed = dir.join("renamed.gguf");
    std::fs::copy(part(1), &renamed).unwrap();
    let e = GgufFile::open(&renamed).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Split, "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
