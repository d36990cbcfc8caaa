//! Carries a model's shape to a machine the model itself cannot reach (the
//! GPU machine takes 64 MiB per call; Qwen2.5-Coder-0.5B is 469 MB).
//!
//! `strip SOURCE OUT` keeps all of SOURCE's metadata (tokenizer included)
//! and every tensor's name, type and shape, but only its first
//! `KEPT_ROWS` rows of data; the full shape goes into a `skeleton.dims.*`
//! key. `inflate SKELETON OUT` writes a full-size model again, each tensor
//! filled by repeating its kept rows. The result loads and runs exactly as
//! the source does (same types, shapes, vocabulary, bytes per token), so
//! its timings are the source's; its outputs are meaningless.
//!
//!     cargo run --release -p blockdraft-gguf --example skeleton -- strip SOURCE.gguf OUT.gguf
//!     skeleton inflate OUT.gguf FULL.gguf

use blockdraft_gguf::{GgufFile, GgufWriter, Value};

/// Rows of data kept per tensor: a few distinct rows, so inflated matrices
/// are not one row repeated.
const KEPT_ROWS: u64 = 16;
const DIMS_KEY: &str = "skeleton.dims.";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [mode, src, out] if mode == "strip" => strip(src, out),
        [mode, src, out] if mode == "inflate" => inflate(src, out),
        _ => Err("usage: skeleton strip|inflate SOURCE OUT".into()),
    }
}

fn row_bytes(t: &blockdraft_gguf::TensorInfo) -> Result<u64> {
    let row = *t.dims.first().ok_or("a tensor without dimensions")?;
    Ok(t.ty
        .bytes_for(row)
        .ok_or("a row not made of whole blocks")?)
}

fn strip(src: &str, out: &str) -> Result<()> {
    let file = GgufFile::open(src)?;
    let mut w = GgufWriter::new();
    w.add_all(file.metadata());
    for t in file.tensors() {
        let rows: u64 = t.dims.iter().skip(1).product();
        let kept = rows.min(KEPT_ROWS);
        let data = file.tensor_data(&t.name)?;
        let bytes = &data.as_bytes()[..(row_bytes(t)? * kept) as usize];
        let dims = t.dims.iter().map(u64::to_string).collect::<Vec<_>>();
        w.add(format!("{DIMS_KEY}{}", t.name), dims.join(","));
        w.add_tensor(t.name.clone(), &[t.dims[0], kept], t.ty, bytes)?;
    }
    w.write_file(out)?;
    Ok(())
}

fn inflate(src: &str, out: &str) -> Result<()> {
    let file = GgufFile::open(src)?;
    let mut w = GgufWriter::new();
    for (k, v) in file
        .metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with(DIMS_KEY))
    {
        w.add(k, v.clone());
    }
    for t in file.tensors() {
        let key = format!("{DIMS_KEY}{}", t.name);
        let Some(Value::String(dims)) = file.metadata().get(&key) else {
            return Err(format!("{key} is missing: not a skeleton").into());
        };
        let dims: Vec<u64> = dims
            .split(',')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()?;
        let total = t.ty.bytes_for(dims.iter().product()).ok_or("bad shape")? as usize;
        let kept = file.tensor_data(&t.name)?;
        let data: Vec<u8> = kept
            .as_bytes()
            .iter()
            .copied()
            .cycle()
            .take(total)
            .collect();
        w.add_tensor(t.name.clone(), &dims, t.ty, data)?;
    }
    w.write_file(out)?;
    Ok(())
}
