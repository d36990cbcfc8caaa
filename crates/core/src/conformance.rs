//! The op conformance suite every backend runs (as candle's `test_device!`
//! and llama.cpp's `test-backend-ops` do): each op on random shapes and
//! data, compared with a reference backend (the CPU backend) within a
//! per-op tolerance. Written once; [`crate::backend_conformance_tests!`]
//! instantiates it for a backend.

use crate::backend::{
    AttentionMask, AttentionParams, AttentionStep, Backend, ConvParams, DeltaNetParams,
    GatedActivation, HeadNorms, KvType, PendingBranch, Projection, RopeParams, RopeStyle, RowNorm,
    WeightRole, WeightSource,
};
use crate::sampling::{Rng, SamplingParams};
use blockdraft_gguf::{quants, GgmlType, GgufFile, GgufWriter};

/// Every weight type the matmul and embedding kernels must read in place.
pub const WEIGHT_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
];

fn uniform(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
        .collect()
}

fn tensor<B: Backend>(be: &B, rows: usize, cols: usize, data: &[f32]) -> B::Tensor {
    let mut t = be.tensor(rows, cols);
    be.write(&mut t, data);
    t
}

use crate::testing::rel_err;

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let err = rel_err(got, want);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

/// A GGUF holding one `rows x cols` weight `w` of type `ty`, so both
/// backends load the very same bytes: quantized random values where the
/// type has a quantizer, else random valid blocks (the read-only formats).
/// Backends' own tests build their weights with it too.
pub fn weight_file(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> GgufFile {
    let mut rng = Rng::new(seed);
    let bytes = if quants::can_quantize(ty) {
        let x = uniform(&mut rng, rows * cols, 1.0);
        quants::quantize_to_vec(ty, &x).expect("quantize")
    } else {
        random_blocks(ty, rows * cols / ty.block_len(), &mut rng)
    };
    file_of(ty, rows, cols, bytes)
}

/// A GGUF holding the F32 vector `values` as weight `w`.
fn f32_file(values: &[f32]) -> GgufFile {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    file_of(GgmlType::F32, 1, values.len(), bytes)
}

fn file_of(ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test");
    let dims: Vec<u64> = if rows == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    w.add_tensor("w", &dims, ty, bytes).expect("tensor");
    GgufFile::from_bytes(w.to_bytes().expect("gguf")).expect("parse")
}

/// Valid blocks of a read-only type (see `quants::can_quantize`): random
/// bytes with a small scale, as quantized weights have.
fn random_blocks(ty: GgmlType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..n_blocks * ty.block_bytes())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for b in bytes.chunks_exact_mut(ty.block_bytes()) {
        let d = (rng.next_f64() as f32 - 0.3) * 0.05;
        if !quants::lattice::set_scale(ty, b, d) && ty == GgmlType::NVFP4 {
            // E4M3 scales of about 2^-4 .. 2^-1 (exponents 3..6).
            for s in &mut b[..4] {
                *s = 0x18 + (*s & 0x1F);
            }
        }
    }
    bytes
}

fn load<B: Backend>(be: &B, file: &GgufFile) -> B::Weight {
    let info = file.tensor("w").expect("tensor w");
    be.load_weight(WeightSource {
        name: "w",
        ty: info.ty,
        dims: &info.dims,
        data: file.tensor_data("w").expect("data"),
        role: WeightRole::Target,
    })
    .unwrap_or_else(|e| panic!("loading a {} weight: {e}", info.ty))
}

/// Tolerance of a matmul against the reference: float weights agree to
/// rounding; quantized ones quantize the activations identically, so only
/// the summation order differs.
fn matmul_tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-5,
        _ => 2e-4,
    }
}

/// `x · Wᵀ` (`n` rows) on `be`, read back.
async fn matmul_on<B: Backend>(
    be: &B,
    w: &B::Weight,
    x: &[f32],
    (n, rows, cols): (usize, usize, usize),
) -> Vec<f32> {
    let mut out = be.tensor(n, rows);
    be.matmul(w, &tensor(be, n, cols, x), &mut out);
    be.read(&out).await
}

/// `out = x · Wᵀ` (`n` rows) on both backends, within `tol`.
async fn check_matmul<B: Backend, R: Backend>(
    be: &B,
    reference: &R,
    (w, wr): (&B::Weight, &R::Weight),
    x: &[f32],
    dims: (usize, usize, usize),
    what: &str,
    tol: f32,
) {
    let got = matmul_on(be, w, x, dims).await;
    assert_close(what, &got, &matmul_on(reference, wr, x, dims).await, tol);
}

/// RMS norm of `x` (`rows x cols`, in `group`-wide slices) on `be`.
async fn rms_norm_on<B: Backend>(
    be: &B,
    w: &B::Weight,
    x: &[f32],
    (rows, cols, group): (usize, usize, usize),
) -> Vec<f32> {
    let mut out = be.tensor(rows, cols);
    be.rms_norm(&tensor(be, rows, cols, x), w, group, 1e-6, &mut out);
    be.read(&out).await
}

/// RMS norm of `x` (`rows x cols`, in `group`-wide slices) on both backends.
async fn check_rms_norm<B: Backend, R: Backend>(
    be: &B,
    reference: &R,
    (w, wr): (&B::Weight, &R::Weight),
    x: &[f32],
    dims: (usize, usize, usize),
    what: &str,
) {
    let got = rms_norm_on(be, w, x, dims).await;
    assert_close(what, &got, &rms_norm_on(reference, wr, x, dims).await, 1e-5);
}

/// Attention of `q` (`rows` rows) over `k`/`v` (`kv_rows` rows) on `be`.
async fn attention_on<B: Backend>(
    be: &B,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (rows, kv_rows): (usize, usize),
    mask: AttentionMask,
    p: AttentionParams,
) -> Vec<f32> {
    let (qc, kvc) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
    let mut out = be.tensor(rows, qc);
    be.attention(
        &tensor(be, rows, qc, q),
        &tensor(be, kv_rows, kvc, k),
        &tensor(be, kv_rows, kvc, v),
        mask,
        p,
        &mut out,
    );
    be.read(&out).await
}

/// Attention of `q` (`rows` rows) over `k`/`v` (`kv_rows` rows) on both
/// backends.
async fn check_attention<B: Backend, R: Backend>(
    be: &B,
    reference: &R,
    qkv: (&[f32], &[f32], &[f32]),
    rows: (usize, usize),
    mask: AttentionMask,
    p: AttentionParams,
    what: &str,
) {
    let got = attention_on(be, qkv, rows, mask, p).await;
    let want = attention_on(reference, qkv, rows, mask, p).await;
    assert_close(what, &got, &want, 1e-5);
}

/// `x · Wᵀ` for every weight type, for 1..16 rows (the verify shapes) and
/// a prefill-size batch, with output-feature counts that are not multiples
/// of any tile.
pub async fn matmul<B: Backend, R: Backend>(be: &B, reference: &R) {
    for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
        let cols = match ty.block_len() {
            256 => 512,
            64 => 192,
            _ => 96,
        };
        let rows = 37 + 5 * i;
        let file = weight_file(ty, rows, cols, 100 + i as u64);
        let (w, wr) = (load(be, &file), load(reference, &file));
        for n in [1, 2, 3, 5, 8, 9, 16, 40] {
            let x = uniform(&mut Rng::new(n as u64), n * cols, 2.0);
            let what = format!("matmul {ty} n={n}");
            let tol = matmul_tolerance(ty);
            check_matmul(be, reference, (&w, &wr), &x, (n, rows, cols), &what, tol).await;
        }
    }
}

