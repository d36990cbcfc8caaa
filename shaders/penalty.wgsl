// Repetition penalty (see Backend::penalize), in place on rows of logits:
// row r penalizes each distinct token among the last `last_n` of
// `history ++ batch[1..=r]` (positive logits divided, the others
// multiplied). One workgroup per row; a token counts where it first
// occurs in the row's window, so each is penalized once.

struct Params {
    rows: u32,
    cols: u32,       // vocabulary
    hist_len: u32,   // tokens in `hist` (the history's tail)
    last_n: u32,
    penalty: f32,
    batch_col: u32,  // column of the batch ids in `batch`
    batch_cols: u32, // 0: no batch
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> hist: array<u32>;
@group(0) @binding(3) var<storage, read> batch: array<f32>;

const WG: u32 = 64u;

// Token k of `history ++ batch[1..]`.
fn token(k: u32) -> u32 {
    if k < p.hist_len {
        return hist[k];
    }
    return u32(batch[(k - p.hist_len + 1u) * p.batch_cols + p.batch_col]);
}

@compute @workgroup_size(64)
fn penalize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if r >= p.rows {
        return;
    }
    var len = p.hist_len;
    if p.batch_cols > 0u {
        len += r;
    }
    let start = len - min(p.last_n, len);
    for (var k = start + lid; k < len; k += WG) {
        let t = token(k);
        var first = t < p.cols;
        for (var j = start; j < k && first; j++) {
            first = token(j) != t;
        }
        if first {
            let i = r * p.cols + t;
            let v = x[i];
            x[i] = select(v * p.penalty, v / p.penalty, v > 0.0);
        }
    }
}
