//! The CPU kernels of the types no registry model covers (the IQ1/IQ2/IQ3
//! lattice types, the ternary ones, MXFP4, NVFP4; and IQ4_NL with an odd
//! count of blocks, IQ4_XS) against llama.cpp's own
//! dot products on random rows (tests/fixtures/llamacpp/vec_dot.gguf, made
//! by tests/reference/make_vec_dot_fixtures.py through ggml-cpu's
//! `vec_dot`, activations quantized by llama.cpp too).
//!
//! Where blockdraft's x86 kernels follow ggml's AVX2 sequence the results
//! must be equal bit for bit (the matmul quantizes the activations itself,
//! so this covers its Q8_K / Q8_0 quantizers too); the portable kernels
//! follow ggml's generic sequence, which sums in another order, so they
//! are held to rounding.

use blockdraft_cpu::kernels::{matmul, simd_level, WeightRef};
use blockdraft_cpu::pool::ThreadPool;
use blockdraft_gguf::{GgmlType, GgufFile};
use std::path::PathBuf;

/// Types whose x86 kernels take ggml's AVX2 float sequence.
const AVX2_SEQUENCE: [GgmlType; 13] = [
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::NVFP4,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::MXFP4,
];

const TYPES: [GgmlType; 13] = [
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
];

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn kernels_equal_llamacpp_dot_products() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/llamacpp/vec_dot.gguf");
    let file = GgufFile::open(&path).unwrap();
    let x86_avx2 = cfg!(target_arch = "x86_64") && simd_level().starts_with("avx");
    if !x86_avx2 {
        eprintln!(
            "SKIPPED bit-equality: SIMD level {} runs the portable kernels here (held to rounding)",
            simd_level()
        );
    }
    let pool = ThreadPool::new(2);
    for ty in TYPES {
        let name = ty.name().to_lowercase();
        let w = file.tensor(&format!("{name}.w")).unwrap();
        let data = file.tensor_data(&format!("{name}.w")).unwrap();
        assert_eq!(w.ty, ty, "{name}");
        let (cols, rows) = (w.dims[0] as usize, w.dims[1] as usize);
        let x = f32s(&file.tensor_data(&format!("{name}.x")).unwrap());
        let want = f32s(&file.tensor_data(&format!("{name}.dot")).unwrap());
        let n = x.len() / cols;
        let mut got = vec![f32::NAN; n * rows];
        let weight = WeightRef {
            ty,
            data: &data,
            rows,
            cols,
        };
        matmul(&pool, &weight, &x, &mut got);
        let exact = x86_avx2 && AVX2_SEQUENCE.contains(&ty);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if exact {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name}[{i}]: {g} vs llama.cpp {w}"
                );
            } else {
                let tol = 2e-5 * w.abs().max(1.0);
                assert!((g - w).abs() <= tol, "{name}[{i}]: {g} vs llama.cpp {w}");
            }
        }
    }
}