/// The fused compositions of the matmul: projections of one input with
/// and without biases, across weight types that quantize the input alike
/// (Q4_K, Q6_K) and differently (Q8_0, F16), a gated feed-forward's
/// projections, and a product added to a residual stream.
pub async fn matmul_fused<B: Backend, R: Backend>(be: &B, reference: &R) {
    let cols = 512;
    let specs = [
        (GgmlType::Q4_K, 48, true),
        (GgmlType::Q6_K, 16, false),
        (GgmlType::Q8_0, 40, true),
        (GgmlType::F16, 24, false),
    ];
    let files: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, &(ty, rows, _))| weight_file(ty, rows, cols, 500 + i as u64))
        .collect();
    let biases: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, &(_, rows, _))| weight_file(GgmlType::F32, 1, rows, 600 + i as u64))
        .collect();
    let (w, wr): (Vec<_>, Vec<_>) = files
        .iter()
        .map(|f| (load(be, f), load(reference, f)))
        .unzip();
    let (b, br): (Vec<_>, Vec<_>) = biases
        .iter()
        .map(|f| (load(be, f), load(reference, f)))
        .unzip();
    for n in [1, 5, 16] {
        let x = uniform(&mut Rng::new(50 + n as u64), n * cols, 2.0);
        let (xt, xr) = (tensor(be, n, cols, &x), tensor(reference, n, cols, &x));
        let mut outs: Vec<_> = specs.iter().map(|s| be.tensor(n, s.1)).collect();
        let mut projections: Vec<_> = outs
            .iter_mut()
            .enumerate()
            .map(|(i, out)| Projection {
                weight: &w[i],
                bias: specs[i].2.then_some(&b[i]),
                out,
            })
            .collect();
        be.matmul_many(&xt, &mut projections);
        for (i, out) in outs.iter().enumerate() {
            let mut want = reference.tensor(n, specs[i].1);
            reference.matmul(&wr[i], &xr, &mut want);
            if specs[i].2 {
                reference.add_bias(&mut want, &br[i]);
            }
            assert_close(
                &format!("matmul_many: {} of n={n}", specs[i].0),
                &be.read(out).await,
                &reference.read(&want).await,
                matmul_tolerance(specs[i].0),
            );
        }
        // act(x · W_gateᵀ) ⊙ (x · W_upᵀ), gate Q4_K and up Q6_K (one
        // quantization of x), and the other way round for GeGLU.
        for (act, g, u) in [
            (GatedActivation::SwiGlu, 0, 1),
            (GatedActivation::GeGlu, 1, 0),
        ] {
            let rows = specs[0].1.min(specs[1].1);
            let gfile = weight_file(specs[g].0, rows, cols, 800 + g as u64);
            let ufile = weight_file(specs[u].0, rows, cols, 800 + u as u64);
            let (wg, wu) = (load(be, &gfile), load(be, &ufile));
            let (wgr, wur) = (load(reference, &gfile), load(reference, &ufile));
            let t = || be.tensor(n, rows);
            let (mut gate, mut up, mut out) = (t(), t(), t());
            be.gated_projection(act, &xt, &wg, &wu, &mut gate, &mut up, &mut out);
            let t = || reference.tensor(n, rows);
            let (mut gate, mut up, mut want) = (t(), t(), t());
            reference.matmul(&wgr, &xr, &mut gate);
            reference.matmul(&wur, &xr, &mut up);
            reference.gated(act, &gate, &up, &mut want);
            assert_close(
                &format!("gated_projection {act:?} n={n}"),
                &be.read(&out).await,
                &reference.read(&want).await,
                // GELU rounds its input to f16: a last-bit difference of
                // the product may round it the other way.
                2e-3,
            );
        }
        // acc += x · Wᵀ for a W of `cols` outputs (a residual stream).
        let file = weight_file(GgmlType::Q4_K, cols, cols, 700);
        let (wa, wra) = (load(be, &file), load(reference, &file));
        let start = uniform(&mut Rng::new(70 + n as u64), n * cols, 4.0);
        let mut acc = tensor(be, n, cols, &start);
        let mut scratch = be.tensor(n, cols);
        be.matmul_accumulate(&wa, &xt, &mut acc, &mut scratch);
        let mut want = tensor(reference, n, cols, &start);
        let mut product = reference.tensor(n, cols);
        reference.matmul(&wra, &xr, &mut product);
        reference.add(&mut want, &product);
        assert_close(
            &format!("matmul_accumulate n={n}"),
            &be.read(&acc).await,
            &reference.read(&want).await,
            matmul_tolerance(GgmlType::Q4_K),
        );
    }
}

/// Projections of a normalized input ([`crate::backend::LinearOps::normed_matmul_many`]
/// and `normed_gated_projection`) of weights placed side by side by
/// [`crate::backend::Device::colocate`] (as a model's q|k|v, their biases
/// and gate|up are): the norm's output and each product against the
/// reference's norm then product, for weights that read 32-blocks (rows of
/// 352 values, not a whole number of 256-chunks), mixed types among them,
/// and K-quant blocks, with and without biases, and with and without a
/// pending branch (a post-normed output added to the input first, which
/// is then checked too).
pub async fn normed_projections<B: Backend, R: Backend>(be: &B, reference: &R) {
    for (cols, types) in [
        (352, [GgmlType::Q4_1, GgmlType::Q4_1, GgmlType::Q4_1]),
        (352, [GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0]),
        (512, [GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K]),
    ] {
        let rows = [40, 16, 24];
        let seed = cols as u64 + types[2] as u64;
        let files: Vec<_> = (0..3)
            .map(|i| weight_file(types[i], rows[i], cols, seed + i as u64))
            .collect();
        let (mut w, wr): (Vec<_>, Vec<_>) = files
            .iter()
            .map(|f| (load(be, f), load(reference, f)))
            .unzip();
        be.colocate(&mut w.iter_mut().collect::<Vec<_>>());
        let bias_files: Vec<_> = (0..3)
            .map(|i| weight_file(GgmlType::F32, 1, rows[i], seed + 10 + i as u64))
            .collect();
        let (mut b, br): (Vec<_>, Vec<_>) = bias_files
            .iter()
            .map(|f| (load(be, f), load(reference, f)))
            .unzip();
        be.colocate(&mut b.iter_mut().collect::<Vec<_>>());
        let norm_file = weight_file(GgmlType::F32, 1, cols, seed + 20);
        let (nw, nwr) = (load(be, &norm_file), load(reference, &norm_file));
        let post_file = weight_file(GgmlType::F32, 1, cols, seed + 21);
        let (pw, pwr) = (load(be, &post_file), load(reference, &post_file));
        for (n, with_bias, with_pending) in [(1, true, false), (3, false, true), (8, true, true)] {
            let mut rng = Rng::new(seed + n as u64);
            let x = uniform(&mut rng, n * cols, 3.0);
            // A branch output of another scale than the stream's.
            let y = uniform(&mut rng, n * cols, 40.0);
            let (yt, yr) = (tensor(be, n, cols, &y), tensor(reference, n, cols, &y));
            let pending = || {
                with_pending.then_some(PendingBranch {
                    output: &yt,
                    post_norm: &pw,
                    eps: 1e-5,
                })
            };
            let mut xr = tensor(reference, n, cols, &x);
            if with_pending {
                let mut scratch = reference.tensor(n, cols);
                reference.add_normed(&mut xr, &yr, &pwr, 1e-5, &mut scratch);
            }
            let x_want = reference.read(&xr).await;
            let mut xn_r = reference.tensor(n, cols);
            reference.rms_norm(&xr, &nwr, cols, 1e-6, &mut xn_r);
            let xn_want = reference.read(&xn_r).await;

            let mut xn = be.tensor(n, cols);
            let mut outs: Vec<_> = rows.iter().map(|&r| be.tensor(n, r)).collect();
            let mut projections: Vec<_> = outs
                .iter_mut()
                .enumerate()
                .map(|(i, out)| Projection {
                    weight: &w[i],
                    bias: with_bias.then_some(&b[i]),
                    out,
                })
                .collect();
            let norm = RowNorm {
                weight: &nw,
                eps: 1e-6,
                out: &mut xn,
                pending: pending(),
            };
            let mut xt = tensor(be, n, cols, &x);
            be.normed_matmul_many(&mut xt, norm, &mut projections);
            let what = format!("normed_matmul_many {cols} cols n={n} pending {with_pending}");
            assert_close(&format!("{what}: x"), &be.read(&xt).await, &x_want, 1e-5);
            assert_close(&what, &be.read(&xn).await, &xn_want, 1e-5);
            for (i, out) in outs.iter().enumerate() {
                let mut want = reference.tensor(n, rows[i]);
                reference.matmul(&wr[i], &xn_r, &mut want);
                if with_bias {
                    reference.add_bias(&mut want, &br[i]);
                }
                assert_close(
                    &format!("{what}: {}", types[i]),
                    &be.read(out).await,
                    &reference.read(&want).await,
                    matmul_tolerance(types[i]),
                );
            }

            // Gate and up of the same rows (the first and third weights).
            let ff = rows[0].min(rows[2]);
            let gfile = weight_file(types[0], ff, cols, seed + 30);
            let ufile = weight_file(types[2], ff, cols, seed + 31);
            let (mut wg, mut wu) = (load(be, &gfile), load(be, &ufile));
            be.colocate(&mut [&mut wg, &mut wu]);
            let (wgr, wur) = (load(reference, &gfile), load(reference, &ufile));
            let t = || be.tensor(n, ff);
            let (mut gate, mut up, mut out) = (t(), t(), t());
            let mut xn = be.tensor(n, cols);
            let norm = RowNorm {
                weight: &nw,
                eps: 1e-6,
                out: &mut xn,
                pending: pending(),
            };
            let act = GatedActivation::SwiGlu;
            let mut xt = tensor(be, n, cols, &x);
            be.normed_gated_projection(act, &mut xt, norm, &wg, &wu, &mut gate, &mut up, &mut out);
            let what = format!("normed_gated_projection {cols} cols n={n} pending {with_pending}");
            assert_close(&format!("{what}: x"), &be.read(&xt).await, &x_want, 1e-5);
            assert_close(&what, &be.read(&xn).await, &xn_want, 1e-5);
            let t = || reference.tensor(n, ff);
            let (mut gate, mut up, mut want) = (t(), t(), t());
            reference.matmul(&wgr, &xn_r, &mut gate);
            reference.matmul(&wur, &xn_r, &mut up);
            reference.gated(act, &gate, &up, &mut want);
            assert_close(
                &what,
                &be.read(&out).await,
                &reference.read(&want).await,
                matmul_tolerance(types[0]).max(matmul_tolerance(types[2])),
            );
        }
    }
}

