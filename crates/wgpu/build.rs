//! Copies the WGSL sources (`shaders/*.wgsl`) into OUT_DIR without their
//! comments and indentation, which are a quarter of their bytes, for
//! `src/shaders.rs` to compile in: the browser downloads every byte of the
//! module. Lines stay where they were, so naga's and the browsers' error
//! positions still point into the files.

use std::path::Path;

fn main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders");
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("shaders");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/shaders");
    println!("cargo:rerun-if-changed={}", src.display());
    for entry in std::fs::read_dir(&src).expect("read shaders/") {
        let path = entry.expect("shaders/ entry").path();
        if path.extension().is_some_and(|e| e == "wgsl") {
            println!("cargo:rerun-if-changed={}", path.display());
            let text = std::fs::read_to_string(&path).expect("read a shader");
            let name = path.file_name().expect("file name");
            std::fs::write(out.join(name), strip(&text)).expect("write a shader");
        }
    }
}

/// Each line without its `//` comment (WGSL has no string literals, so
/// `//` always starts one) and surrounding whitespace.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let code = line.split_once("//").map_or(line, |(code, _)| code);
        out.push_str(code.trim());
        out.push('\n');
    }
    out
}
