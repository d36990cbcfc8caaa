// Seeded sampling (see Backend::sample_to): one token per row, drawn by
// inverse CDF from softmax(logits / T) restricted as the host sampler does
// (top-k, top-p over the sorted top-k, min-p), with the counter-based
// uniform of `device_uniform` (sampling.rs). The candidates of a row are
// either its top-k (values and ids from top_k, sorted) or the whole row in
// index order. One workgroup per row; each invocation owns a contiguous
// chunk of candidates, and invocation 0 walks the chunk sums in order.

#include "common.wgsl"

struct Params {
    n_rows: u32,
    m: u32,           // candidates per row
    sorted: u32,      // 1: candidates are top-k (ids in `ids`), top-p applies
    temperature: f32,
    top_p: f32,
    min_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    ctr_lo: u32,      // counter of row 0
    ctr_hi: u32,
    out_row: u32,
    out_col: u32,
    out_cols: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_n: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;
var<workgroup> shared_max: f32;
var<workgroup> shared_any: u32;
var<workgroup> shared_cut: u32;

fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Uniform in [0, 1) with 24 bits, a function of (seed, counter) only.
fn uniform01(seed_lo: u32, seed_hi: u32, ctr_lo: u32, ctr_hi: u32) -> f32 {
    let h = pcg(seed_lo ^ pcg(seed_hi ^ pcg(ctr_lo ^ pcg(ctr_hi))));
    return f32(h >> 8u) * 5.9604645e-8;
}

// Finite: not NaN nor ±inf, tested on the bits.
fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

fn id_of(row: u32, i: u32) -> f32 {
    if p.sorted == 1u {
        return ids[row * p.m + i];
    }
    return f32(i);
}

// Weight of candidate i in the final draw (0 when filtered out).
fn weight(row: u32, i: u32, gmax: f32, cut: u32) -> f32 {
    let v = vals[row * p.m + i];
    if i >= cut || !finite(v) {
        return 0.0;
    }
    if p.min_p > 0.0 && exp(v - gmax) < p.min_p {
        return 0.0;
    }
    return exp((v - gmax) / p.temperature);
}

@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.n_rows {
        return;
    }
    let chunk = (p.m + WG - 1u) / WG;
    let c0 = min(lid * chunk, p.m);
    let c1 = min(c0 + chunk, p.m);

    // The largest finite value.
    var mx = 0.0;
    var any = 0u;
    for (var i = c0; i < c1; i++) {
        let v = vals[row * p.m + i];
        if finite(v) && (any == 0u || v > mx) {
            mx = v;
            any = 1u;
        }
    }
    red_v[lid] = mx;
    red_n[lid] = any;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride && red_n[lid + stride] == 1u && (red_n[lid] == 0u || red_v[lid + stride] > red_v[lid]) {
            red_v[lid] = red_v[lid + stride];
            red_n[lid] = 1u;
        }
        workgroupBarrier();
    }
    if lid == 0u {
        shared_max = red_v[0];
        shared_any = red_n[0];
    }
    let gany = workgroupUniformLoad(&shared_any);
    let gmax = shared_max;
    let out_i = (p.out_row + row) * p.out_cols + p.out_col;
    if gany == 0u {
        // No finite logit: the first candidate.
        if lid == 0u {
            out[out_i] = id_of(row, 0u);
        }
        return;
    }

    // Top-p over the sorted candidates: the shortest prefix holding top_p
    // of the mass at temperature 1.
    var cut = p.m;
    if p.sorted == 1u && p.top_p < 1.0 {
        var s = 0.0;
        for (var i = c0; i < c1; i++) {
            let v = vals[row * p.m + i];
            if finite(v) {
                s += exp(v - gmax);
            }
        }
        sums[lid] = s;
        workgroupBarrier();
        if lid == 0u {
            var total = 0.0;
            for (var k = 0u; k < WG; k++) {
                total += sums[k];
            }
            let goal = p.top_p * total;
            var acc = 0.0;
            var found = p.m;
            for (var k = 0u; k < WG && found == p.m; k++) {
                if acc + sums[k] >= goal {
                    let k0 = min(k * chunk, p.m);
                    for (var i = k0; i < min(k0 + chunk, p.m); i++) {
                        let v = vals[row * p.m + i];
                        if finite(v) {
                            acc += exp(v - gmax);
                        }
                        if acc >= goal {
                            found = i + 1u;
                            break;
                        }
                    }
                    if found == p.m {
                        found = min(k0 + chunk, p.m);
                    }
                } else {
                    acc += sums[k];
                }
            }
            shared_cut = found;
        }
        cut = workgroupUniformLoad(&shared_cut);
    }

    // The draw.
    var z = 0.0;
    var last_kept = 0u;
    for (var i = c0; i < c1; i++) {
        let w = weight(row, i, gmax, cut);
        z += w;
        if w > 0.0 {
            last_kept = i;
        }
    }
    workgroupBarrier();
    sums[lid] = z;
    red_n[lid] = last_kept;
    workgroupBarrier();
    if lid == 0u {
        var total = 0.0;
        for (var k = 0u; k < WG; k++) {
            total += sums[k];
        }
        let lo = p.ctr_lo + row;
        let hi = p.ctr_hi + select(0u, 1u, lo < p.ctr_lo);
        let goal = uniform01(p.seed_lo, p.seed_hi, lo, hi) * total;
        var acc = 0.0;
        var pick = 0xffffffffu;
        var last = 0u;
        for (var k = 0u; k < WG && pick == 0xffffffffu; k++) {
            if sums[k] > 0.0 && acc + sums[k] > goal {
                let k0 = min(k * chunk, p.m);
                for (var i = k0; i < min(k0 + chunk, p.m); i++) {
                    let w = weight(row, i, gmax, cut);
                    if w > 0.0 {
                        acc += w;
                        last = i;
                        if goal < acc {
                            pick = i;
                            break;
                        }
                    }
                }
            } else if sums[k] > 0.0 {
                acc += sums[k];
                // Should rounding leave the goal beyond every sum: the
                // last kept candidate.
                last = red_n[k];
            }
        }
        if pick == 0xffffffffu {
            pick = last;
        }
        out[out_i] = id_of(row, pick);
    }
}
