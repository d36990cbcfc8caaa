//! The kernels' block decoding, checked on the host without a GPU:
//! `host/decode_check.cpp` compiles embed.cu and matmul.cu as C++ (with
//! `host/shim.h` standing in for CUDA) and compares their decoding with the
//! reference dequantizer on random blocks of every weight type, quant bytes
//! scrambled so that every bit pattern of the packed fields occurs. Needs a
//! C++ compiler with `_Float16` (g++ 12 or clang); without one it says
//! SKIPPED.

use blockdraft_gguf::{quants, GgmlType};
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The order of the types in decode_check.cpp's table.
const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// Byte ranges of a block that hold its float scales (left alone, so that
/// scrambling makes no NaN or infinite scale).
fn is_scale(ty: GgmlType, k: usize) -> bool {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => k < 2,
        T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4_K | T::Q5_K | T::Q8_K => k < 4,
        T::Q2_K => k >= 80,
        T::Q3_K => k >= 108,
        T::Q6_K => k >= 208,
        _ => true,
    }
}

/// Each type: id, block count, byte length, the bytes, their reference
/// dequantization.
fn write_blocks(path: &Path) {
    let mut state = 0x1234_5678u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut f = std::fs::File::create(path).expect("blocks file");
    for (id, ty) in TYPES.into_iter().enumerate() {
        let blocks = 64;
        let (len, size) = (ty.block_len(), ty.block_bytes());
        let x: Vec<f32> = (0..blocks * len)
            .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
            .collect();
        let mut bytes = quants::quantize_to_vec(ty, &x).expect("quantize");
        if len > 1 {
            for (k, b) in bytes.iter_mut().enumerate() {
                let r = next();
                if r % 3 == 0 && !is_scale(ty, k % size) {
                    *b ^= (r >> 8) as u8;
                }
            }
        }
        let deq = quants::dequantize_to_vec(ty, &bytes).expect("dequantize");
        for v in [id as u32, blocks as u32, bytes.len() as u32] {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f.write_all(&bytes).unwrap();
        for v in deq {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
    }
}

#[test]
fn kernel_block_decoding_equals_the_reference_dequantizer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = std::env::temp_dir().join(format!("blockdraft-cuda-decode-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let exe = tmp.join("decode_check");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // No FMA contraction, as the kernels are compiled (--fmad=false).
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-ffp-contract=off", "-w", "-I"])
        .arg(dir.join("kernels"))
        .arg(dir.join("tests/host/decode_check.cpp"))
        .arg("-o")
        .arg(&exe)
        .status();
    match built {
        Ok(s) if s.success() => {}
        other => {
            eprintln!("SKIPPED: no C++ compiler with _Float16 ({cxx}: {other:?})");
            return;
        }
    }
    let blocks = tmp.join("blocks.bin");
    write_blocks(&blocks);
    let out = Command::new(&exe)
        .arg(&blocks)
        .output()
        .expect("run decode_check");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(out.status.success() && text.contains("ALL OK"), "{text}");
}