/// Embedding rows of every weight type, repeated and unordered ids.
pub async fn embed<B: Backend, R: Backend>(be: &B, reference: &R) {
    for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
        let cols = ty.block_len().max(32) * 2;
        let file = weight_file(ty, 19, cols, 200 + i as u64);
        let (w, wr) = (load(be, &file), load(reference, &file));
        let ids = [3u32, 0, 18, 3, 7];
        let mut out = be.tensor(ids.len(), cols);
        be.embed(&w, &ids, &mut out);
        let mut want = reference.tensor(ids.len(), cols);
        reference.embed(&wr, &ids, &mut want);
        assert_close(
            &format!("embed {ty}"),
            &be.read(&out).await,
            &reference.read(&want).await,
            0.0,
        );
    }
}

/// RMS norm over whole rows and over per-head groups (q/k norms).
pub async fn rms_norm<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(7);
    for (rows, cols, group) in [(1, 64, 64), (5, 300, 300), (3, 128, 32), (2, 1536, 1536)] {
        let x = uniform(&mut rng, rows * cols, 3.0);
        let file = weight_file(GgmlType::F32, 1, group, 300 + group as u64);
        let (w, wr) = (load(be, &file), load(reference, &file));
        let what = format!("rms_norm {rows}x{cols}/{group}");
        check_rms_norm(be, reference, (&w, &wr), &x, (rows, cols, group), &what).await;
        if group == cols {
            // A residual branch added through its post-norm.
            let start = uniform(&mut rng, rows * cols, 2.0);
            let mut acc = tensor(be, rows, cols, &start);
            let mut scratch = be.tensor(rows, cols);
            be.add_normed(
                &mut acc,
                &tensor(be, rows, cols, &x),
                &w,
                1e-6,
                &mut scratch,
            );
            let mut want = tensor(reference, rows, cols, &start);
            let mut normed = reference.tensor(rows, cols);
            let xr = tensor(reference, rows, cols, &x);
            reference.rms_norm(&xr, &wr, cols, 1e-6, &mut normed);
            reference.add(&mut want, &normed);
            assert_close(
                &format!("add_normed {rows}x{cols}"),
                &be.read(&acc).await,
                &reference.read(&want).await,
                1e-5,
            );
        }
    }
}

/// Both rotary layouts, partial rotation, and large positions.
pub async fn rope<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(8);
    for (style, n_head, head_dim, n_rot, pos0, rows) in [
        (RopeStyle::Normal, 4, 64, 64, 0, 3),
        (RopeStyle::Neox, 2, 128, 128, 17, 5),
        (RopeStyle::Neox, 3, 64, 32, 4000, 2),
        (RopeStyle::Normal, 1, 256, 256, 131_000, 1),
    ] {
        let p = RopeParams {
            style,
            n_head,
            head_dim,
            n_rot,
            base: 10_000.0,
        };
        let cols = n_head * head_dim;
        let x = uniform(&mut rng, rows * cols, 2.0);
        let mut t = tensor(be, rows, cols, &x);
        be.rope(&mut t, pos0, p);
        let mut tr = tensor(reference, rows, cols, &x);
        reference.rope(&mut tr, pos0, p);
        assert_close(
            &format!("rope {p:?} pos {pos0}"),
            &be.read(&t).await,
            &reference.read(&tr).await,
            1e-5,
        );
    }
}

/// A layer's attention inputs in one step each: queries and keys rotated
/// together (both layouts, partial rotation, positions across a rope
/// table's window) and keys and values appended to f32 and f16 caches.
pub async fn attention_inputs<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(17);
    for (style, n_rot, pos0, rows) in [
        (RopeStyle::Neox, 64, 0, 5),
        (RopeStyle::Normal, 32, 1020, 9),
        (RopeStyle::Neox, 64, 70_000, 1),
    ] {
        let (n_head, n_head_kv, head_dim) = (6, 2, 64);
        let p = |n_head| RopeParams {
            style,
            n_head,
            head_dim,
            n_rot,
            base: 10_000.0,
        };
        let (qc, kc) = (n_head * head_dim, n_head_kv * head_dim);
        let (q, k) = (
            uniform(&mut rng, rows * qc, 2.0),
            uniform(&mut rng, rows * kc, 2.0),
        );
        let (mut qt, mut kt) = (tensor(be, rows, qc, &q), tensor(be, rows, kc, &k));
        be.rope_qk(&mut qt, &mut kt, pos0, p(n_head), p(n_head_kv));
        let (mut qr, mut kr) = (
            tensor(reference, rows, qc, &q),
            tensor(reference, rows, kc, &k),
        );
        reference.rope(&mut qr, pos0, p(n_head));
        reference.rope(&mut kr, pos0, p(n_head_kv));
        for (what, got, want) in [("q", &qt, &qr), ("k", &kt, &kr)] {
            assert_close(
                &format!("rope_qk {what} {style:?} pos {pos0}"),
                &be.read(got).await,
                &reference.read(want).await,
                1e-5,
            );
        }
        let v = uniform(&mut rng, rows * kc, 2.0);
        let vt = tensor(be, rows, kc, &v);
        let vr = tensor(reference, rows, kc, &v);
        for ty in [KvType::F32, KvType::F16] {
            let capacity = rows + 3;
            let (mut kc_t, mut vc_t) = (
                be.kv_tensor(capacity, kc, ty),
                be.kv_tensor(capacity, kc, ty),
            );
            be.append_kv(&kt, &vt, &mut kc_t, &mut vc_t, 2, rows);
            let mut kc_r = reference.kv_tensor(capacity, kc, ty);
            let mut vc_r = reference.kv_tensor(capacity, kc, ty);
            reference.copy_rows(&kr, 0, &mut kc_r, 2, 0, rows);
            reference.copy_rows(&vr, 0, &mut vc_r, 2, 0, rows);
            for (what, got, want) in [("k", &kc_t, &kc_r), ("v", &vc_t, &vc_r)] {
                assert_close(
                    &format!("append_kv {what} {ty:?}"),
                    &be.read(got).await,
                    &reference.read(want).await,
                    // The rotated keys may differ in their last bit, which
                    // f16 rounding can carry one f16 step.
                    if ty == KvType::F16 { 1e-3 } else { 1e-5 },
                );
            }
        }
    }
}

