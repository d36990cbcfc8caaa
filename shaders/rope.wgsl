// Rotary position embedding, in place. The host supplies cos/sin per
// (position, pair) for a window of positions: the angles follow ggml's
// float sequence exactly there, and shader sin/cos are imprecise for large
// arguments.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    cols: u32,       // row length (n_head * head_dim, or more)
    n_head: u32,
    head_dim: u32,
    half_rot: u32,   // rotated pairs per head
    neox: u32,       // 1: pairs (i, i + half_rot); 0: (2i, 2i + 1)
    table_row0: u32, // the table row of row 0's position
    n_head_k: u32,   // rope_qk: heads of `k`
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// Table row t, pair i: cos at [2 (t half_rot + i)], sin after it.
@group(0) @binding(2) var<storage, read> cos_sin: array<f32>;

// Pair `t` (row-major over rows, heads and pairs) of a tensor of `n_head`
// heads, rotated.
fn rotation(t: u32, n_head: u32, x0: f32, x1: f32) -> vec2<f32> {
    let per_row = n_head * p.half_rot;
    let r = t / per_row;
    let i = t % p.half_rot;
    let cs = 2u * ((p.table_row0 + r) * p.half_rot + i);
    let c = cos_sin[cs];
    let s = cos_sin[cs + 1u];
    return vec2<f32>(x0 * c - x1 * s, x0 * s + x1 * c);
}

// The element indices of pair `t` in a tensor of `n_head` heads and rows
// of `cols`.
fn pair(t: u32, n_head: u32, cols: u32) -> vec2<u32> {
    let per_row = n_head * p.half_rot;
    let r = t / per_row;
    let h = (t % per_row) / p.half_rot;
    let i = t % p.half_rot;
    let base = r * cols + h * p.head_dim;
    if p.neox == 1u {
        return vec2<u32>(base + i, base + i + p.half_rot);
    }
    return vec2<u32>(base + 2u * i, base + 2u * i + 1u);
}

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * 256u + lid;
    if t >= p.n_rows * p.n_head * p.half_rot {
        return;
    }
    let ab = pair(t, p.n_head, p.cols);
    let v = rotation(t, p.n_head, x[ab.x], x[ab.y]);
    x[ab.x] = v.x;
    x[ab.y] = v.y;
}

// A layer's queries (`x`, rows of exactly `n_head` heads) and keys (`xk`,
// `n_head_k` heads) in one pass: the queries' pairs first, then the keys'.
@group(0) @binding(3) var<storage, read_write> xk: array<f32>;

@compute @workgroup_size(256)
fn rope_qk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * 256u + lid;
    let q_pairs = p.n_rows * p.n_head * p.half_rot;
    if t < q_pairs {
        let ab = pair(t, p.n_head, p.n_head * p.head_dim);
        let v = rotation(t, p.n_head, x[ab.x], x[ab.y]);
        x[ab.x] = v.x;
        x[ab.y] = v.y;
        return;
    }
    let tk = t - q_pairs;
    if tk >= p.n_rows * p.n_head_k * p.half_rot {
        return;
    }
    let ab = pair(tk, p.n_head_k, p.n_head_k * p.head_dim);
    let v = rotation(tk, p.n_head_k, xk[ab.x], xk[ab.y]);
    xk[ab.x] = v.x;
    xk[ab.y] = v.y;
}
