//! Checks the scalar (de)quantizers against the PyPI `gguf` package, through
//! `tests/fixtures/gguf/quants.gguf` (made by
//! `tests/gguf_fixtures/make_quant_fixtures.py`).

use blockdraft_gguf::quants::{dequantize_to_vec, quantize_to_vec};
use blockdraft_gguf::{GgmlType, GgufFile};

fn fixture() -> GgufFile {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/gguf/quants.gguf"
    );
    GgufFile::open(p).unwrap()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn dequantize_matches_gguf_python_package() {
    let f = fixture();
    let types = [
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
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
    ];
    for ty in types {
        let name = ty.name().to_lowercase();
        let raw = f.tensor_data(&format!("{name}.raw")).unwrap();
        let want = f32s(&f.tensor_data(&format!("{name}.ref")).unwrap());
        let got = if ty == GgmlType::Q8_1 {
            // Stored as I8 bytes: gguf-py's Q8_1 block size (40) is stale.
            assert_eq!(raw.ty(), GgmlType::I8);
            dequantize_to_vec(ty, &raw).unwrap()
        } else {
            assert_eq!(raw.ty(), ty, "{name}");
            raw.to_f32().unwrap()
        };
        assert_eq!(got.len(), want.len(), "{name}");
        let mut mismatches = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Bit-exact expected; allow 1e-6 relative as the brief permits.
            if g.to_bits() != w.to_bits() && (g - w).abs() > 1e-6 * w.abs().max(1e-30) {
                if mismatches < 5 {
                    eprintln!("{name}[{i}]: got {g}, want {w}");
                }
                mismatches += 1;
            }
        }
        assert_eq!(mismatches, 0, "{name}: {mismatches} mismatches");
    }
}

#[test]
fn quantize_matches_gguf_python_package() {
    let f = fixture();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ] {
        let name = ty.name().to_lowercase();
        let src = f32s(&f.tensor_data(&format!("{name}.src")).unwrap());
        let want = f.tensor_data(&format!("{name}.pyq")).unwrap();
        let got = quantize_to_vec(ty, &src).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        if got[..] != want[..] {
            // Report in decoded terms: a one-step rounding difference at an
            // exact tie is tolerated, anything else is a bug.
            let g = dequantize_to_vec(ty, &got).unwrap();
            let w = dequantize_to_vec(ty, &want).unwrap();
            let diff_bytes = got.iter().zip(&*want).filter(|(a, b)| a != b).count();
            panic!(
                "{name}: {diff_bytes} bytes differ; first decoded diffs: {:?}",
                g.iter()
                    .zip(&w)
                    .enumerate()
                    .filter(|(_, (a, b))| a != b)
                    .take(5)
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn read_only_formats_refuse_to_quantize_with_a_typed_error() {
    use blockdraft_gguf::quants::can_quantize;
    use blockdraft_gguf::{ErrorKind, GgufError};
    for ty in GgmlType::ALL {
        let x = vec![0.5f32; ty.block_len()];
        match quantize_to_vec(ty, &x) {
            Ok(q) => {
                assert!(can_quantize(ty), "{ty}");
                assert_eq!(q.len(), ty.block_bytes(), "{ty}");
            }
            Err(e @ GgufError::UnsupportedType { .. }) => {
                assert!(!can_quantize(ty), "{ty}: {e}");
                assert_eq!(e.kind(), ErrorKind::UnsupportedType);
            }
            Err(e) => panic!("{ty}: {e}"),
        }
    }
}
