//! The matmul kernels with and without the adapter's fast paths (subgroups,
//! shader-f16), side by side in one run: median ms per call and the ratio
//! portable / fast, for the decode shape (1 row) and the verify shape, with
//! the kernel shapes chosen for the adapter and with those for GPUs.
//!
//! cargo run --release -p blockdraft-wgpu --example kernel_bench [-- TYPES NS ROWSxCOLS]
//! e.g. `-- F16,Q8_0,Q4_K 1,8 2048x2048` (these are the defaults).

use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::{WeightRole, WeightSource};
use blockdraft_gguf::{quants, GgmlType, TensorData};
use blockdraft_wgpu::{Gpu, Tuning, WgpuBackend};
use std::time::{Duration, Instant};

/// Calls per timed sample: the readback that waits for them is paid once.
const CALLS: usize = 8;

fn backend(tuning: Tuning) -> WgpuBackend {
    let gpu = pollster::block_on(Gpu::request()).expect("a wgpu adapter");
    WgpuBackend::with_tuning(gpu, tuning)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let types: Vec<GgmlType> = args
        .next()
        .as_deref()
        .unwrap_or("F16,Q8_0,Q4_K")
        .split(',')
        .map(|n| {
            GgmlType::ALL
                .into_iter()
                .find(|t| t.name() == n)
                .unwrap_or_else(|| panic!("unknown type {n}"))
        })
        .collect();
    let ns: Vec<usize> = args
        .next()
        .as_deref()
        .unwrap_or("1,8")
        .split(',')
        .map(|n| n.parse().expect("a row count"))
        .collect();
    let shape = args.next().unwrap_or_else(|| "2048x2048".into());
    let (rows, cols) = shape.split_once('x').expect("ROWSxCOLS");
    let (rows, cols): (usize, usize) = (rows.parse().unwrap(), cols.parse().unwrap());

    let detected = Tuning::for_gpu(&pollster::block_on(Gpu::request()).expect("an adapter"));
    let shapes = [
        ("adapter", detected.matmul_lanes),
        ("gpu", Tuning::GPU.matmul_lanes),
    ];
    let x_all: Vec<f32> = (0..ns.iter().max().unwrap() * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 104729 % 2001) as f32 / 1000.0) - 1.0)
        .collect();
    for (shape, lanes) in shapes {
        let fast = backend(Tuning {
            matmul_lanes: lanes,
            ..detected
        });
        let plain = backend(Tuning {
            matmul_lanes: lanes,
            subgroups: false,
            f16: false,
            ..detected
        });
        if shape == "adapter" {
            println!("{}", fast.adapter_info());
        }
        println!(
            "\n{shape} shapes\nportable: {:?}\nfast:     {:?}",
            plain.tuning(),
            fast.tuning()
        );
        if fast.tuning() == plain.tuning() {
            println!("no fast path on this adapter: both columns run the same kernels");
        }
        println!("type   rows x cols    n   portable ms    fast ms   portable/fast");
        compare(&plain, &fast, &types, &ns, (rows, cols), &x_all, &values);
    }
}

fn compare(
    plain: &WgpuBackend,
    fast: &WgpuBackend,
    types: &[GgmlType],
    ns: &[usize],
    (rows, cols): (usize, usize),
    x_all: &[f32],
    values: &[f32],
) {
    for &ty in types {
        let bytes = quants::quantize_to_vec(ty, values).expect("quantize");
        let dims = [cols as u64, rows as u64];
        let data = TensorData::from_vec(ty, dims.to_vec(), bytes).expect("tensor");
        let src = || WeightSource {
            name: "w",
            ty,
            dims: &dims,
            data: data.clone(),
            role: WeightRole::Target,
        };
        let weights = [
            plain.load_weight(src()).unwrap(),
            fast.load_weight(src()).unwrap(),
        ];
        for &n in ns {
            // Alternate the two backends sample by sample, so drift in the
            // machine's load hits both alike.
            let mut samples = [Vec::new(), Vec::new()];
            for round in 0..8 {
                for (k, be) in [plain, fast].into_iter().enumerate() {
                    let mut x = be.tensor(n, cols);
                    be.write(&mut x, &x_all[..n * cols]);
                    let mut out = be.tensor(n, rows);
                    let start = Instant::now();
                    for _ in 0..CALLS {
                        be.matmul(&weights[k], &x, &mut out);
                    }
                    pollster::block_on(be.read(&out));
                    // The first round compiles pipelines and warms caches.
                    if round > 0 {
                        samples[k].push(start.elapsed() / CALLS as u32);
                    }
                }
            }
            let [p, f] = samples.map(median);
            println!(
                "{:5} {:5} x {:5} {:3} {:12.3} {:10.3} {:12.2}x",
                ty.name(),
                rows,
                cols,
                n,
                p.as_secs_f64() * 1e3,
                f.as_secs_f64() * 1e3,
                p.as_secs_f64() / f.as_secs_f64()
            );
        }
    }
}