/// A layer's whole attention step ([`crate::backend::AttentionOps::attention_step`])
/// over caches already holding earlier rows: its output and both caches
/// against the reference's rope, scale, append and attention, for both
/// rotation styles, partial rotation, f32 and f16 caches, causal and
/// bidirectional masks, a sliding window, scaled queries, and more rows
/// than a GPU's one-pass step holds (64 rows of 64); each with and without
/// head norms (their weights side by side, as a model's are).
pub async fn attention_step<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(23);
    let (n_head, n_head_kv, head_dim) = (6, 2, 64);
    let (qc, kc) = (n_head * head_dim, n_head_kv * head_dim);
    let norm_files = [24, 25].map(|seed| weight_file(GgmlType::F32, 1, head_dim, seed));
    let [mut q_norm, mut k_norm] = norm_files.each_ref().map(|f| load(be, f));
    be.colocate(&mut [&mut q_norm, &mut k_norm]);
    let [q_norm_r, k_norm_r] = norm_files.each_ref().map(|f| load(reference, f));
    #[allow(clippy::type_complexity)]
    let cases: [(
        RopeStyle,
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
        Option<f32>,
        KvType,
    ); 7] = [
        (RopeStyle::Neox, 64, 0, 5, true, None, None, KvType::F32),
        (RopeStyle::Neox, 64, 37, 1, true, None, None, KvType::F16),
        (
            RopeStyle::Normal,
            32,
            20,
            9,
            true,
            Some(7),
            Some(0.125),
            KvType::F16,
        ),
        (RopeStyle::Neox, 32, 11, 8, false, None, None, KvType::F32),
        (
            RopeStyle::Normal,
            64,
            1020,
            3,
            true,
            None,
            Some(0.5),
            KvType::F32,
        ),
        (RopeStyle::Neox, 64, 3, 16, true, None, None, KvType::F16),
        (RopeStyle::Neox, 64, 5, 64, true, None, None, KvType::F32),
    ];
    let cases = cases.into_iter().flat_map(|c| [(c, false), (c, true)]);
    for ((style, n_rot, pos0, rows, causal, window, q_scale, ty), normed) in cases {
        let rope = |n_head| RopeParams {
            style,
            n_head,
            head_dim,
            n_rot,
            base: 10_000.0,
        };
        let capacity = pos0 + rows + 2;
        let old_k = uniform(&mut rng, capacity * kc, 2.0);
        let old_v = uniform(&mut rng, capacity * kc, 2.0);
        let (q, k, v) = (
            uniform(&mut rng, rows * qc, 2.0),
            uniform(&mut rng, rows * kc, 2.0),
            uniform(&mut rng, rows * kc, 2.0),
        );
        let step = AttentionStep {
            q_rope: rope(n_head),
            k_rope: rope(n_head_kv),
            q_scale,
            mask: AttentionMask {
                q_pos0: pos0,
                kv_len: pos0 + rows,
                causal,
                window,
            },
            params: AttentionParams {
                n_head,
                n_head_kv,
                head_dim,
                scale: if q_scale.is_some() { 1.0 } else { 0.125 },
            },
        };
        let (mut qt, mut kt, vt) = (
            tensor(be, rows, qc, &q),
            tensor(be, rows, kc, &k),
            tensor(be, rows, kc, &v),
        );
        let (mut kc_t, mut vc_t) = (
            be.kv_tensor(capacity, kc, ty),
            be.kv_tensor(capacity, kc, ty),
        );
        be.write(&mut kc_t, &old_k);
        be.write(&mut vc_t, &old_v);
        let mut out = be.tensor(rows, qc);
        let (mut q_out, mut k_out) = (be.tensor(rows, qc), be.tensor(rows, kc));
        let head_norms = normed.then_some(HeadNorms {
            q_weight: &q_norm,
            k_weight: &k_norm,
            eps: 1e-6,
            q_out: &mut q_out,
            k_out: &mut k_out,
        });
        be.attention_step(
            (&mut qt, &mut kt, &vt),
            (&mut kc_t, &mut vc_t),
            step,
            head_norms,
            &mut out,
        );

        let (mut qr, mut kr, vr) = (
            tensor(reference, rows, qc, &q),
            tensor(reference, rows, kc, &k),
            tensor(reference, rows, kc, &v),
        );
        if normed {
            let mut normed_q = reference.tensor(rows, qc);
            reference.rms_norm(&qr, &q_norm_r, head_dim, 1e-6, &mut normed_q);
            let mut normed_k = reference.tensor(rows, kc);
            reference.rms_norm(&kr, &k_norm_r, head_dim, 1e-6, &mut normed_k);
            (qr, kr) = (normed_q, normed_k);
        }
        reference.rope(&mut qr, pos0, rope(n_head));
        reference.rope(&mut kr, pos0, rope(n_head_kv));
        if let Some(s) = q_scale {
            reference.scale(&mut qr, s);
        }
        let mut kc_r = reference.kv_tensor(capacity, kc, ty);
        let mut vc_r = reference.kv_tensor(capacity, kc, ty);
        reference.write(&mut kc_r, &old_k);
        reference.write(&mut vc_r, &old_v);
        reference.copy_rows(&kr, 0, &mut kc_r, pos0, 0, rows);
        reference.copy_rows(&vr, 0, &mut vc_r, pos0, 0, rows);
        let mut want = reference.tensor(rows, qc);
        reference.attention(&qr, &kc_r, &vc_r, step.mask, step.params, &mut want);
        let what = format!(
            "attention_step {style:?} rot {n_rot} at {pos0}, {rows} rows, {ty:?}, head norms {normed}"
        );
        // The rotated keys may differ in their last bit, which f16
        // rounding can carry one f16 step.
        let cache_tol = if ty == KvType::F16 { 1e-3 } else { 1e-5 };
        for (part, got, want) in [("keys", &kc_t, &kc_r), ("values", &vc_t, &vc_r)] {
            assert_close(
                &format!("{what}: cached {part}"),
                &be.read(got).await,
                &reference.read(want).await,
                cache_tol,
            );
        }
        assert_close(
            &format!("{what}: output"),
            &be.read(&out).await,
            &reference.read(&want).await,
            if ty == KvType::F16 { 2e-3 } else { 1e-4 },
        );
    }
}

/// Gated activations, residual add, scale, bias, softcapping and the tap
/// sanitiser.
pub async fn elementwise<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(9);
    let (rows, cols) = (3, 200);
    let g = uniform(&mut rng, rows * cols, 8.0);
    let u = uniform(&mut rng, rows * cols, 2.0);
    for act in [GatedActivation::SwiGlu, GatedActivation::GeGlu] {
        let mut out = be.tensor(rows, cols);
        be.gated(
            act,
            &tensor(be, rows, cols, &g),
            &tensor(be, rows, cols, &u),
            &mut out,
        );
        let mut want = reference.tensor(rows, cols);
        reference.gated(
            act,
            &tensor(reference, rows, cols, &g),
            &tensor(reference, rows, cols, &u),
            &mut want,
        );
        assert_close(
            &format!("{act:?}"),
            &be.read(&out).await,
            &reference.read(&want).await,
            1e-5,
        );
    }

    let mut x = tensor(be, rows, cols, &g);
    be.add(&mut x, &tensor(be, rows, cols, &u));
    be.scale(&mut x, -0.75);
    let file = weight_file(GgmlType::F32, 1, cols, 400);
    be.add_bias(&mut x, &load(be, &file));
    let mut xr = tensor(reference, rows, cols, &g);
    reference.add(&mut xr, &tensor(reference, rows, cols, &u));
    reference.scale(&mut xr, -0.75);
    reference.add_bias(&mut xr, &load(reference, &file));
    assert_close(
        "add/scale/add_bias",
        &be.read(&x).await,
        &reference.read(&xr).await,
        1e-6,
    );

    let mut x = tensor(be, rows, cols, &g);
    be.softcap(&mut x, 5.0);
    let mut xr = tensor(reference, rows, cols, &g);
    reference.softcap(&mut xr, 5.0);
    assert_close(
        "softcap",
        &be.read(&x).await,
        &reference.read(&xr).await,
        1e-6,
    );

    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e9,
        -7e4,
        3.5,
        -0.0,
        65504.0,
    ];
    let mut t = tensor(be, 1, special.len(), &special);
    be.clamp_finite(&mut t, 65504.0);
    let mut tr = tensor(reference, 1, special.len(), &special);
    reference.clamp_finite(&mut tr, 65504.0);
    assert_eq!(be.read(&t).await, reference.read(&tr).await, "clamp_finite");
}

/// Row copies into a wider tensor at a row and column offset, and reshape
/// within capacity.
pub async fn copy_rows<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(10);
    let src = uniform(&mut rng, 6 * 40, 1.0);
    let dst = uniform(&mut rng, 9 * 100, 1.0);
    let s = tensor(be, 6, 40, &src);
    let mut d = tensor(be, 9, 100, &dst);
    be.copy_rows(&s, 2, &mut d, 5, 60, 3);
    let sr = tensor(reference, 6, 40, &src);
    let mut dr = tensor(reference, 9, 100, &dst);
    reference.copy_rows(&sr, 2, &mut dr, 5, 60, 3);
    assert_eq!(be.read(&d).await, reference.read(&dr).await, "copy_rows");
    be.reshape(&mut d, 3, 50);
    assert_eq!(be.shape(&d), (3, 50));
    assert_eq!(
        be.read(&d).await,
        dst_prefix(&reference.read(&dr).await, 150),
        "reshape keeps the data"
    );
}

fn dst_prefix(v: &[f32], n: usize) -> Vec<f32> {
    v[..n].to_vec()
}

/// Attention for decode, multi-row verify and non-causal blocks, with
/// grouped-query heads, sliding windows and caches longer than one tile.
pub async fn attention<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(11);
    let cases = [
        // (n_head, n_head_kv, head_dim, rows, q_pos0, capacity, causal, window)
        (4, 2, 64, 1, 0, 8, true, None),
        (4, 1, 64, 1, 150, 200, true, None),
        (2, 2, 128, 7, 90, 128, true, None),
        (6, 2, 32, 16, 300, 400, false, None),
        (4, 4, 256, 5, 60, 80, true, Some(16)),
        (8, 2, 64, 3, 0, 3, false, Some(2)),
    ];
    for (n_head, n_head_kv, head_dim, rows, q_pos0, capacity, causal, window) in cases {
        let p = AttentionParams {
            n_head,
            n_head_kv,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let mask = AttentionMask {
            q_pos0,
            kv_len: q_pos0 + rows,
            causal,
            window,
        };
        let (qc, kvc) = (n_head * head_dim, n_head_kv * head_dim);
        let q = uniform(&mut rng, rows * qc, 2.0);
        let k = uniform(&mut rng, capacity.max(q_pos0 + rows) * kvc, 2.0);
        let v = uniform(&mut rng, capacity.max(q_pos0 + rows) * kvc, 1.0);
        let kv_rows = k.len() / kvc;
        let what = format!("attention {p:?} {mask:?}");
        check_attention(be, reference, (&q, &k, &v), (rows, kv_rows), mask, p, &what).await;
    }
}

