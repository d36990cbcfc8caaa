//! Writes a large model for load tests: `SOURCE`'s metadata and tensors
//! with its blocks repeated `TIMES` over (layer `i` is a copy of source
//! layer `i % n_layer`), as a split set of `PARTS` files, so it can be far
//! larger than memory or than wasm32's 4 GiB while each part is written
//! from memory. The result is a valid model (`{arch}.block_count` is
//! raised) whose output is whatever the repeated blocks compute.
//!
//!     cargo run --release -p blockdraft-gguf --example repeat_layers -- \
//!         SOURCE.gguf TIMES PARTS OUT_PREFIX

use blockdraft_gguf::{add_split_keys, split_name, GgufFile, GgufWriter, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, times, parts, prefix] = args.as_slice() else {
        return Err("usage: repeat_layers SOURCE.gguf TIMES PARTS OUT_PREFIX".into());
    };
    let (times, parts): (usize, usize) = (times.parse()?, parts.parse()?);
    let file = GgufFile::open(source)?;
    let arch = file.architecture()?.to_string();
    let key = format!("{arch}.block_count");
    let n_layer = file.metadata().get_usize(&key)?;

    // (new name, source name) of every tensor: the rest once, blocks repeated.
    let mut plan: Vec<(String, String)> = Vec::new();
    for t in file
        .tensors()
        .iter()
        .filter(|t| !t.name.starts_with("blk."))
    {
        plan.push((t.name.clone(), t.name.clone()));
    }
    for il in 0..n_layer * times {
        let src = il % n_layer;
        let prefix = format!("blk.{src}.");
        for t in file
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with(&prefix))
        {
            let rest = &t.name[prefix.len()..];
            plan.push((format!("blk.{il}.{rest}"), t.name.clone()));
        }
    }
    let per_part = plan.len().div_ceil(parts);
    let count = plan.len().div_ceil(per_part);
    let out = std::path::Path::new(prefix);
    let stem = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("bad prefix")?;
    for (no, chunk) in plan.chunks(per_part).enumerate() {
        let mut w = GgufWriter::new();
        if no == 0 {
            for (k, v) in file
                .metadata()
                .iter()
                .filter(|(k, _)| !k.starts_with("split."))
            {
                w.add(k, v.clone());
            }
            w.add(key.clone(), Value::U32((n_layer * times) as u32));
        }
        add_split_keys(&mut w, no as u32, count as u32, plan.len())?;
        for (name, src) in chunk {
            let t = file.tensor(src).ok_or("tensor vanished")?;
            w.add_tensor(
                name.clone(),
                &t.dims,
                t.ty,
                file.tensor_data(src)?.as_bytes(),
            )?;
        }
        let path = out.with_file_name(split_name(stem, no as u32 + 1, count as u32));
        w.write_file(&path)?;
        println!("{}", path.display());
    }
    Ok(())
}
