//! Quantized weights split into several parts (a device whose storage
//! bindings are small), at a realistic row length: matmul and embedding
//! still agree with the CPU backend, and a matmul costs one quantize
//! dispatch plus one per part.

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::{Backend, WeightRole, WeightSource};
use blockdraft_core::sampling::Rng;
use blockdraft_core::testing::block_on;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{quants, GgmlType, GgufFile, GgufWriter};
use blockdraft_wgpu::{Gpu, WgpuBackend};

fn weight_file(ty: GgmlType, rows: usize, cols: usize) -> GgufFile {
    let mut rng = Rng::new(ty as u64);
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| rng.next_f64() as f32 * 2.0 - 1.0)
        .collect();
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test");
    let bytes = quants::quantize_to_vec(ty, &x).unwrap();
    w.add_tensor("w", &[cols as u64, rows as u64], ty, bytes)
        .unwrap();
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn load<B: Backend>(be: &B, f: &GgufFile) -> B::Weight {
    let info = f.tensor("w").unwrap();
    be.load_weight(WeightSource {
        name: "w",
        ty: info.ty,
        dims: &info.dims,
        data: f.tensor_data("w").unwrap(),
        role: WeightRole::Target,
    })
    .unwrap()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
        / scale
}

#[test]
fn split_quantized_weights() {
    let mut gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
    // 16 KiB bindings: 50 rows of 2048 columns split into parts of 8 or 12
    // rows (whole rows, a multiple of 4 per part).
    gpu.limits.max_storage_buffer_binding_size = 16 << 10;
    let be = WgpuBackend::with_gpu(gpu);
    let cpu = CpuBackend::new(1);
    let (rows, cols) = (50, 2048);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let f = weight_file(ty, rows, cols);
        let (w, wc) = (load(&be, &f), load(&cpu, &f));
        let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
        let per_part = (16 << 10) / row_bytes / 4 * 4;
        let parts = rows.div_ceil(per_part) as u64;
        assert!(parts > 1, "{ty}: the weight is split");
        for n in [1, 8, 13] {
            let x: Vec<f32> = {
                let mut rng = Rng::new(n as u64);
                (0..n * cols)
                    .map(|_| rng.next_f64() as f32 * 4.0 - 2.0)
                    .collect()
            };
            let mut xt = be.tensor(n, cols);
            be.write(&mut xt, &x);
            let mut out = be.tensor(n, rows);
            let before = be.counters().dispatches;
            be.matmul(&w, &xt, &mut out);
            assert_eq!(
                be.counters().dispatches - before,
                1 + parts,
                "{ty} dispatches"
            );
            let mut xc = cpu.tensor(n, cols);
            cpu.write(&mut xc, &x);
            let mut want = cpu.tensor(n, rows);
            cpu.matmul(&wc, &xc, &mut want);
            let err = rel_err(&block_on(be.read(&out)), &block_on(cpu.read(&want)));
            assert!(err <= 2e-4, "{ty} n={n}: relative error {err:e}");
        }
        let ids = [49u32, 0, 23, 49, 12];
        let mut out = be.tensor(ids.len(), cols);
        be.embed(&w, &ids, &mut out);
        let mut want = cpu.tensor(ids.len(), cols);
        cpu.embed(&wc, &ids, &mut want);
        assert_eq!(
            block_on(be.read(&out)),
            block_on(cpu.read(&want)),
            "{ty} embed"
        );
    }
}