/// An f16 KV cache: rows appended with `copy_rows` (and written whole)
/// hold the values rounded to f16 exactly as `half` rounds them (ties to
/// even, subnormals, overflow to infinity), and attention over it equals
/// the reference's over an f32 cache of those rounded values.
pub async fn kv_f16<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(13);
    let (n_head, n_head_kv, head_dim, capacity) = (4, 2, 64, 40);
    let kvc = n_head_kv * head_dim;
    let mut k = uniform(&mut rng, capacity * kvc, 2.0);
    let v = uniform(&mut rng, capacity * kvc, 1.0);
    // Ties, subnormals, the largest f16, overflow, signed zeros.
    let special = [
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        1e-6,
        -3e-8,
        6.0e-5,
        65504.0,
        65520.0,
        -70000.0,
        -0.0,
        1.0 / 3.0,
    ];
    let rounded =
        |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect() };
    // Bit for bit: -0.0 and 0.0 differ, as do NaN payloads.
    let same_bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    // Whole writes round the same way.
    let mut t = be.kv_tensor(1, special.len(), KvType::F16);
    be.write(&mut t, &special);
    let got = be.read(&t).await;
    let want = rounded(&special);
    assert!(same_bits(&got, &want), "f16 write: {got:?} != {want:?}");
    k[5..5 + 4].copy_from_slice(&special[..4]);
    // Appends of 7 rows, then 1, then 32, as prefill, decode and verify do.
    let mut kc = be.kv_tensor(capacity, kvc, KvType::F16);
    let mut vc = be.kv_tensor(capacity, kvc, KvType::F16);
    let (ks, vs) = (tensor(be, capacity, kvc, &k), tensor(be, capacity, kvc, &v));
    for (row, n) in [(0, 7), (7, 1), (8, 32)] {
        be.copy_rows(&ks, row, &mut kc, row, 0, n);
        be.copy_rows(&vs, row, &mut vc, row, 0, n);
    }
    let (k16, v16) = (rounded(&k), rounded(&v));
    assert!(
        same_bits(&be.read(&kc).await, &k16),
        "f16 copy_rows of keys differs from half's rounding"
    );
    assert!(
        same_bits(&be.read(&vc).await, &v16),
        "f16 copy_rows of values differs from half's rounding"
    );
    let p = AttentionParams {
        n_head,
        n_head_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let qc = n_head * head_dim;
    let mut ref_kc = reference.kv_tensor(capacity, kvc, KvType::F16);
    let mut ref_vc = reference.kv_tensor(capacity, kvc, KvType::F16);
    reference.write(&mut ref_kc, &k);
    reference.write(&mut ref_vc, &v);
    for (rows, q_pos0, causal) in [(1, 39, true), (6, 30, true), (8, 32, false)] {
        let mask = AttentionMask {
            q_pos0,
            kv_len: q_pos0 + rows,
            causal,
            window: None,
        };
        let q = uniform(&mut rng, rows * qc, 2.0);
        let mut out = be.tensor(rows, qc);
        be.attention(&tensor(be, rows, qc, &q), &kc, &vc, mask, p, &mut out);
        let mut want = reference.tensor(rows, qc);
        reference.attention(
            &tensor(reference, rows, qc, &q),
            &ref_kc,
            &ref_vc,
            mask,
            p,
            &mut want,
        );
        // The reference follows llama.cpp's flash attention, which rounds
        // the query and its value accumulator to f16: a backend summing in
        // f32 is within f16's rounding of it.
        assert_close(
            &format!("f16 attention {mask:?}"),
            &be.read(&out).await,
            &reference.read(&want).await,
            4e-3,
        );
    }
}

/// DFlash2's grouped dynamic convolution, both sides.
pub async fn grouped_conv<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(12);
    let (n, d, taps, group) = (7, 64, 3, 16);
    let dyn_cols = 2 * taps * d / group;
    let x = uniform(&mut rng, n * d, 1.0);
    let base = uniform(&mut rng, 2 * taps * d, 1.0);
    let dynamic = uniform(&mut rng, n * dyn_cols, 0.5);
    for side in [0, 1] {
        let p = ConvParams { taps, group, side };
        let mut out = be.tensor(n, d);
        be.grouped_conv(
            &tensor(be, n, d, &x),
            &tensor(be, 2 * taps, d, &base),
            &tensor(be, n, dyn_cols, &dynamic),
            p,
            &mut out,
        );
        let mut want = reference.tensor(n, d);
        reference.grouped_conv(
            &tensor(reference, n, d, &x),
            &tensor(reference, 2 * taps, d, &base),
            &tensor(reference, n, dyn_cols, &dynamic),
            p,
            &mut want,
        );
        assert_close(
            &format!("grouped_conv side {side}"),
            &be.read(&out).await,
            &reference.read(&want).await,
            1e-5,
        );
    }
}

/// The hybrid blocks' ops ([`crate::backend::HybridOps`]): the causal
/// convolution from a non-zero state (output and the state after it), the
/// gated delta rule over several rows with key heads shared by value heads
/// and a decode row (output and state), the head split and the sigmoid
/// gate. A backend without them skips, saying so.
pub async fn hybrid_blocks<B: Backend, R: Backend>(be: &B, reference: &R) {
    if !be.runs_hybrid_blocks() {
        eprintln!(
            "SKIP hybrid_blocks: {} does not run hybrid blocks",
            be.name()
        );
        return;
    }
    let mut rng = Rng::new(35);
    let (c, taps) = (96, 4);
    let conv_w = weight_file(GgmlType::F32, c, taps, 36);
    for n in [1, 5] {
        let x = uniform(&mut rng, n * c, 1.0);
        let state = uniform(&mut rng, (taps - 1) * c, 1.0);
        let (mut s_got, mut out) = (tensor(be, taps - 1, c, &state), be.tensor(n, c));
        be.causal_conv_silu(
            &tensor(be, n, c, &x),
            &load(be, &conv_w),
            &mut s_got,
            &mut out,
        );
        let (mut s_want, mut want) = (
            tensor(reference, taps - 1, c, &state),
            reference.tensor(n, c),
        );
        reference.causal_conv_silu(
            &tensor(reference, n, c, &x),
            &load(reference, &conv_w),
            &mut s_want,
            &mut want,
        );
        let what = format!("causal_conv_silu, {n} rows");
        assert_close(
            &what,
            &be.read(&out).await,
            &reference.read(&want).await,
            1e-5,
        );
        assert_close(
            &what,
            &be.read(&s_got).await,
            &reference.read(&s_want).await,
            0.0,
        );
    }
    // Key heads shared by value heads; and value heads wider than a GPU
    // workgroup or a CPU block.
    let shapes = [(2, 4, 32, 32), (1, 2, 48, 160)];
    for (n_k_heads, n_v_heads, k_dim, v_dim) in shapes {
        let p = DeltaNetParams {
            n_k_heads,
            n_v_heads,
            k_dim,
            v_dim,
            eps: 1e-6,
        };
        delta_rule_case(be, reference, &mut rng, p).await;
    }
    let (n, heads, d) = (3, 4, 16);
    let x = uniform(&mut rng, n * heads * 2 * d, 4.0);
    let (mut first, mut second) = (be.tensor(n, heads * d), be.tensor(n, heads * d));
    be.split_heads(
        &tensor(be, n, heads * 2 * d, &x),
        d,
        &mut first,
        &mut second,
    );
    let (mut r_first, mut r_second) = (
        reference.tensor(n, heads * d),
        reference.tensor(n, heads * d),
    );
    reference.split_heads(
        &tensor(reference, n, heads * 2 * d, &x),
        d,
        &mut r_first,
        &mut r_second,
    );
    assert_close(
        "split_heads",
        &be.read(&first).await,
        &reference.read(&r_first).await,
        0.0,
    );
    assert_close(
        "split_heads",
        &be.read(&second).await,
        &reference.read(&r_second).await,
        0.0,
    );
    let gate = uniform(&mut rng, n * heads * d, 6.0);
    be.sigmoid_mul(&mut first, &tensor(be, n, heads * d, &gate));
    reference.sigmoid_mul(&mut r_first, &tensor(reference, n, heads * d, &gate));
    assert_close(
        "sigmoid_mul",
        &be.read(&first).await,
        &reference.read(&r_first).await,
        1e-6,
    );
}

