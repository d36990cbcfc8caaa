//! Shared helpers of the tests: real models, fixtures, and the f64
//! reference decoders' matrix-vector product and RMS norm.
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

/// `w · x` for a `{x.len(), rows}` f64 matrix (row `r` at `r·x.len()`).
pub fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    assert_eq!(w.len(), rows * cols);
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}

/// RMS norm of `x` (eps 1e-6, the synthetic models') times `w`.
pub fn rms(x: &[f64], w: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + 1e-6).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}
