//! Models loaded as their bytes arrive (`StreamingLoad`, the browser's
//! path), whole or as split sets, decode exactly like the same model read
//! from a file; broken streams are typed errors.

mod common;

use blockdraft_core::model::{Decoder, ModelConfig, StreamingLoad};
use blockdraft_core::speculative::{DFlashDrafter, PolicyConfig};
use blockdraft_core::testing::{greedy_plain, greedy_speculative};
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{split_part, ErrorKind, GgufFile};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// Streams `parts` (each a whole file) in `chunk`-byte pieces.
fn stream(parts: &[Vec<u8>], chunk: usize) -> Result<Decoder<CpuBackend>, ModelError> {
    let be = Arc::new(CpuBackend::new(2));
    let mut load = StreamingLoad::new(be.clone());
    for p in parts {
        load.begin_part(Some(p.len() as u64))?;
        for c in p.chunks(chunk) {
            load.push(c)?;
        }
        load.end_part()?;
    }
    let mut model = load.finish()?;
    let config = ModelConfig::from_metadata(&model.metadata)?;
    Decoder::load_with_config(config, &mut model, None, be, &mut |_| {})
}

fn split_fixture() -> Vec<Vec<u8>> {
    (1..=3)
        .map(|no| {
            std::fs::read(fixture_path(&format!(
                "gguf/split/target-qwen3-{no:05}-of-00003.gguf"
            )))
            .unwrap()
        })
        .collect()
}

#[test]
fn a_split_set_streamed_decodes_like_the_whole_file() {
    let whole_path = fixture_path("dflash/target-qwen3.gguf");
    let whole = GgufFile::open(&whole_path).unwrap();
    let dec = Decoder::load(&whole, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    let prompt = [5u32, 17, 200, 3, 42, 99, 7, 130];
    let expected = greedy_plain(&dec, &prompt, 24);

    // Chunk sizes that split headers and tensors anywhere.
    for chunk in [1 << 20, 4099, 777] {
        let streamed = stream(&split_fixture(), chunk).unwrap();
        assert_eq!(
            greedy_plain(&streamed, &prompt, 24),
            expected,
            "chunk {chunk}"
        );
    }
    let streamed = stream(&[std::fs::read(&whole_path).unwrap()], 1000).unwrap();
    assert_eq!(greedy_plain(&streamed, &prompt, 24), expected);

    // A DFlash drafter without embeddings borrows the streamed target's.
    let streamed = stream(&split_fixture(), 4099).unwrap();
    let drafter_file = common::fixture_file("dflash-v1.gguf");
    let mut drafter = DFlashDrafter::load(&drafter_file, &streamed, prompt.len() + 64, 32).unwrap();
    let (tokens, stats) =
        greedy_speculative(&streamed, &mut drafter, &prompt, 24, PolicyConfig::fixed(8));
    assert_eq!(tokens, expected);
    assert!(stats.rounds > 0);
}

#[test]
fn broken_streams_are_typed_errors() {
    let parts = split_fixture();
    let kind = |r: Result<Decoder<CpuBackend>, ModelError>| match r {
        Err(ModelError::Gguf(e)) => e.kind(),
        Err(e) => panic!("not a GGUF error: {e}"),
        Ok(_) => panic!("a broken stream loaded"),
    };
    // Out of order, a part missing, a part twice.
    let reordered = [parts[1].clone(), parts[0].clone(), parts[2].clone()];
    assert_eq!(kind(stream(&reordered, 4096)), ErrorKind::Split);
    assert_eq!(kind(stream(&parts[..2], 4096)), ErrorKind::Split);
    let twice = [parts[0].clone(), parts[1].clone(), parts[1].clone()];
    assert_eq!(kind(stream(&twice, 4096)), ErrorKind::DuplicateTensor);
    // A part cut short, and bytes that are no GGUF.
    let be = Arc::new(CpuBackend::new(1));
    let mut load = StreamingLoad::new(be.clone());
    load.begin_part(Some(parts[0].len() as u64)).unwrap();
    load.push(&parts[0][..parts[0].len() - 100]).unwrap();
    let Err(ModelError::Gguf(e)) = load.end_part() else {
        panic!("a truncated part ended");
    };
    assert_eq!(e.kind(), ErrorKind::Truncated);
    let mut load = StreamingLoad::new(be);
    load.begin_part(None).unwrap();
    let Err(ModelError::Gguf(e)) = load.push(&[7u8; 64]) else {
        panic!("garbage was accepted");
    };
    assert_eq!(e.kind(), ErrorKind::BadMagic);
}

/// `file` as a split set of `n` parts (the gguf crate's writer).
fn split(file: &GgufFile, n: usize) -> Vec<Vec<u8>> {
    let per_part = file.tensors().len().div_ceil(n);
    (0..n)
        .map(|i| {
            let range = i * per_part..((i + 1) * per_part).min(file.tensors().len());
            split_part(file, range, i as u32, n as u32)
                .unwrap()
                .to_bytes()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_real_model_streamed_in_split_parts_decodes_like_the_file() {
    let Some(path) = common::model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let dec = Decoder::load(&file, Arc::new(CpuBackend::new(2)), &mut |_| {}).unwrap();
    let prompt = Tokenizer::from_gguf(&file)
        .unwrap()
        .encode("The capital of France is", true, false)
        .unwrap();
    let expected = greedy_plain(&dec, &prompt, 16);
    let streamed = stream(&split(&file, 3), (1 << 20) - 3).unwrap();
    assert_eq!(greedy_plain(&streamed, &prompt, 16), expected);
}