/// [`hybrid_blocks`]'s delta-rule case for one geometry.
async fn delta_rule_case<B: Backend, R: Backend>(
    be: &B,
    reference: &R,
    rng: &mut Rng,
    p: DeltaNetParams,
) {
    let (rows, cols) = p.state_shape();
    let hv = p.n_v_heads;
    let dt_bias = weight_file(GgmlType::F32, 1, hv, 37);
    // Decays of either sign for a few rows; a prompt's worth of rows (past
    // a backend's chunk boundaries, where a prefill form takes over) with
    // a real model's `a = −exp(A_log)`, as a growing state would overflow.
    let mixed = weight_file(GgmlType::F32, 1, hv, 38);
    let decaying = f32_file(
        &uniform(rng, hv, 1.0)
            .iter()
            .map(|u| -1.5 - u)
            .collect::<Vec<_>>(),
    );
    // A decode row in place; six rows read from another tensor (a
    // checkpoint's), which stays as it was; a prefill.
    for (n, from_other) in [(1, false), (6, true), (150, false)] {
        let a = if n > 6 { &decaying } else { &mixed };
        let x = uniform(rng, n * p.input_dim(), 1.0);
        let alpha = uniform(rng, n * p.n_v_heads, 2.0);
        let beta = uniform(rng, n * p.n_v_heads, 2.0);
        let state = uniform(rng, rows * cols, 0.5);
        let stale = uniform(rng, rows * cols, 9.0);
        let width = p.n_v_heads * p.v_dim;
        let from = tensor(be, rows, cols, &state);
        let mut s_got = tensor(be, rows, cols, if from_other { &stale } else { &state });
        let mut out = be.tensor(n, width);
        be.gated_delta_rule(
            &tensor(be, n, p.input_dim(), &x),
            &tensor(be, n, p.n_v_heads, &alpha),
            &tensor(be, n, p.n_v_heads, &beta),
            &load(be, &dt_bias),
            &load(be, a),
            from_other.then_some(&from),
            &mut s_got,
            &mut out,
            p,
        );
        let mut s_want = tensor(reference, rows, cols, &state);
        let mut want = reference.tensor(n, width);
        reference.gated_delta_rule(
            &tensor(reference, n, p.input_dim(), &x),
            &tensor(reference, n, p.n_v_heads, &alpha),
            &tensor(reference, n, p.n_v_heads, &beta),
            &load(reference, &dt_bias),
            &load(reference, a),
            None,
            &mut s_want,
            &mut want,
            p,
        );
        let what = format!("gated_delta_rule, {n} rows");
        assert_close(
            &what,
            &be.read(&out).await,
            &reference.read(&want).await,
            1e-5,
        );
        assert_close(
            &what,
            &be.read(&s_got).await,
            &reference.read(&s_want).await,
            1e-5,
        );
        assert_eq!(
            be.read(&from).await,
            state,
            "{what}: `from` is left as it was"
        );
    }
}

/// Argmax per row: the first index wins ties, rows wider than a workgroup.
pub async fn argmax<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(13);
    let (rows, cols) = (4, 151_936);
    let mut x = uniform(&mut rng, rows * cols, 10.0);
    x[5] = 50.0; // row 0: a tie between 5 and 900, 5 wins
    x[900] = 50.0;
    x[cols + cols - 1] = 60.0; // row 1: the last column
    x[2 * cols] = 70.0; // row 2: the first column
    let got = be.argmax(&tensor(be, rows, cols, &x)).await;
    let want = reference.argmax(&tensor(reference, rows, cols, &x)).await;
    assert_eq!(got, want, "argmax");
    assert_eq!(&got[..3], &[5, cols as u32 - 1, 0]);
}

/// Top-k per row: ties to the smaller index, NaN and −∞ last, k = cols,
/// and a vocabulary-wide row.
pub async fn top_k<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(15);
    for (rows, cols, k) in [(3, 40, 40), (5, 1000, 16), (2, 151_936, 5)] {
        let mut x = uniform(&mut rng, rows * cols, 10.0);
        // Row 0: a three-way tie at the top, NaN and −∞, repeated values.
        x[7] = 20.0;
        x[3] = 20.0;
        x[30] = 20.0;
        x[1] = f32::NAN;
        x[2] = f32::NEG_INFINITY;
        x[9] = x[10];
        x[cols + 5] = -0.0;
        x[cols + 6] = 0.0;
        let mut values = be.tensor(rows, k);
        let mut ids = be.tensor(rows, k);
        be.top_k(&tensor(be, rows, cols, &x), k, &mut values, &mut ids);
        let mut want_v = reference.tensor(rows, k);
        let mut want_i = reference.tensor(rows, k);
        reference.top_k(
            &tensor(reference, rows, cols, &x),
            k,
            &mut want_v,
            &mut want_i,
        );
        let (got_i, want_i) = (be.read(&ids).await, reference.read(&want_i).await);
        assert_eq!(got_i, want_i, "top_k ids {rows}x{cols} k={k}");
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(be.read(&values).await),
            bits(reference.read(&want_v).await),
            "top_k values {rows}x{cols} k={k}"
        );
        assert_eq!(&got_i[..3], &[3.0, 7.0, 30.0], "ties: smaller index first");
        if k == cols {
            // NaN counts as −∞ and ties it by index.
            assert_eq!(&got_i[cols - 2..cols], &[1.0, 2.0]);
        }
    }
}

/// DFly's weighted sum of tap slices, with more weights than one dispatch
/// of a parameter-block implementation carries.
pub async fn add_slices<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(16);
    for (rows, d, n_w) in [(5, 48, 3), (2, 8, 70)] {
        let x = uniform(&mut rng, rows * d * n_w, 2.0);
        let base = uniform(&mut rng, rows * d, 1.0);
        let w = uniform(&mut rng, n_w, 1.0);
        let mut out = tensor(be, rows, d, &base);
        be.add_slices(&tensor(be, rows, n_w * d, &x), &w, &mut out);
        let mut want = tensor(reference, rows, d, &base);
        reference.add_slices(&tensor(reference, rows, n_w * d, &x), &w, &mut want);
        assert_close(
            &format!("add_slices {rows}x{d} x{n_w}"),
            &be.read(&out).await,
            &reference.read(&want).await,
            1e-6,
        );
    }
}

/// DFlash2's selector walk: the picks chain through the rows (each row's
/// scores depend on the previous pick), with K beyond one workgroup too.
pub async fn selector_walk<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(17);
    for (n, k, rank) in [(8, 4, 24), (5, 16, 64), (3, 300, 4)] {
        let gates = uniform(&mut rng, n * rank, 2.0);
        let pred = uniform(&mut rng, n * k * rank, 1.0);
        let succ = uniform(&mut rng, n * k * rank, 1.0);
        let unary = uniform(&mut rng, n * k, 1.0);
        let cand: Vec<f32> = (0..n * k).map(|i| (1000 + 7 * i) as f32).collect();
        let init = vec![-1.0; (n + 2) * 3];
        let mut out = tensor(be, n + 2, 3, &init);
        be.selector_walk(
            &tensor(be, n, rank, &gates),
            &tensor(be, n * k, rank, &pred),
            &tensor(be, n * k, rank, &succ),
            &tensor(be, n, k, &unary),
            &tensor(be, n, k, &cand),
            &mut out,
            1,
        );
        let mut want = tensor(reference, n + 2, 3, &init);
        reference.selector_walk(
            &tensor(reference, n, rank, &gates),
            &tensor(reference, n * k, rank, &pred),
            &tensor(reference, n * k, rank, &succ),
            &tensor(reference, n, k, &unary),
            &tensor(reference, n, k, &cand),
            &mut want,
            1,
        );
        let (got, want) = (be.read(&out).await, reference.read(&want).await);
        assert_eq!(got, want, "selector_walk n={n} k={k} rank={rank}");
        // Row 0 (the anchor's) and the rows past the block stay untouched;
        // every other row picked one of its own candidates.
        assert_eq!(got[1], -1.0);
        assert_eq!(&got[n * 3..], &[-1.0; 6]);
        for r in 1..n {
            assert!(
                cand[r * k..(r + 1) * k].contains(&got[r * 3 + 1]),
                "row {r}"
            );
        }
    }
}

