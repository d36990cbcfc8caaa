//! Matmul throughput: median GB/s of weight bytes per call, and the cost of
//! n activation rows relative to one (what speculative verify pays). Types
//! with a packed layout on this CPU (`kernels::pack`) are timed in both
//! layouts, call by call in turn (`x8` rows; `ggml/x8` is the speedup, the
//! median of the pairs' ratios).
//!
//! cargo run --release -p blockdraft-cpu --example matmul_bench [-- TYPES THREADS NS]
//! e.g. `-- Q4_K,Q6_K 1,2 1,2,4,8,16` (these are the defaults);
//! `BENCH_FAST=1`: the packed layouts of the fast kernels
//! (`CpuBackend::with_fast_kernels`).

use blockdraft_cpu::kernels::{matmul, matmul_packed, pack, WeightRef};
use blockdraft_cpu::pool::ThreadPool;
use blockdraft_gguf::GgmlType;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random quant bits with small valid f16 scales (NaN scales would still
/// time the same, but keep the numbers sane).
fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
    let mut v = vec![0u8; bytes];
    for c in v.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    let h = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let scale_at: &[usize] = match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            for c in v.chunks_mut(2) {
                c.copy_from_slice(&h);
            }
            &[]
        }
        GgmlType::F32 => {
            for c in v.chunks_mut(4) {
                c.copy_from_slice(&0.01f32.to_le_bytes());
            }
            &[]
        }
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        _ => &[0],
    };
    if !scale_at.is_empty() {
        for blk in v.chunks_mut(ty.block_bytes()) {
            for &a in scale_at {
                blk[a..a + 2].copy_from_slice(&h);
            }
        }
    }
    v
}

/// Nanoseconds this thread has run on a CPU (Linux), to see through a
/// machine shared with other jobs: meaningful for 1-thread runs only.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Per-call times of each of `fs`, called in turn (a, b, a, b, ...), so
/// that both layouts see the same machine: on a shared VM the speed
/// drifts within a second. Each is warmed up first (page in, grow scratch).
fn interleaved_times(fs: &mut [&mut dyn FnMut()]) -> Vec<Vec<Duration>> {
    for f in fs.iter_mut() {
        f();
    }
    let mut times = vec![Vec::new(); fs.len()];
    let budget = Duration::from_millis(300) * fs.len() as u32;
    let start = Instant::now();
    while times[0].len() < 5 || (start.elapsed() < budget && times[0].len() < 200) {
        for (f, t) in fs.iter_mut().zip(&mut times) {
            let t0 = Instant::now();
            f();
            t.push(t0.elapsed());
        }
    }
    times
}

fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn list<T: std::str::FromStr>(s: Option<String>, default: &str) -> Vec<T> {
    s.as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|x| {
            x.parse()
                .ok()
                .unwrap_or_else(|| panic!("bad list item {x}"))
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let types: Vec<GgmlType> = args
        .next()
        .as_deref()
        .unwrap_or("Q4_K,Q6_K")
        .split(',')
        .map(|n| {
            GgmlType::ALL
                .into_iter()
                .find(|t| t.name() == n)
                .unwrap_or_else(|| panic!("unknown type {n}"))
        })
        .collect();
    let threads: Vec<usize> = list(args.next(), "1,2");
    let ns: Vec<usize> = list(args.next(), "1,2,4,8,16");
    // BENCH_SHAPES=ROWSxCOLS,... overrides the default shapes.
    let shapes: Vec<(usize, usize)> = std::env::var("BENCH_SHAPES")
        .unwrap_or_else(|_| "1536x1536,8960x1536,1536x8960,151936x1536".into())
        .split(',')
        .map(|s| {
            let (r, c) = s.split_once('x').expect("ROWSxCOLS");
            (r.parse().unwrap(), c.parse().unwrap())
        })
        .collect();
    let fast = std::env::var("BENCH_FAST").is_ok_and(|v| v == "1");
    let mut rng = Rng(0x1234_5678_9abc_def1);

    for &t in &threads {
        let pool = ThreadPool::new(t);
        let times = interleaved_times(&mut [&mut || pool.run(t * 4, &|_| {})]).remove(0);
        let (med, best) = (median(times.clone()), *times.iter().min().unwrap());
        println!(
            "pool.run overhead, {t} threads: median {:.2} us, best {:.2} us",
            med.as_secs_f64() * 1e6,
            best.as_secs_f64() * 1e6
        );
    }
    println!("type   rows x cols     thr   n    ms/call    GB/s   T(n)/T(1)  best-GB/s  cpu-GB/s  ggml/x8");
    for &ty in &types {
        for &(rows, cols) in shapes.iter() {
            if cols % ty.block_len() != 0 {
                continue;
            }
            let data = weights(ty, rows, cols, &mut rng);
            let w = WeightRef {
                ty,
                data: &data,
                rows,
                cols,
            };
            for &t in &threads {
                let pool = ThreadPool::new(t);
                let packed = pack(&pool, &w, fast);
                let mut t1 = [None; 2];
                for &n in &ns {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                    let (mut out, mut out_packed) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                    let mut calls = 0u64;
                    let cpu0 = thread_cpu_ns();
                    let mut ggml = || {
                        matmul(&pool, &w, &x, &mut out);
                        calls += 1;
                    };
                    let times = match &packed {
                        Some(p) => interleaved_times(&mut [&mut ggml, &mut || {
                            matmul_packed(&pool, p, &x, &mut out_packed)
                        }]),
                        None => interleaved_times(&mut [&mut ggml]),
                    };
                    // Thread CPU time per byte, for the ggml layout alone
                    // where it ran alone (1 thread, no packed layout).
                    let cpu_gbs = match (cpu0, thread_cpu_ns()) {
                        (Some(a), Some(b)) if t == 1 && packed.is_none() => {
                            format!(
                                "{:9.2}",
                                (data.len() as u64 * calls) as f64 / (b - a) as f64
                            )
                        }
                        _ => "        -".into(),
                    };
                    // The paired speedup: the median of each pair's ratio.
                    let speedup = (times.len() == 2).then(|| {
                        let pairs = times[0].iter().zip(&times[1]);
                        median(
                            pairs
                                .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
                                .collect(),
                        )
                    });
                    for (l, (lt, t1)) in times.iter().zip(t1.iter_mut()).enumerate() {
                        let secs = median(lt.clone()).as_secs_f64();
                        let best = lt.iter().min().unwrap().as_secs_f64();
                        let base = *t1.get_or_insert(secs);
                        let name = format!("{}{}", ty.name(), if l == 1 { "x8" } else { "" });
                        let ratio = match speedup {
                            Some(r) if l == 1 => format!("{r:8.2}"),
                            _ => String::new(),
                        };
                        println!(
                            "{:6} {:6} x {:5} {:4} {:3} {:10.3} {:7.2} {:9.2}  {:9.2}  {} {}",
                            name,
                            rows,
                            cols,
                            t,
                            n,
                            secs * 1e3,
                            data.len() as f64 / secs / 1e9,
                            secs / base,
                            data.len() as f64 / best / 1e9,
                            cpu_gbs,
                            ratio
                        );
                    }
                }
            }
        }
    }
}
