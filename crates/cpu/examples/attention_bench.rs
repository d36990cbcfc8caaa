//! Decode-row attention over an f16 KV cache at a given depth: llama.cpp's
//! sequence (`flash`) and the tiled kernel side by side, median of runs.
//!
//! `cargo run --release -p blockdraft-cpu --example attention_bench -- [DEPTH] [HEADS/KV_HEADS/HEAD_DIM] [ROWS] [THREADS] [LOOPS]`
//! (with LOOPS, only the tiled kernel, that many times: for a profiler)
//! e.g. `4096 14/2/64 1 1` (Qwen2.5-0.5B's layer shape, one decode row).

use blockdraft_core::backend::{AttentionMask, AttentionParams};
use blockdraft_cpu::attention::{flash_attention_f16, tiled_attention_f16};
use blockdraft_cpu::pool::ThreadPool;
use half::f16;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.to_string());
    let depth: usize = arg(0, "4096").parse().expect("depth");
    let shape: Vec<usize> = arg(1, "14/2/64")
        .split('/')
        .map(|x| x.parse().expect("shape"))
        .collect();
    let rows: usize = arg(2, "1").parse().expect("rows");
    let threads: usize = arg(3, "1").parse().expect("threads");
    let p = AttentionParams {
        n_head: shape[0],
        n_head_kv: shape[1],
        head_dim: shape[2],
        scale: 1.0 / (shape[2] as f32).sqrt(),
    };
    let kv_len = depth + rows;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut r = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let q: Vec<f32> = (0..rows * p.n_head * p.head_dim).map(|_| r()).collect();
    let kv = kv_len * p.n_head_kv * p.head_dim;
    let k: Vec<f16> = (0..kv).map(|_| f16::from_f32(r())).collect();
    let v: Vec<f16> = (0..kv).map(|_| f16::from_f32(r())).collect();
    let mask = AttentionMask {
        q_pos0: depth,
        kv_len,
        causal: true,
        window: None,
    };
    let pool = ThreadPool::new(threads);
    let mut out = vec![0f32; q.len()];
    let time = |f: &dyn Fn(&mut [f32]), out: &mut [f32]| {
        let mut t: Vec<f64> = (0..15)
            .map(|_| {
                let start = Instant::now();
                f(out);
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    if let Some(loops) = args.get(4) {
        // For a profiler: the tiled kernel alone, this many times.
        for _ in 0..loops.parse::<usize>().expect("loops") {
            tiled_attention_f16(&pool, &q, &k, &v, mask, p, &mut out);
        }
        return;
    }
    let flash = time(
        &|o| flash_attention_f16(&pool, &q, &k, &v, mask, p, o),
        &mut out,
    );
    let tiled = time(
        &|o| tiled_attention_f16(&pool, &q, &k, &v, mask, p, o),
        &mut out,
    );
    let per = |us: f64| us * 1e3 / (rows * p.n_head * kv_len) as f64;
    println!(
        "depth {depth}, {}/{}/{} heads, {rows} rows, {threads} threads: flash {flash:.1} us ({:.2} ns per head-key), tiled {tiled:.1} us ({:.2} ns), {:.2}x",
        p.n_head,
        p.n_head_kv,
        p.head_dim,
        per(flash),
        per(tiled),
        flash / tiled
    );
}