/// Seeded sampling: the same draws as the reference for whole rows and
/// for top-k candidates with top-p and min-p, NaN and −∞ skipped; row `r`
/// with counter `c` draws what row `r − 1` draws with counter `c + 1`.
/// The repetition penalty on one row and on a verify batch's rows, with
/// repeated tokens in the history and the batch, windows shorter and
/// longer than both, and ids beyond the vocabulary (ignored).
pub async fn penalize<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(21);
    let (rows, cols) = (6, 300);
    let history: Vec<u32> = (0..50)
        .map(|i| (i * 37 % 97) as u32)
        .chain([7, 7, 400])
        .collect();
    let batch: Vec<f32> = [7.0, 3.0, 3.0, 299.0, 41.0, 500.0]
        .iter()
        .flat_map(|&id| [-1.0, id])
        .collect();
    for (penalty, last_n) in [(1.3, 64), (0.7, 5), (1.1, 1), (1.5, 1000)] {
        let x = uniform(&mut rng, rows * cols, 4.0);
        let mut got = tensor(be, rows, cols, &x);
        let ids = tensor(be, rows, 2, &batch);
        be.penalize(&mut got, &history, Some((&ids, 1)), penalty, last_n);
        let mut want = tensor(reference, rows, cols, &x);
        let ids_ref = tensor(reference, rows, 2, &batch);
        reference.penalize(&mut want, &history, Some((&ids_ref, 1)), penalty, last_n);
        let (got, want) = (be.read(&got).await, reference.read(&want).await);
        assert_close(
            &format!("penalize {penalty} last {last_n}"),
            &got,
            &want,
            1e-6,
        );
        assert_ne!(got, x, "something was penalized");

        let mut one = tensor(be, 1, cols, &x[..cols]);
        be.penalize(&mut one, &history, None, penalty, last_n);
        let mut one_ref = tensor(reference, 1, cols, &x[..cols]);
        reference.penalize(&mut one_ref, &history, None, penalty, last_n);
        assert_close(
            &format!("penalize one row {penalty} last {last_n}"),
            &be.read(&one).await,
            &reference.read(&one_ref).await,
            1e-6,
        );
    }
}

pub async fn sample_to<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(18);
    let settings = [
        (0.8, 0, 1.0, 0.0, 50),
        (1.3, 10, 0.9, 0.05, 50),
        (0.5, 0, 1.0, 0.1, 300),
        (1.0, 40, 0.95, 0.0, 151_936),
    ];
    for (i, (temperature, top_k, top_p, min_p, cols)) in settings.into_iter().enumerate() {
        let p = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 0x1234_5678_9abc + i as u64,
            ..Default::default()
        };
        let rows = if cols > 1000 { 3 } else { 64 };
        let one = uniform(&mut rng, cols, 3.0);
        let mut x: Vec<f32> = (0..rows).flat_map(|_| one.iter().copied()).collect();
        x[4] = f32::NAN;
        x[5] = f32::NEG_INFINITY;
        let counter = (1u64 << 32) - 2 + i as u64;
        let mut out = be.tensor(rows + 1, 2);
        be.sample_to(&tensor(be, rows, cols, &x), &p, counter, &mut out, 1, 1);
        let mut want = reference.tensor(rows + 1, 2);
        reference.sample_to(
            &tensor(reference, rows, cols, &x),
            &p,
            counter,
            &mut want,
            1,
            1,
        );
        let got = be.read(&out).await;
        assert_eq!(got, reference.read(&want).await, "sample_to {p:?}");
        let ids: Vec<f32> = got.iter().skip(3).step_by(2).copied().collect();
        assert!(ids[0] != 4.0 && ids[0] != 5.0, "NaN and −∞ are never drawn");
        assert!(ids.iter().all(|&t| t < cols as f32));
        let mut shifted = be.tensor(rows, 1);
        be.sample_to(
            &tensor(be, rows, cols, &x),
            &p,
            counter + 1,
            &mut shifted,
            0,
            0,
        );
        // Rows 1.. hold the same logits as row 0.
        assert_eq!(
            &be.read(&shifted).await[1..rows - 1],
            &ids[2..rows],
            "counter {p:?}"
        );
    }
}

/// Token ids that stay on the device: argmax written into a column of a
/// tensor, and embedding rows gathered by ids read from such a column.
pub async fn device_ids<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(14);
    let (rows, cols) = (4, 1000);
    let x = uniform(&mut rng, rows * cols, 5.0);
    let mut out = be.tensor(6, 3);
    be.argmax_to(&tensor(be, rows, cols, &x), &mut out, 1, 2);
    let mut want = reference.tensor(6, 3);
    reference.argmax_to(&tensor(reference, rows, cols, &x), &mut want, 1, 2);
    let (got, want) = (be.read(&out).await, reference.read(&want).await);
    assert_eq!(got, want, "argmax_to");
    let ids = reference.argmax(&tensor(reference, rows, cols, &x)).await;
    for (r, &id) in ids.iter().enumerate() {
        assert_eq!(got[(1 + r) * 3 + 2], id as f32, "argmax_to row {r}");
    }

    for (i, &ty) in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K]
        .iter()
        .enumerate()
    {
        let width = 512;
        let file = weight_file(ty, 19, width, 500 + i as u64);
        let table = load(be, &file);
        let column = [3.0, 0.0, 18.0, 3.0, 7.0];
        let id_rows: Vec<f32> = column.iter().flat_map(|&id| [id, -1.0]).collect();
        let ids = tensor(be, column.len(), 2, &id_rows);
        let mut out = be.tensor(3, width);
        be.embed_from(&table, &ids, 1, &mut out);
        let mut direct = be.tensor(3, width);
        be.embed(&table, &[0, 18, 3], &mut direct);
        assert_eq!(
            be.read(&out).await,
            be.read(&direct).await,
            "embed_from {ty}"
        );
    }
}

/// Property-style draws: shapes the fixed cases do not name (seeded, so a
/// failure names its draw and repeats), each compared with the reference:
/// matmuls of every weight type with random rows, row lengths and batch
/// rows, RMS norms of random groups, and grouped-query attention with
/// random head counts, head widths, depths and masks.
pub async fn random_shapes<B: Backend, R: Backend>(be: &B, reference: &R) {
    let mut rng = Rng::new(2026);
    let mut pick = |lo: usize, hi: usize| {
        lo + (rng.next_f64() * (hi - lo + 1) as f64) as usize % (hi - lo + 1)
    };
    for draw in 0..24 {
        let ty = WEIGHT_TYPES[pick(0, WEIGHT_TYPES.len() - 1)];
        // At least 2 output rows: a 1-row weight is stored as a vector,
        // which backends load as dense f32 (norms), not as a matrix.
        let (rows, cols, n) = (pick(2, 200), ty.block_len() * pick(1, 6), pick(1, 20));
        let file = weight_file(ty, rows, cols, 5000 + draw);
        let (w, wr) = (load(be, &file), load(reference, &file));
        let x = uniform(&mut Rng::new(draw), n * cols, 2.0);
        let what = format!("draw {draw}: matmul {ty} {rows}x{cols}, {n} rows");
        let tol = matmul_tolerance(ty);
        check_matmul(be, reference, (&w, &wr), &x, (n, rows, cols), &what, tol).await;

        let (n, group) = (pick(1, 9), 32 * pick(1, 24));
        let cols = group * pick(1, 3);
        let x = uniform(&mut Rng::new(100 + draw), n * cols, 3.0);
        let file = weight_file(GgmlType::F32, 1, group, 6000 + draw);
        let (w, wr) = (load(be, &file), load(reference, &file));
        let what = format!("draw {draw}: rms_norm {n}x{cols}/{group}");
        check_rms_norm(be, reference, (&w, &wr), &x, (n, cols, group), &what).await;

        let n_head_kv = pick(1, 4);
        let n_head = n_head_kv * pick(1, 4);
        let head_dim = [32, 64, 80, 128][pick(0, 3)];
        let rows = pick(1, 12);
        let q_pos0 = pick(0, 300);
        let p = AttentionParams {
            n_head,
            n_head_kv,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let mask = AttentionMask {
            q_pos0,
            kv_len: q_pos0 + rows,
            causal: pick(0, 3) > 0,
            window: (pick(0, 2) == 0).then(|| pick(1, 64)),
        };
        let (qc, kvc, kv_rows) = (
            n_head * head_dim,
            n_head_kv * head_dim,
            q_pos0 + rows + pick(0, 8),
        );
        let mut data = Rng::new(200 + draw);
        let q = uniform(&mut data, rows * qc, 2.0);
        let k = uniform(&mut data, kv_rows * kvc, 2.0);
        let v = uniform(&mut data, kv_rows * kvc, 1.0);
        let what = format!("draw {draw}: attention {p:?} {mask:?}");
        check_attention(be, reference, (&q, &k, &v), (rows, kv_rows), mask, p, &what).await;
    }
}

/// Runs each op that has a default composition once, on small inputs, and
/// returns those that `be`'s type left to the default (the rest it
/// overrides): each backend's test compares it with what it declares, so
/// the report stays true. The values are checked by the other cases.
pub async fn default_compositions<B: Backend>(be: &B) -> Vec<&'static str> {
    let mut rng = Rng::new(77);
    let mut t =
        |rows: usize, cols: usize| tensor(be, rows, cols, &uniform(&mut rng, rows * cols, 1.0));
    let rope = |n_head| RopeParams {
        style: RopeStyle::Neox,
        n_head,
        head_dim: 8,
        n_rot: 8,
        base: 10_000.0,
    };
    let (mut q, mut k) = (t(2, 16), t(2, 8));
    be.rope_qk(&mut q, &mut k, 3, rope(2), rope(1));
    let v = t(2, 8);
    let (mut k_cache, mut v_cache) = (
        be.kv_tensor(6, 8, KvType::F32),
        be.kv_tensor(6, 8, KvType::F32),
    );
    let mut attended = t(2, 16);
    let step = AttentionStep {
        q_rope: rope(2),
        k_rope: rope(1),
        q_scale: None,
        mask: AttentionMask {
            q_pos0: 3,
            kv_len: 5,
            causal: true,
            window: None,
        },
        params: AttentionParams {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 8,
            scale: 0.35,
        },
    };
    be.attention_step(
        (&mut q, &mut k, &v),
        (&mut k_cache, &mut v_cache),
        step,
        None,
        &mut attended,
    );
    let (mut residual, branch, mut scratch) = (t(2, 8), t(2, 8), t(2, 8));
    let norm_w = load(be, &weight_file(GgmlType::F32, 1, 8, 80));
    be.add_normed(&mut residual, &branch, &norm_w, 1e-6, &mut scratch);

    let file = weight_file(GgmlType::F32, 4, 8, 78);
    let w = load(be, &file);
    let x = t(2, 8);
    let (mut a, mut b, mut out) = (t(2, 4), t(2, 4), t(2, 4));
    be.matmul_many(
        &x,
        &mut [Projection {
            weight: &w,
            bias: None,
            out: &mut a,
        }],
    );
    be.gated_projection(
        GatedActivation::SwiGlu,
        &x,
        &w,
        &w,
        &mut a,
        &mut b,
        &mut out,
    );
    be.matmul_accumulate(&w, &x, &mut out, &mut a);
    let norm_file = weight_file(GgmlType::F32, 1, 8, 79);
    let nw = load(be, &norm_file);
    let mut xn = t(2, 8);
    let mut x = x;
    be.normed_matmul_many(
        &mut x,
        RowNorm {
            weight: &nw,
            eps: 1e-6,
            out: &mut xn,
            pending: None,
        },
        &mut [Projection {
            weight: &w,
            bias: None,
            out: &mut a,
        }],
    );
    be.normed_gated_projection(
        GatedActivation::SwiGlu,
        &mut x,
        RowNorm {
            weight: &nw,
            eps: 1e-6,
            out: &mut xn,
            pending: None,
        },
        &w,
        &w,
        &mut a,
        &mut b,
        &mut out,
    );

    let logits = t(2, 8);
    be.argmax(&logits).await;
    let (mut values, mut ids) = (t(2, 3), t(2, 3));
    be.top_k(&logits, 3, &mut values, &mut ids);
    let mut one = t(1, 8);
    be.penalize(&mut one, &[1, 2], None, 1.1, 64);
    let mut picked = t(1, 1);
    be.sample_to(&one, &SamplingParams::default(), 0, &mut picked, 0, 0);

    let mut fused = t(1, 4);
    be.add_slices(&t(1, 8), &[0.5, 1.0], &mut fused);
    let (n, cands, rank) = (2, 2, 2);
    let cand = tensor(be, n, cands, &[0.0, 1.0, 2.0, 3.0]);
    let mut walk = t(n, 1);
    be.selector_walk(
        &t(n, rank),
        &t(n * cands, rank),
        &t(n * cands, rank),
        &t(n, cands),
        &cand,
        &mut walk,
        0,
    );
    be.read(&walk).await;
    assert!(be.device_error().is_none(), "{:?}", be.device_error());
    crate::backend::composed::composed_ops::<B>()
}

