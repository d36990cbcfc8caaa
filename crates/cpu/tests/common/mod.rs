//! Shared helpers of the real-model tests.
// Each test binary uses a subset of these.
#![allow(dead_code)]

use std::path::PathBuf;

/// Path of a real model from `tests/fetch_models.sh`. A missing model fails
/// the test with instructions, unless `BLOCKDRAFT_SKIP_MODEL_TESTS=1`, in
/// which case `None` is returned and the caller skips.
pub fn model(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("BLOCKDRAFT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/blockdraft/models")
        });
    let path = dir.join(file);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("BLOCKDRAFT_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "SKIP: {} missing and BLOCKDRAFT_SKIP_MODEL_TESTS=1",
            path.display()
        );
        return None;
    }
    panic!("{} is missing: run tests/fetch_models.sh (or set BLOCKDRAFT_SKIP_MODEL_TESTS=1 to skip real-model tests)", path.display());
}

/// A committed fixture under the workspace's tests/fixtures.
pub fn fixture(rel: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

/// A committed DFlash GGUF fixture under tests/fixtures/dflash.
pub fn fixture_file(name: &str) -> blockdraft_gguf::GgufFile {
    blockdraft_gguf::GgufFile::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/dflash")
            .join(name),
    )
    .unwrap()
}

pub fn flat(v: &serde_json::Value) -> Vec<f32> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(flat).collect(),
        serde_json::Value::Number(n) => vec![n.as_f64().unwrap() as f32],
        other => panic!("not a number array: {other}"),
    }
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Max |a − b| relative to the largest |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}
