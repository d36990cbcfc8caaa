//! Shared helpers of the real-model tests.
// Each test binary uses a subset of these.
#![allow(dead_code)]

use std::path::PathBuf;

/// Path of a real model (see [`blockdraft_core::testing::real_model`]).
pub fn model(file: &str) -> Option<PathBuf> {
    blockdraft_core::testing::real_model(file)
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