/// [`default_compositions`] printed and checked against what a backend's
/// test declares it leaves to the defaults.
pub fn check_default_compositions<B: Backend>(be: &B, declared: &[&str]) {
    let composed = crate::testing::block_on(default_compositions(be));
    eprintln!("{}: default compositions {composed:?}", be.name());
    assert_eq!(composed, declared, "{}: default compositions", be.name());
}

/// Two threads recording into one backend at once: each embeds its own
/// ids, multiplies by a quantized weight (quantized activations in the
/// backend's scratch) and reads back the argmax, 64 times over. Each
/// thread's results must equal what the same backend gives for the same
/// inputs run alone, bit for bit: a scratch buffer or a pending command
/// shared between the threads would hand one thread the other's data.
/// (Threads only: the browser has one, and runs the async cases.)
pub fn concurrent_streams<B: Backend, R: Backend>(be: &B, reference: &R) {
    const ROUNDS: usize = 64;
    let (rows, cols) = (96, 512);
    let table_file = weight_file(GgmlType::Q8_0, 19, cols, 501);
    let w_file = weight_file(GgmlType::Q4_K, rows, cols, 502);
    let (table, w) = (load(be, &table_file), load(be, &w_file));
    let ids_of = |stream: usize, round: usize| -> Vec<u32> {
        let n = 1 + (stream + round) % 5;
        (0..n)
            .map(|j| ((stream * 7 + round * 3 + j * 5) % 19) as u32)
            .collect()
    };
    let pass = |ids: &[u32]| {
        let mut x = be.tensor(ids.len(), cols);
        be.embed(&table, ids, &mut x);
        let mut y = be.tensor(ids.len(), rows);
        be.matmul(&w, &x, &mut y);
        let top = crate::testing::block_on(be.argmax(&y));
        (crate::testing::block_on(be.read(&y)), top)
    };
    let alone: Vec<Vec<_>> = (0..2)
        .map(|stream| (0..ROUNDS).map(|r| pass(&ids_of(stream, r))).collect())
        .collect();
    // The serial results are right, too (the matmul case checks the rest).
    let (tr, wr) = (load(reference, &table_file), load(reference, &w_file));
    let ids = ids_of(0, 0);
    let mut x = reference.tensor(ids.len(), cols);
    reference.embed(&tr, &ids, &mut x);
    let mut y = reference.tensor(ids.len(), rows);
    reference.matmul(&wr, &x, &mut y);
    let want = crate::testing::block_on(reference.read(&y));
    assert_close(
        "concurrent_streams: a pass alone",
        &alone[0][0].0,
        &want,
        2e-4,
    );

    let together: Vec<Vec<_>> = std::thread::scope(|scope| {
        let streams: Vec<_> = (0..2)
            .map(|stream| {
                let pass = &pass;
                scope.spawn(move || {
                    (0..ROUNDS)
                        .map(|r| pass(&ids_of(stream, r)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        streams
            .into_iter()
            .map(|s| s.join().expect("a stream panicked"))
            .collect()
    });
    for (stream, (got, want)) in together.iter().zip(&alone).enumerate() {
        for (round, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g.1 == w.1 && g.0 == w.0,
                "stream {stream} round {round}: results differ from the same pass run alone \
                 (argmax {:?} vs {:?})",
                g.1,
                w.1
            );
        }
    }
}

/// One `#[test]` per op family for a backend, each against the reference
/// (and, natively, [`concurrent_streams`]).
/// `$backend` and `$reference` are expressions building fresh backends.
/// With `async $attr` first, each test is an `async fn` under that test
/// attribute instead (e.g. `wasm_bindgen_test` in a browser, where a
/// read-back can only be awaited) and `$backend` may `.await`.
#[macro_export]
macro_rules! backend_conformance_tests {
    (async $attr:path, $backend:expr, $reference:expr) => {
        $crate::backend_conformance_tests!(@async $attr, $backend, $reference;
            matmul, matmul_fused, normed_projections, embed, rms_norm, rope, attention_inputs, attention_step, elementwise, copy_rows,
            attention, kv_f16, grouped_conv, hybrid_blocks, argmax, top_k, add_slices,
            selector_walk, penalize, sample_to, device_ids, random_shapes);
    };
    ($backend:expr, $reference:expr) => {
        $crate::backend_conformance_tests!(@each $backend, $reference;
            matmul, matmul_fused, normed_projections, embed, rms_norm, rope, attention_inputs, attention_step, elementwise, copy_rows,
            attention, kv_f16, grouped_conv, hybrid_blocks, argmax, top_k, add_slices,
            selector_walk, penalize, sample_to, device_ids, random_shapes);
    };
    (@each $backend:expr, $reference:expr; $($op:ident),*) => {
        $(
            #[test]
            fn $op() {
                $crate::testing::block_on($crate::conformance::$op(&$backend, &$reference));
            }
        )*
        #[test]
        fn concurrent_streams() {
            $crate::conformance::concurrent_streams(&$backend, &$reference);
        }
    };
    (@async $attr:path, $backend:expr, $reference:expr; $($op:ident),*) => {
        $(
            #[$attr]
            async fn $op() {
                $crate::conformance::$op(&$backend, &$reference).await;
            }
        )*
    };
}
