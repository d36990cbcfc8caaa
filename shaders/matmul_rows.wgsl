// What the matmul kernels share beyond the weight type: which output
// feature an invocation works on, and summing a feature's partial sums into
// the outputs. The including file declares `p` (its first fields: rows,
// cols, n, row0, out_cols; and `epilogue`), `y` and `bias`.
//
// A workgroup of 64 invocations computes FEATURES = 64 / LANES output
// features; the LANES invocations of a feature stride over its row and add
// their partial sums. LANES is set per adapter when the pipeline is built:
// 16 suits GPUs (neighbouring invocations read neighbouring weights), 1
// suits CPU-emulated adapters (lavapipe, SwiftShader), where barriers and
// tiny workgroups cost far more than the arithmetic. With subgroups, a
// feature's LANES invocations are neighbours in one subgroup (LANES is at
// most the adapter's smallest subgroup size) and add by shuffles, with no
// workgroup memory or barriers.

#include "subgroup.wgsl"
#include "gating.wgsl"

const WG: u32 = 64u;
override LANES: u32 = 16u;           // invocations per output feature (divides WG)
override FEATURES: u32 = WG / LANES; // output features per workgroup
const NR: u32 = 8u;                  // activation rows per pass

#if SUBGROUPS
#else
var<workgroup> partial: array<array<f32, WG>, NR>;
#endif

// What a stored sum gets on its way out (flags in `p.epilogue`): the
// feature's bias added (a projection's bias), added to what `y` holds (a
// residual stream), or as the up projection of a gated feed-forward,
// multiplied by the activated gate (`bias` then holds the gate
// projection's outputs, laid out as `y`). The same f32 operations as the
// separate ops.
const EPILOGUE_BIAS: u32 = 1u;
const EPILOGUE_ACCUMULATE: u32 = 2u;
const EPILOGUE_SWIGLU: u32 = 4u;
const EPILOGUE_GEGLU: u32 = 8u;

fn emit(i: u32, o: u32, sum: f32) {
    var v = sum;
    if (p.epilogue & EPILOGUE_BIAS) != 0u {
        v += bias[p.row0 + o];
    }
    if (p.epilogue & EPILOGUE_SWIGLU) != 0u {
        v = swiglu_of(bias[i], v);
    }
    if (p.epilogue & EPILOGUE_GEGLU) != 0u {
        v = geglu_of(bias[i], v);
    }
    if (p.epilogue & EPILOGUE_ACCUMULATE) != 0u {
        v = y[i] + v;
    }
    y[i] = v;
}

// An invocation's output feature `o` (absolute index in this weight part),
// its lane among the feature's LANES, and the feature's slot `f` in the
// workgroup.
struct Place {
    o: u32,
    lane: u32,
    f: u32,
}

// Call once per invocation, in uniform control flow.
fn place(inv: Invocation) -> Place {
#if SUBGROUPS
    let f = subgroup_slot(inv.sg_lane) * (inv.sg_size / LANES) + inv.sg_lane / LANES;
    let lane = inv.sg_lane % LANES;
#else
    let f = inv.lid / LANES;
    let lane = inv.lid % LANES;
#endif
    return Place(group_index(inv.wid, inv.nwg) * FEATURES + f, lane, f);
}

// The sums of each row's LANES partial sums in `acc`, the same in every
// lane of the feature. Every invocation calls it (barriers).
fn reduce_rows(inv: Invocation, at: Place, acc: array<f32, NR>) -> array<f32, NR> {
#if SUBGROUPS
    var sums = acc;
    for (var s = LANES / 2u; s > 0u; s /= 2u) {
        for (var r = 0u; r < NR; r++) {
            sums[r] += subgroupShuffleXor(sums[r], s);
        }
    }
    return sums;
#else
    if LANES == 1u {
        // Nothing to add, and skipping the barriers is 1.6x faster on
        // lavapipe (LANES is an override, so this branch is uniform).
        return acc;
    }
    for (var r = 0u; r < NR; r++) {
        partial[r][inv.lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s /= 2u) {
        if at.lane < s {
            for (var r = 0u; r < NR; r++) {
                partial[r][inv.lid] += partial[r][inv.lid + s];
            }
        }
        workgroupBarrier();
    }
    var sums: array<f32, NR>;
    for (var r = 0u; r < NR; r++) {
        sums[r] = partial[r][at.f * LANES];
    }
    workgroupBarrier();
    return sums;
#endif
}

// Adds each row's LANES partial sums in `acc` and writes rows g..g+nr of
// feature `at.o` where it exists, the lanes sharing the rows. Every
// invocation calls it (barriers).
fn store_rows(inv: Invocation, at: Place, acc: array<f32, NR>, g: u32, nr: u32) {
    let sums = reduce_rows(inv, at, acc);
    if at.o < p.rows {
        for (var r = at.lane; r < nr; r += LANES) {
            emit((g + r) * p.out_cols + p.row0 + at.o, at.o, sums[r]);
        }
    }
}
