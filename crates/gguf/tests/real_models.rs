//! Reads real GGUF files when they are on this machine (skipped otherwise):
//! the test models from `tests/fetch_models.sh` (`$BLOCKDRAFT_MODELS`, default
//! `~/.cache/blockdraft/models`) and any llama.cpp vocab files in
//! `$BLOCKDRAFT_LLAMA_CPP/models` (default `/work/llama.cpp/models`).

use std::path::PathBuf;

use blockdraft_gguf::{GgufFile, GgufStreamReader};

fn models() -> Vec<PathBuf> {
    let dir = std::env::var_os("BLOCKDRAFT_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/blockdraft/models"))
        });
    gguf_files(dir)
}

fn gguf_files(dir: Option<PathBuf>) -> Vec<PathBuf> {
    let Some(dir) = dir else { return vec![] };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    v
}

#[test]
fn real_models_open_and_decode() {
    for p in models() {
        let f = GgufFile::open(&p).unwrap();
        let arch = f.architecture().unwrap().to_string();
        let n_layers = f
            .metadata()
            .get_u32(&format!("{arch}.block_count"))
            .unwrap();
        assert!(n_layers > 0);
        let toks = f.metadata().get_str_array("tokenizer.ggml.tokens").unwrap();
        assert!(toks.len() > 1000, "{}", p.display());
        // Decode the smallest and the first quantized tensors of each type.
        let mut seen = std::collections::HashSet::new();
        for t in f.tensors() {
            if seen.insert(t.ty) {
                let d = f.tensor_data(&t.name).unwrap().to_f32().unwrap();
                assert!(
                    d.iter().all(|x| x.is_finite()),
                    "{} {}",
                    p.display(),
                    t.name
                );
                assert!(d.iter().any(|&x| x != 0.0), "{} {}", p.display(), t.name);
            }
        }
        eprintln!(
            "{}: {arch}, {} tensors, types {seen:?}",
            p.display(),
            f.tensors().len()
        );
    }
}

#[test]
fn real_model_streams_like_mmap() {
    let Some(p) = models()
        .into_iter()
        .min_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX))
    else {
        return;
    };
    let f = GgufFile::open(&p).unwrap();
    let bytes = f.bytes();
    let mut r = GgufStreamReader::new().with_total_len(bytes.len() as u64);
    let mut n = 0u64;
    for c in bytes.chunks(65536 + 13) {
        for piece in r.push(c).unwrap() {
            let t = f.tensor_data_at(piece.tensor_index).unwrap();
            let o = piece.offset_in_tensor as usize;
            assert_eq!(&t[o..o + piece.len()], &piece[..]);
            n += piece.len() as u64;
        }
    }
    let h = r.finish().unwrap().header;
    assert_eq!(&h.metadata, f.metadata());
    assert_eq!(n, f.tensors().iter().map(|t| t.n_bytes).sum::<u64>());
}

#[test]
fn llama_cpp_vocab_files_parse() {
    let dir = std::env::var_os("BLOCKDRAFT_LLAMA_CPP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/llama.cpp"))
        .join("models");
    for p in gguf_files(Some(dir)) {
        let f = GgufFile::open(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(!f.metadata().is_empty());
    }
}
