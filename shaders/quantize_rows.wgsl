// How activation rows are quantized to 8 bits for the quantized matmuls,
// exactly as the CPU backend does (crates/cpu/src/kernels/scalar.rs): the
// matmuls then take integer dots per block, and GPU and CPU differ only in
// the order their float sums are taken. Shared by `quantize.wgsl` and the
// fused norm of `norm.wgsl`, which quantizes what it normalizes.
//
// Output, one buffer `act` of u32 words (declared by the including file;
// offsets in `Dest`):
//   qs   [0, n·cols/4)        the quants, four i8 per word, row-major
//   d    [d_off, ..)          f32 scale per 32 (q8_0) or per 256 (q8_k)
//                             values
//   s    [s_off, ..)          q8_0: f32 `d · sum(qs)` per 32 values;
//                             q8_k: i32 sum of each 16 quants
//
// A workgroup of 256 invocations quantizes 256 consecutive values of one
// row at a time, one value per invocation; per-block maxima and sums are
// workgroup tree reductions. Every invocation calls the chunk functions
// (barriers).

const WG: u32 = 256u;
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_i: array<i32, WG>;
var<workgroup> quants: array<i32, WG>;

struct Dest {
    cols: u32,       // row length
    d_off: u32,
    s_off: u32,
    q8_1_sums: u32,  // q8_0: the sum as llama.cpp's block_q8_1 has it
}

// a / b correctly rounded (positive and negative normal operands). WGSL
// lets division be off by 2.5 ulp and the CPU's is exact; a quant that
// sits at a rounding midpoint would then differ, so the mantissas are
// divided in integers (25 quotient bits, then round half to even).
fn div_rn(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let ea = (ua >> 23u) & 0xffu;
    let eb = (ub >> 23u) & 0xffu;
    if ea == 0u || eb == 0u || ea == 255u || eb == 255u {
        return a / b; // zero, subnormal, inf, nan: never a quant scale here
    }
    var ma = (ua & 0x7fffffu) | 0x800000u;
    let mb = (ub & 0x7fffffu) | 0x800000u;
    var e = i32(ea) - i32(eb) + 127;
    if ma < mb {
        ma <<= 1u;
        e -= 1;
    }
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 25u; i++) {
        q <<= 1u;
        if r >= mb {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    let guard = q & 1u;
    q >>= 1u;
    if guard == 1u && (r != 0u || (q & 1u) == 1u) {
        q += 1u;
        if q == 0x1000000u {
            q >>= 1u;
            e += 1;
        }
    }
    if e <= 0 || e >= 255 {
        return a / b;
    }
    return bitcast<f32>(((ua ^ ub) & 0x80000000u) | (u32(e) << 23u) | (q & 0x7fffffu));
}

// Packs the quants of this workgroup, four per word.
fn store_quants(lid: u32, row: u32, c: u32, cols: u32) {
    if lid % 4u == 0u && c < cols {
        let word = (quants[lid] & 0xff) | ((quants[lid + 1u] & 0xff) << 8u)
            | ((quants[lid + 2u] & 0xff) << 16u) | ((quants[lid + 3u] & 0xff) << 24u);
        act[(row * cols + c) / 4u] = bitcast<u32>(word);
    }
}

// Quantizes value `v` at column `c` of `row` (this invocation's; `c` may
// lie beyond the row, with `v` 0) in 32-blocks. `store`: whether `row`
// exists (the reductions run either way).
fn quantize_chunk_q8_0(lid: u32, row: u32, c: u32, v: f32, store: bool, dst: Dest) {
    // amax per 32 values.
    red_f[lid] = abs(v);
    workgroupBarrier();
    for (var s = 16u; s > 0u; s /= 2u) {
        if lid % 32u < s {
            red_f[lid] = max(red_f[lid], red_f[lid + s]);
        }
        workgroupBarrier();
    }
    let amax = red_f[lid & ~31u];
    var id = 0.0;
    if amax > 0.0 {
        id = div_rn(127.0, amax);
    }
    let q = clamp(i32(round(v * id)), -128, 127);
    quants[lid] = q;
    red_i[lid] = q;
    workgroupBarrier();
    for (var s = 16u; s > 0u; s /= 2u) {
        if lid % 32u < s {
            red_i[lid] += red_i[lid + s];
        }
        workgroupBarrier();
    }
    if store {
        store_quants(lid, row, c, dst.cols);
        if lid % 32u == 0u && c < dst.cols {
            let blk = (row * dst.cols + c) / 32u;
            let sum = red_i[lid];
            let d = round_f16(div_rn(amax, 127.0));
            var s = d * f32(sum);
            if dst.q8_1_sums != 0u {
                s = round_f16(div_rn(amax, 127.0) * f32(sum));
            }
            act[dst.d_off + blk] = bitcast<u32>(d);
            act[dst.s_off + blk] = bitcast<u32>(s);
        }
    }
    // The arrays are reused by the next chunk.
    workgroupBarrier();
}

// Quantizes value `v` at column `c` of `row` (this invocation's; `c` is
// within the row, whose length is a multiple of 256) as one 256-value
// block of Q8_K.
fn quantize_chunk_q8_k(lid: u32, row: u32, c: u32, v: f32, store: bool, dst: Dest) {
    // The value of largest magnitude, the first one on ties (the CPU's fold).
    red_f[lid] = v;
    red_i[lid] = i32(lid);
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if lid < s {
            let a = abs(red_f[lid]);
            let b = abs(red_f[lid + s]);
            if b > a || (b == a && red_i[lid + s] < red_i[lid]) {
                red_f[lid] = red_f[lid + s];
                red_i[lid] = red_i[lid + s];
            }
        }
        workgroupBarrier();
    }
    let mx = red_f[0];
    workgroupBarrier();
    var q = 0;
    var iscale = 0.0;
    if mx != 0.0 {
        iscale = div_rn(-127.0, mx);
        q = i32(min(round(iscale * v), 127.0));
    }
    quants[lid] = q;
    red_i[lid] = q;
    workgroupBarrier();
    for (var s = 8u; s > 0u; s /= 2u) {
        if lid % 16u < s {
            red_i[lid] += red_i[lid + s];
        }
        workgroupBarrier();
    }
    if store {
        store_quants(lid, row, c, dst.cols);
        if lid % 16u == 0u {
            act[dst.s_off + (row * dst.cols + c) / 16u] = bitcast<u32>(red_i[lid]);
        }
        if lid == 0u {
            var d = 0.0;
            if mx != 0.0 {
                d = div_rn(1.0, iscale);
            }
            act[dst.d_off + (row * dst.cols + c) / 256u] = bitcast<u32>(d);
        }
    }
    workgroupBarrier();
}
