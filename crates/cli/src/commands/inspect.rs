//! `blockdraft inspect`: what a GGUF file holds.

use crate::load::open_gguf;
use anyhow::Result;
use blockdraft_gguf::Value;

#[derive(clap::Args)]
pub struct Args {
    /// Path to a GGUF file.
    pub model: std::path::PathBuf,
    /// Print every element of long arrays.
    #[arg(long = "full")]
    pub full: bool,
}

fn show(v: &Value, full: bool) -> String {
    match v {
        Value::Array(a) if !full && a.len() > 8 => {
            let head: Vec<String> = (0..4)
                .filter_map(|i| a.get(i))
                .map(|e| show(&e, false))
                .collect();
            format!(
                "[{}, ... {} {} elements]",
                head.join(", "),
                a.len(),
                a.elem_type().name()
            )
        }
        Value::Array(a) => format!(
            "[{}]",
            (0..a.len())
                .filter_map(|i| a.get(i))
                .map(|e| show(&e, full))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::String(s) if !full && s.len() > 120 => format!(
            "{:?}... ({} bytes)",
            &s[..s.floor_char_boundary(100)],
            s.len()
        ),
        Value::String(s) => format!("{s:?}"),
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}

pub fn run(args: Args) -> Result<()> {
    let file = open_gguf(&args.model)?;
    let mut out = String::new();
    let mut line = |l: String| {
        out.push_str(&l);
        out.push('\n');
    };
    line(format!(
        "GGUF v{}  alignment {}  data at {}",
        file.version(),
        file.alignment(),
        file.data_offset()
    ));
    line(format!("\nmetadata ({} keys):", file.metadata().len()));
    for (k, v) in file.metadata().iter() {
        line(format!("  {k:<45} {}", show(v, args.full)));
    }
    let mut by_type: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    line(format!("\ntensors ({}):", file.tensors().len()));
    for t in file.tensors() {
        line(format!(
            "  {:<40} {:<6} {:<24} {:>12} B",
            t.name,
            t.ty.name(),
            format!("{:?}", t.dims),
            t.n_bytes
        ));
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    line("\nby type:".into());
    let mut total = 0;
    for (ty, (n, bytes)) in by_type {
        line(format!(
            "  {ty:<6} {n:>5} tensors {:>10.1} MB",
            bytes as f64 / 1e6
        ));
        total += bytes;
    }
    line(format!(
        "  total              {:>10.1} MB",
        total as f64 / 1e6
    ));
    crate::out::print(&out)
}
