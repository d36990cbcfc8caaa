//! The weight types whose kernels read a lattice grid carried after the
//! weight's rows (IQ2_*, IQ3_*, IQ1_*), and the other types added with
//! them (TQ1_0, TQ2_0, MXFP4, NVFP4), where the shared op suite does not
//! take them: stacked side by side in one buffer (each segment finds its
//! own grid), split into parts (each part carries the grid), and too large
//! for a binding once the grid is counted (an error, not a panic).

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::{Backend, GatedActivation, Projection, WeightRole, WeightSource};
use blockdraft_core::conformance::weight_file;
use blockdraft_core::sampling::Rng;
use blockdraft_core::testing::block_on;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{quants, GgmlType, GgufFile};
use blockdraft_wgpu::{Gpu, WgpuBackend};

fn source(f: &GgufFile) -> WeightSource<'_> {
    let info = f.tensor("w").unwrap();
    WeightSource {
        name: "w",
        ty: info.ty,
        dims: &info.dims,
        data: f.tensor_data("w").unwrap(),
        role: WeightRole::Target,
    }
}

fn load<B: Backend>(be: &B, f: &GgufFile) -> B::Weight {
    be.load_weight(source(f)).unwrap()
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
        .collect()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
        / scale
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let err = rel_err(got, want);
    assert!(err <= 2e-4, "{what}: relative error {err:e}");
}

/// Three weights of mixed types (grids of different sizes, and types with
/// none between them) stacked by `colocate`: their projections, with and
/// without biases, in one dispatch after the input's quantization, and a
/// gated feed-forward of two of them.
#[test]
fn stacked_weights_read_their_own_grids() {
    let be = WgpuBackend::new().expect("a wgpu adapter");
    let cpu = CpuBackend::new(1);
    let rows = [40, 16, 24];
    for (cols, types) in [
        (512, [GgmlType::IQ2_XXS, GgmlType::IQ1_M, GgmlType::IQ3_S]),
        (512, [GgmlType::TQ1_0, GgmlType::IQ2_S, GgmlType::IQ3_XXS]),
        (512, [GgmlType::IQ1_S, GgmlType::TQ2_0, GgmlType::IQ2_XS]),
        (320, [GgmlType::NVFP4, GgmlType::MXFP4, GgmlType::NVFP4]),
    ] {
        let seed = cols as u64 + types[0] as u64;
        let files: Vec<_> = (0..3)
            .map(|i| weight_file(types[i], rows[i], cols, seed + i as u64))
            .collect();
        let bias_files: Vec<_> = (0..3)
            .map(|i| weight_file(GgmlType::F32, 1, rows[i], seed + 10 + i as u64))
            .collect();
        let (mut w, wc): (Vec<_>, Vec<_>) =
            files.iter().map(|f| (load(&be, f), load(&cpu, f))).unzip();
        let (mut b, bc): (Vec<_>, Vec<_>) = bias_files
            .iter()
            .map(|f| (load(&be, f), load(&cpu, f)))
            .unzip();
        be.colocate(&mut w.iter_mut().collect::<Vec<_>>());
        be.colocate(&mut b.iter_mut().collect::<Vec<_>>());
        for (n, with_bias) in [(1, true), (5, false), (9, true)] {
            let x = values(n * cols, seed + n as u64, 2.0);
            let mut xt = be.tensor(n, cols);
            be.write(&mut xt, &x);
            let mut xc = cpu.tensor(n, cols);
            cpu.write(&mut xc, &x);
            let mut outs: Vec<_> = rows.iter().map(|&r| be.tensor(n, r)).collect();
            let mut projections: Vec<_> = outs
                .iter_mut()
                .enumerate()
                .map(|(i, out)| Projection {
                    weight: &w[i],
                    bias: with_bias.then_some(&b[i]),
                    out,
                })
                .collect();
            let before = be.counters().dispatches;
            be.matmul_many(&xt, &mut projections);
            assert_eq!(
                be.counters().dispatches - before,
                2,
                "{types:?}: quantize, then one stacked dispatch"
            );
            for (i, out) in outs.iter().enumerate() {
                let mut want = cpu.tensor(n, rows[i]);
                cpu.matmul(&wc[i], &xc, &mut want);
                if with_bias {
                    cpu.add_bias(&mut want, &bc[i]);
                }
                assert_close(
                    &format!("stacked {} n={n} bias {with_bias}", types[i]),
                    &block_on(be.read(out)),
                    &block_on(cpu.read(&want)),
                );
            }

            // Gate (first type) and up (third) of the same rows, stacked.
            let ff = rows[0].min(rows[2]);
            let gfile = weight_file(types[0], ff, cols, seed + 30);
            let ufile = weight_file(types[2], ff, cols, seed + 31);
            let (mut wg, mut wu) = (load(&be, &gfile), load(&be, &ufile));
            be.colocate(&mut [&mut wg, &mut wu]);
            let t = || be.tensor(n, ff);
            let (mut gate, mut up, mut out) = (t(), t(), t());
            let act = GatedActivation::SwiGlu;
            be.gated_projection(act, &xt, &wg, &wu, &mut gate, &mut up, &mut out);
            let (wgc, wuc) = (load(&cpu, &gfile), load(&cpu, &ufile));
            let t = || cpu.tensor(n, ff);
            let (mut gate, mut up, mut want) = (t(), t(), t());
            cpu.matmul(&wgc, &xc, &mut gate);
            cpu.matmul(&wuc, &xc, &mut up);
            cpu.gated(act, &gate, &up, &mut want);
            assert_close(
                &format!("stacked gated {} / {} n={n}", types[0], types[2]),
                &block_on(be.read(&out)),
                &block_on(cpu.read(&want)),
            );
        }
    }
}

