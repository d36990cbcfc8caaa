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
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// Table row t, pair i: cos at [2 (t half_rot + i)], sin after it.
@group(0) @binding(2) var<storage, read> cos_sin: array<f32>;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * 256u + lid;
    let per_row = p.n_head * p.half_rot;
    if t >= p.n_rows * per_row {
        return;
    }
    let r = t / per_row;
    let h = (t % per_row) / p.half_rot;
    let i = t % p.half_rot;
    let base = r * p.cols + h * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if p.neox == 1u {
        a = base + i;
        b = base + i + p.half_rot;
    }
    let cs = 2u * ((p.table_row0 + r) * p.half_rot + i);
    let c = cos_sin[cs];
    let s = cos_sin[cs + 1u];
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
