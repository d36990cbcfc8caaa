//! Activation quantization on the GPU against a host model of the CPU
//! backend's rules (crates/cpu/src/kernels/scalar.rs): the quantized
//! matmuls only agree with the CPU to summation order if these are
//! bit-identical, including at rounding midpoints and ties.

use crate::recorder::Binding;
use crate::weights::{quantize_activations, ActLayout, ActQuant};
use crate::WgpuBackend;
use blockdraft_core::backend::prelude::*;

fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The CPU's Q8_0 rule: (quants, scales, sums) of one row.
fn host_q8_0(x: &[f32], q8_1_sums: bool) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let (mut qs, mut d, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for xb in x.chunks_exact(32) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for &v in xb {
            let q = (v * id).round_ties_even() as i8;
            sum += q as i32;
            qs.push(q);
        }
        let db = round_f16(amax / 127.0);
        d.push(db);
        s.push(if q8_1_sums {
            round_f16(amax / 127.0 * sum as f32)
        } else {
            db * sum as f32
        });
    }
    (qs, d, s)
}

/// The CPU's Q8_K rule: (quants, scales, per-16 sums) of one row.
fn host_q8_k(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let (mut qs, mut d, mut bs) = (Vec::new(), Vec::new(), Vec::new());
    for xb in x.chunks_exact(256) {
        let max = xb
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        if max == 0.0 {
            qs.extend([0i8; 256]);
            bs.extend([0i32; 16]);
            d.push(0.0);
            continue;
        }
        let iscale = -127.0 / max;
        let q: Vec<i8> = xb
            .iter()
            .map(|&v| (iscale * v).round_ties_even().min(127.0) as i8)
            .collect();
        bs.extend(
            q.chunks(16)
                .map(|g| g.iter().map(|&q| q as i32).sum::<i32>()),
        );
        qs.extend(q);
        d.push(1.0 / iscale);
    }
    (qs, d, bs)
}

/// Rows with random values, exact rounding midpoints, an all-zero block,
/// a subnormal-scale block and signed-maximum ties.
fn test_rows(n: usize, cols: usize) -> Vec<f32> {
    let mut rng = blockdraft_core::sampling::Rng::new(5);
    let mut x: Vec<f32> = (0..n * cols)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * 3.0)
        .collect();
    // amax 127: id = 1, so k + 0.5 sits exactly between two quants.
    for (k, v) in x[32..64].iter_mut().enumerate() {
        *v = k as f32 - 15.5;
    }
    x[63] = 127.0;
    x[64..96].fill(0.0);
    // A K super-block whose largest magnitude appears with both signs.
    x[cols + 7] = -9.0;
    x[cols + 100] = 9.0;
    // Tiny values: the f16 scale is subnormal.
    for v in &mut x[2 * cols..2 * cols + 32] {
        *v *= 1e-5;
    }
    x
}

#[test]
fn activation_quantization_is_bit_exact() {
    let be = WgpuBackend::new().expect("a wgpu adapter");
    let (n, cols) = (3, 512);
    let x = test_rows(n, cols);
    for kind in [
        ActQuant::Q8_0 { q8_1_sums: false },
        ActQuant::Q8_0 { q8_1_sums: true },
        ActQuant::Q8K,
    ] {
        let mut t = be.tensor(n, cols);
        be.write(&mut t, &x);
        let act = be.act_buffer(ActLayout::new(n, cols).words);
        let layout =
            quantize_activations(&be.dev, kind, t.binding(), n, cols, Binding::whole(&act));
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&pollster::block_on(be.dev.read_bytes(
            &act,
            0,
            layout.words as u64 * 4,
        )));
        let got_q: Vec<i8> = bytemuck::cast_slice(&words[..n * cols / 4]).to_vec();
        let (want_q, want_d, want_s): (Vec<i8>, Vec<f32>, Vec<u32>) = match kind {
            ActQuant::Q8_0 { q8_1_sums } => {
                let parts: Vec<_> = x.chunks(cols).map(|r| host_q8_0(r, q8_1_sums)).collect();
                (
                    parts.iter().flat_map(|p| p.0.clone()).collect(),
                    parts.iter().flat_map(|p| p.1.clone()).collect(),
                    parts
                        .iter()
                        .flat_map(|p| p.2.iter().map(|s| s.to_bits()))
                        .collect(),
                )
            }
            ActQuant::Q8K => {
                let parts: Vec<_> = x.chunks(cols).map(host_q8_k).collect();
                (
                    parts.iter().flat_map(|p| p.0.clone()).collect(),
                    parts.iter().flat_map(|p| p.1.clone()).collect(),
                    parts
                        .iter()
                        .flat_map(|p| p.2.iter().map(|&s| s as u32))
                        .collect(),
                )
            }
        };
        assert_eq!(got_q, want_q, "{kind:?} quants");
        let got_d = &words[layout.d_off..layout.d_off + want_d.len()];
        let want_d: Vec<u32> = want_d.iter().map(|d| d.to_bits()).collect();
        assert_eq!(got_d, &want_d[..], "{kind:?} scales");
        assert_eq!(
            &words[layout.s_off..layout.s_off + want_s.len()],
            &want_s[..],
            "{kind:?} sums"
        );
    }
}

/// A bind group holds its buffers: one whose tensor was dropped must leave
/// the cache, or a finished sequence's memory would stay on the GPU.
#[test]
fn dropped_tensors_leave_the_bind_group_cache() {
    let be = WgpuBackend::new().expect("a wgpu adapter");
    let (mut kept, mut dropped) = (be.tensor(1, 8), be.tensor(1, 8));
    for t in [&mut kept, &mut dropped] {
        be.scale(t, 2.0);
        be.flush();
    }
    assert_eq!(be.dev.cached_bind_groups(), 2);
    be.scale(&mut kept, 2.0);
    be.flush();
    assert_eq!(
        be.dev.cached_bind_groups(),
        2,
        "the same slot and tensor: cached"
    );
    drop(dropped);
    be.scale(&mut kept, 2.0);
    assert_eq!(be.dev.cached_bind_groups(), 1);
}
