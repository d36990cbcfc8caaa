//! The kernels run on the host without a GPU: `host/*.cpp` compile the
//! kernel files as C++20 with `host/emulator.h` standing in for CUDA (warps
//! and blocks as host threads in step). `decode_check.cpp` compares the
//! block decoding of embed.cu and matmul.cu with the reference dequantizer
//! on random blocks of every weight type, quant bytes scrambled so that every
//! bit pattern of the packed fields occurs; `kernels_check.cpp` runs whole
//! kernels against straightforward references. What this cannot see is the
//! device itself (its compiler's code, its float functions, the launches
//! from Rust): that is the conformance suite's part on a GPU. Needs a C++
//! compiler with `_Float16` and `<barrier>` (g++ 12 or clang 16); without
//! one the tests say SKIPPED.

use blockdraft_gguf::{quants, GgmlType};
use std::io::Write;
use std::path::Path;
use std::process::Command;

// The weight types the backends must read, in the order of
// decode_check.cpp's table.
use blockdraft_core::conformance::WEIGHT_TYPES as TYPES;

/// Byte ranges of a block that hold its float scales (left alone, so that
/// scrambling makes no NaN or infinite scale).
fn is_scale(ty: GgmlType, k: usize) -> bool {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => k < 2,
        T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4_K | T::Q5_K | T::Q8_K => k < 4,
        T::Q2_K => k >= 80,
        T::Q3_K => k >= 108,
        T::Q6_K => k >= 208,
        T::TQ1_0 => k >= 52,
        T::TQ2_0 => k >= 64,
        T::MXFP4 => k < 1,
        _ => true,
    }
}

/// Each type: id, block count, byte length, the bytes, their reference
/// dequantization. Quantized blocks with their quant bytes scrambled, or
/// for the read-only types (`quants::can_quantize`) random bytes with a
/// finite scale: either way every bit pattern of the packed fields occurs.
fn write_blocks(path: &Path) {
    let mut state = 0x1234_5678u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut f = std::fs::File::create(path).expect("blocks file");
    for (id, &ty) in TYPES.iter().enumerate() {
        let blocks = 64;
        let (len, size) = (ty.block_len(), ty.block_bytes());
        let mut bytes = if quants::can_quantize(ty) {
            let x: Vec<f32> = (0..blocks * len)
                .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                .collect();
            quants::quantize_to_vec(ty, &x).expect("quantize")
        } else {
            // NVFP4's E4M3 scales are all finite: any byte will do.
            let mut bytes: Vec<u8> = (0..blocks * size).map(|_| next() as u8).collect();
            for b in bytes.chunks_exact_mut(size) {
                let d = (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                quants::lattice::set_scale(ty, b, d);
            }
            bytes
        };
        if len > 1 {
            for (k, b) in bytes.iter_mut().enumerate() {
                let r = next();
                if r % 3 == 0 && !is_scale(ty, k % size) {
                    *b ^= (r >> 8) as u8;
                }
            }
        }
        if ty == GgmlType::MXFP4 {
            // Exponents from the subnormal ones (0, 1) up to 2^71: all finite.
            for b in bytes.chunks_exact_mut(size) {
                b[0] = (next() % 200) as u8;
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

/// Builds `host/{name}.cpp` into a temporary folder; `None` (after a
/// SKIPPED line) without a suitable C++ compiler.
fn build(name: &str, tmp: &Path) -> Option<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = tmp.join(name);
    // The lattice grids, as NVRTC gets them between common.cuh and a file.
    std::fs::write(
        tmp.join("grids.cuh"),
        blockdraft_cuda::compile::grids_source(),
    )
    .expect("grids.cuh");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // No FMA contraction, as the kernels are compiled (--fmad=false).
    let built = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-ffp-contract=off",
            "-w",
            "-pthread",
            "-I",
        ])
        .arg(dir.join("kernels"))
        .arg("-I")
        .arg(tmp)
        .arg(dir.join("tests/host").join(format!("{name}.cpp")))
        .arg("-o")
        .arg(&exe)
        .status();
    match built {
        Ok(s) if s.success() => Some(exe),
        other => {
            eprintln!("SKIPPED: no C++20 compiler with _Float16 ({cxx}: {other:?})");
            None
        }
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let tmp = std::env::temp_dir().join(format!("blockdraft-cuda-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    tmp
}

/// Runs `exe` with `args`; fails unless it passes and says ALL OK.
fn run_check(exe: &Path, args: &[&Path]) {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("run the check");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success() && text.contains("ALL OK"), "{text}");
}

#[test]
fn kernel_block_decoding_equals_the_reference_dequantizer() {
    let tmp = temp_dir("decode");
    let Some(exe) = build("decode_check", &tmp) else {
        return;
    };
    let blocks = tmp.join("blocks.bin");
    write_blocks(&blocks);
    run_check(&exe, &[&blocks]);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn kernels_on_the_host_agree_with_their_references() {
    let tmp = temp_dir("kernels");
    let Some(exe) = build("kernels_check", &tmp) else {
        return;
    };
    run_check(&exe, &[]);
    let _ = std::fs::remove_dir_all(&tmp);
}