/// Bytes of the grid a type's parts carry (`blockdraft_gguf`'s tables).
fn grid_bytes(ty: GgmlType) -> u64 {
    use quants::grids::*;
    use std::mem::size_of_val;
    (match ty {
        GgmlType::IQ2_XXS => size_of_val(&IQ2XXS_GRID),
        GgmlType::IQ2_XS => size_of_val(&IQ2XS_GRID),
        GgmlType::IQ2_S => size_of_val(&IQ2S_GRID),
        GgmlType::IQ3_XXS => size_of_val(&IQ3XXS_GRID),
        GgmlType::IQ3_S => size_of_val(&IQ3S_GRID),
        GgmlType::IQ1_S | GgmlType::IQ1_M => size_of_val(&IQ1S_GRID),
        _ => 0,
    }) as u64
}

/// Weights split into parts by a small binding limit, 20 rows of 768
/// values each beside the grid: every part carries its grid after its rows
/// (the last part's 11 rows not ending on a word where a row is not a whole
/// number of words), and a weight whose grid leaves no room for a row is
/// refused.
#[test]
fn split_weights_carry_their_grids() {
    let cpu = CpuBackend::new(1);
    let (rows, cols) = (51, 768);
    for ty in [
        GgmlType::IQ1_M,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::TQ1_0,
        GgmlType::NVFP4,
    ] {
        let row_bytes = ty.bytes_for(cols as u64).unwrap();
        let limit = grid_bytes(ty) + 20 * row_bytes + 2;
        let mut gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
        gpu.limits.max_storage_buffer_binding_size = limit;
        let be = WgpuBackend::with_gpu(gpu);
        let f = weight_file(ty, rows, cols, ty as u64);
        let (w, wc) = (load(&be, &f), load(&cpu, &f));
        for n in [1, 8, 13] {
            let x = values(n * cols, n as u64, 2.0);
            let mut xt = be.tensor(n, cols);
            be.write(&mut xt, &x);
            let mut out = be.tensor(n, rows);
            let before = be.counters().dispatches;
            be.matmul(&w, &xt, &mut out);
            assert_eq!(
                be.counters().dispatches - before,
                1 + 3,
                "{ty}: quantize, then parts of 20, 20 and 11 rows"
            );
            let mut xc = cpu.tensor(n, cols);
            cpu.write(&mut xc, &x);
            let mut want = cpu.tensor(n, rows);
            cpu.matmul(&wc, &xc, &mut want);
            assert_close(
                &format!("split {ty} n={n}"),
                &block_on(be.read(&out)),
                &block_on(cpu.read(&want)),
            );
        }
        let ids = [49u32, 0, 23, 50, 12, 49];
        let mut out = be.tensor(ids.len(), cols);
        be.embed(&w, &ids, &mut out);
        let mut want = cpu.tensor(ids.len(), cols);
        cpu.embed(&wc, &ids, &mut want);
        assert_eq!(
            block_on(be.read(&out)),
            block_on(cpu.read(&want)),
            "split {ty} embed"
        );
    }

    // IQ1_S's grid is 16 KiB: beside it, a binding of 16 KiB + 100 bytes
    // has no room for a row of 768 values (150 bytes).
    let mut gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
    gpu.limits.max_storage_buffer_binding_size = (16 << 10) + 100;
    let be = WgpuBackend::with_gpu(gpu);
    let f = weight_file(GgmlType::IQ1_S, 4, cols, 1);
    let err = be.load_weight(source(&f)).err().expect("refused");
    assert!(err.to_string().contains("grid"), "{err}");
}
