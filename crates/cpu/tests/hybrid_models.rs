//! Hybrid (`qwen35`) decoders on small random GGUFs: against an
//! independent f64 reference written here from llama.cpp's graph
//! (`src/models/qwen35.cpp`, `delta-net-base.cpp`), against llama.cpp's
//! own logits on the same files (fixtures made by
//! `tests/reference/qwen35/make_fixtures.sh`), and through speculative
//! rollback of the recurrent state at every depth.

mod common;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::engine::SequenceMemory;
use blockdraft_core::model::{Decoder, DecoderState, LogitRows, ModelConfig};
use blockdraft_core::sampling::Rng;
use blockdraft_core::speculative::{
    DFlashDrafter, DraftModelDrafter, Drafter, NgramDrafter, OracleDrafter, PolicyConfig,
};
use blockdraft_core::testing::{
    block_on, greedy_plain, greedy_speculative, synthetic_block_drafters, synthetic_decoder,
    synthetic_qwen35, SyntheticDims, SyntheticHybrid, SyntheticModel,
};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::GgufFile;
use common::{matvec, rms};
use std::collections::HashMap;
use std::sync::Arc;

const SEED: u64 = 35;

/// A second geometry: key and value heads alike, a 3-tap convolution,
/// one attention block in four.
fn narrow() -> SyntheticHybrid {
    let mut h = SyntheticHybrid::default();
    h.dims.n_layer = 4;
    h.dims.n_head = 4;
    h.dims.n_head_kv = 2;
    h.dims.head_dim = 16;
    h.interval = 4;
    h.conv_kernel = 3;
    h.n_k_heads = 2;
    h.n_v_heads = 2;
    h.state_size = 32;
    h
}

fn load(m: &SyntheticModel) -> Decoder<CpuBackend> {
    let file = GgufFile::from_bytes(m.bytes.clone()).unwrap();
    Decoder::load(&file, Arc::new(CpuBackend::new(1)), &mut |_| {}).unwrap()
}

fn logits(dec: &Decoder<CpuBackend>, state: &DecoderState<CpuBackend>) -> Vec<f32> {
    block_on(dec.backend.read(state.logits()))
}

fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .map(|(&g, w)| (g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

// ---- the independent reference, in f64 -------------------------------------

struct Reference<'a> {
    h: SyntheticHybrid,
    w: HashMap<&'a str, Vec<f64>>,
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn l2_normed(x: &[f64], scale: f64) -> Vec<f64> {
    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-6);
    x.iter().map(|v| v / norm * scale).collect()
}

impl<'a> Reference<'a> {
    fn new(h: SyntheticHybrid, m: &'a SyntheticModel) -> Self {
        let w = m
            .weights
            .iter()
            .map(|(k, v)| (k.as_str(), v.iter().map(|&x| f64::from(x)).collect()))
            .collect();
        Reference { h, w }
    }

    fn g(&self, il: usize, t: &str) -> &[f64] {
        &self.w[format!("blk.{il}.{t}").as_str()]
    }

    /// Logits at every position of `tokens`.
    fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let (h, d) = (&self.h, &self.h.dims);
        let e = d.n_embd;
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| self.w["token_embd.weight"][t as usize * e..][..e].to_vec())
            .collect();
        for il in 0..d.n_layer {
            let normed: Vec<Vec<f64>> = x
                .iter()
                .map(|r| rms(r, self.g(il, "attn_norm.weight")))
                .collect();
            let mixed = if (il + 1) % h.interval != 0 {
                self.delta_net(il, &normed)
            } else {
                self.attention(il, &normed)
            };
            for (r, m) in x.iter_mut().zip(mixed) {
                r.iter_mut().zip(m).for_each(|(a, b)| *a += b);
            }
            for r in x.iter_mut() {
                let a = rms(r, self.g(il, "post_attention_norm.weight"));
                let gate = matvec(self.g(il, "ffn_gate.weight"), &a, d.n_ff);
                let up = matvec(self.g(il, "ffn_up.weight"), &a, d.n_ff);
                let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
                let down = matvec(self.g(il, "ffn_down.weight"), &act, e);
                r.iter_mut().zip(down).for_each(|(a, b)| *a += b);
            }
        }
        x.iter()
            .map(|r| {
                let a = rms(r, &self.w["output_norm.weight"]);
                matvec(&self.w["output.weight"], &a, d.n_vocab)
            })
            .collect()
    }

    fn delta_net(&self, il: usize, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let h = &self.h;
        let (hk, hv, dk) = (h.n_k_heads, h.n_v_heads, h.state_size);
        let (k_taps, conv) = (h.conv_kernel, 2 * hk * dk + hv * dk);
        let conv_w = self.g(il, "ssm_conv1d.weight");
        let mut inputs: Vec<Vec<f64>> = Vec::new();
        // state[head][j][i]: value j, key i.
        let mut state = vec![vec![vec![0.0f64; dk]; dk]; hv];
        let mut out = Vec::new();
        for a in xs {
            inputs.push(matvec(self.g(il, "attn_qkv.weight"), a, conv));
            let z = matvec(self.g(il, "attn_gate.weight"), a, hv * dk);
            let beta = matvec(self.g(il, "ssm_beta.weight"), a, hv);
            let alpha = matvec(self.g(il, "ssm_alpha.weight"), a, hv);
            let t = inputs.len() - 1;
            // Causal conv: tap k_taps − 1 on the newest row, zeros before 0.
            let c: Vec<f64> = (0..conv)
                .map(|ch| {
                    let sum: f64 = (0..k_taps)
                        .filter_map(|tap| {
                            let back = k_taps - 1 - tap;
                            (t >= back).then(|| inputs[t - back][ch] * conv_w[ch * k_taps + tap])
                        })
                        .sum();
                    silu(sum)
                })
                .collect();
            let mut row = vec![0.0; hv * dk];
            for head in 0..hv {
                let kh = head % hk;
                let q = l2_normed(&c[kh * dk..][..dk], 1.0 / (dk as f64).sqrt());
                let k = l2_normed(&c[(hk + kh) * dk..][..dk], 1.0);
                let v = &c[2 * hk * dk + head * dk..][..dk];
                let sp = {
                    let u = alpha[head] + self.g(il, "ssm_dt.bias")[head];
                    if u > 20.0 {
                        u
                    } else {
                        u.exp().ln_1p()
                    }
                };
                let decay = (sp * self.g(il, "ssm_a")[head]).exp();
                let b = sigmoid(beta[head]);
                let s = &mut state[head];
                let mut o = vec![0.0; dk];
                for j in 0..dk {
                    s[j].iter_mut().for_each(|e| *e *= decay);
                    let sk: f64 = s[j].iter().zip(&k).map(|(e, ki)| e * ki).sum();
                    let dj = (v[j] - sk) * b;
                    s[j].iter_mut().zip(&k).for_each(|(e, ki)| *e += ki * dj);
                    o[j] = s[j].iter().zip(&q).map(|(e, qi)| e * qi).sum();
                }
                let o = rms(&o, self.g(il, "ssm_norm.weight"));
                for j in 0..dk {
                    row[head * dk + j] = o[j] * silu(z[head * dk + j]);
                }
            }
            out.push(matvec(self.g(il, "ssm_out.weight"), &row, h.dims.n_embd));
        }
        out
    }

    fn attention(&self, il: usize, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let d = &self.h.dims;
        let (hd, n_rot) = (d.head_dim, self.h.n_rot);
        let rope = |x: &mut [f64], pos: usize| {
            let half = n_rot / 2;
            for i in 0..half {
                let theta = pos as f64 * 1000f64.powf(-2.0 * i as f64 / n_rot as f64);
                let (x0, x1) = (x[i], x[i + half]);
                x[i] = x0 * theta.cos() - x1 * theta.sin();
                x[i + half] = x0 * theta.sin() + x1 * theta.cos();
            }
        };
        let mut qs = Vec::new();
        let mut gates = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, a) in xs.iter().enumerate() {
            let full = matvec(self.g(il, "attn_q.weight"), a, 2 * d.n_head * hd);
            let k = matvec(self.g(il, "attn_k.weight"), a, d.n_head_kv * hd);
            let mut q = Vec::new();
            let mut gate = Vec::new();
            for head in full.chunks(2 * hd) {
                let mut qh = rms(&head[..hd], self.g(il, "attn_q_norm.weight"));
                rope(&mut qh, pos);
                q.push(qh);
                gate.extend_from_slice(&head[hd..]);
            }
            let k: Vec<Vec<f64>> = k
                .chunks(hd)
                .map(|kh| {
                    let mut kh = rms(kh, self.g(il, "attn_k_norm.weight"));
                    rope(&mut kh, pos);
                    kh
                })
                .collect();
            qs.push(q);
            gates.push(gate);
            ks.push(k);
            vs.push(matvec(self.g(il, "attn_v.weight"), a, d.n_head_kv * hd));
        }
        let group = d.n_head / d.n_head_kv;
        (0..xs.len())
            .map(|t| {
                let mut o = vec![0.0; d.n_head * hd];
                for head in 0..d.n_head {
                    let kvh = head / group;
                    let scores: Vec<f64> = (0..=t)
                        .map(|s| {
                            let dot: f64 = qs[t][head]
                                .iter()
                                .zip(&ks[s][kvh])
                                .map(|(a, b)| a * b)
                                .sum();
                            dot / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = p.iter().sum();
                    for (s, ps) in p.iter().enumerate() {
                        for c in 0..hd {
                            o[head * hd + c] += ps / z * vs[s][kvh * hd + c];
                        }
                    }
                }
                o.iter_mut()
                    .zip(&gates[t])
                    .for_each(|(v, g)| *v *= sigmoid(*g));
                matvec(self.g(il, "attn_output.weight"), &o, d.n_embd)
            })
            .collect()
    }
}

fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() * n_vocab as f64) as u32 % n_vocab as u32)
        .collect()
}

// ---- tests -------------------------------------------------------------------

#[test]
fn prefill_and_decode_match_the_reference() {
    for h in [SyntheticHybrid::default(), narrow()] {
        let m = synthetic_qwen35(&h, SEED);
        let dec = load(&m);
        assert!(dec.config.is_hybrid());
        let reference = Reference::new(h, &m);
        let tokens = random_tokens(40, h.dims.n_vocab, 7);
        let want = reference.logits(&tokens);
        let mut state = dec.try_new_state(64, 64).unwrap();
        dec.forward(&mut state, &tokens[..32], LogitRows::All, true, None)
            .unwrap();
        let got = logits(&dec, &state);
        for (r, row) in got.chunks(h.dims.n_vocab).enumerate() {
            let err = max_rel_err(row, &want[r]);
            assert!(err < 1e-4, "prefill row {r} off by {err}");
        }
        for (i, &t) in tokens.iter().enumerate().skip(32) {
            dec.forward(&mut state, &[t], LogitRows::Last, true, None)
                .unwrap();
            let err = max_rel_err(&logits(&dec, &state), &want[i]);
            assert!(err < 1e-4, "decode position {i} off by {err}");
        }
    }
}

/// Rounds as the engine runs them (checkpoint, a verify of up to 6 rows,
/// commit of a random number of them, the next round's pass starting with
/// the rollback's replay): every verify row's logits are the reference's
/// for the committed history plus the batch, for kept counts 0 ..= all.
#[test]
fn speculative_rounds_roll_the_recurrent_state_back_at_every_depth() {
    let h = SyntheticHybrid::default();
    let m = synthetic_qwen35(&h, SEED);
    let dec = load(&m);
    let reference = Reference::new(h, &m);
    let v = h.dims.n_vocab;
    let mut committed = random_tokens(12, v, 1);
    let mut state = dec.try_new_state(128, 64).unwrap();
    dec.forward(&mut state, &committed, LogitRows::Last, true, None)
        .unwrap();
    let mut rng = Rng::new(5);
    // Every kept count of a 5-row verify, then random ones.
    let plan: Vec<(usize, usize)> = (0..=5)
        .map(|keep| (5, keep))
        .chain((0..8).map(|_| {
            let rows = 1 + (rng.next_f64() * 6.0) as usize;
            (rows, (rng.next_f64() * (rows + 1) as f64) as usize)
        }))
        .collect();
    for (round, &(rows, keep)) in plan.iter().enumerate() {
        let keep = keep.min(rows);
        let batch = random_tokens(rows, v, 100 + round as u64);
        let at = state.checkpoint();
        dec.forward(&mut state, &batch, LogitRows::All, true, None)
            .unwrap();
        let mut seen = committed.clone();
        seen.extend_from_slice(&batch);
        let want = reference.logits(&seen);
        for (r, row) in logits(&dec, &state).chunks(v).enumerate() {
            let err = max_rel_err(row, &want[committed.len() + r]);
            assert!(
                err < 1e-4,
                "round {round} (keep {keep} of {rows}): row {r} off by {err}"
            );
        }
        state.commit(at, keep).unwrap();
        committed.extend_from_slice(&batch[..keep]);
        assert_eq!(state.len(), committed.len());
    }
    // A plain step after the last commit sees the committed history only.
    let next = random_tokens(1, v, 999);
    dec.forward(&mut state, &next, LogitRows::Last, true, None)
        .unwrap();
    committed.extend_from_slice(&next);
    let want = reference.logits(&committed);
    let err = max_rel_err(&logits(&dec, &state), want.last().unwrap());
    assert!(err < 1e-4, "after the rounds: off by {err}");
}

#[test]
fn truncation_goes_back_only_where_the_state_can_be_rebuilt() {
    let h = SyntheticHybrid::default();
    let m = synthetic_qwen35(&h, SEED);
    let dec = load(&m);
    let tokens = random_tokens(20, h.dims.n_vocab, 3);
    let mut state = dec.try_new_state(64, 64).unwrap();
    dec.forward(&mut state, &tokens[..10], LogitRows::Last, true, None)
        .unwrap();
    assert!(!state.can_truncate(5));
    let err = state.truncate(5).unwrap_err();
    assert!(matches!(err, ModelError::Usage(_)), "{err}");
    assert_eq!(state.len(), 10, "a refused truncation changes nothing");
    // Within the rows logged since a checkpoint, and to 0, it can.
    let at = state.checkpoint();
    dec.forward(&mut state, &tokens[10..14], LogitRows::Last, true, None)
        .unwrap();
    assert!(state.can_truncate(12));
    state.commit(at, 2).unwrap();
    dec.forward(&mut state, &tokens[12..13], LogitRows::Last, true, None)
        .unwrap();
    let after_rollback = logits(&dec, &state);
    state.truncate(0).unwrap();
    dec.forward(&mut state, &tokens[..13], LogitRows::Last, true, None)
        .unwrap();
    assert_eq!(logits(&dec, &state), after_rollback);
    // A checkpoint's log holds 64 rows at most.
    let mut small = dec.try_new_state(256, 128).unwrap();
    let _at = small.checkpoint();
    let long = random_tokens(65, h.dims.n_vocab, 4);
    let err = dec
        .forward(&mut small, &long, LogitRows::Last, true, None)
        .unwrap_err();
    assert!(err.to_string().contains("at most 64 rows"), "{err}");
}

#[test]
fn a_batched_pass_gives_each_hybrid_sequence_its_own_logits() {
    let h = SyntheticHybrid::default();
    let m = synthetic_qwen35(&h, SEED);
    let dec = load(&m);
    let v = h.dims.n_vocab;
    let a = random_tokens(9, v, 11);
    let b = random_tokens(6, v, 12);
    let mut alone = Vec::new();
    for seq in [&a, &b] {
        let mut s = dec.try_new_state(32, 16).unwrap();
        dec.forward(&mut s, &seq[..seq.len() - 1], LogitRows::Last, true, None)
            .unwrap();
        dec.forward(&mut s, &seq[seq.len() - 1..], LogitRows::Last, true, None)
            .unwrap();
        alone.push(logits(&dec, &s));
    }
    let mut sa = dec.try_new_state(32, 16).unwrap();
    let mut sb = dec.try_new_state(32, 16).unwrap();
    dec.forward(&mut sa, &a[..8], LogitRows::Last, true, None)
        .unwrap();
    dec.forward(&mut sb, &b[..5], LogitRows::Last, true, None)
        .unwrap();
    let mut batch = dec.new_batch(8, 2);
    dec.forward_batch(
        &mut batch,
        &mut [(&mut sa, &a[8..]), (&mut sb, &b[5..])],
        None,
    )
    .unwrap();
    let got = logits_of(&dec, batch.logits());
    assert_eq!(got[..v], alone[0][..]);
    assert_eq!(got[v..], alone[1][..]);
}

fn logits_of(dec: &Decoder<CpuBackend>, t: &<CpuBackend as Device>::Tensor) -> Vec<f32> {
    block_on(dec.backend.read(t))
}

#[test]
fn an_mtp_layer_is_skipped() {
    let h = SyntheticHybrid::default();
    let with_mtp = SyntheticHybrid { mtp_layers: 1, ..h };
    let (plain, mtp) = (
        synthetic_qwen35(&h, SEED),
        synthetic_qwen35(&with_mtp, SEED),
    );
    let (dec, dec_mtp) = (load(&plain), load(&mtp));
    assert_eq!(dec_mtp.config.n_layer, h.dims.n_layer);
    let tokens = random_tokens(8, h.dims.n_vocab, 2);
    let run = |d: &Decoder<CpuBackend>| {
        let mut s = d.try_new_state(16, 16).unwrap();
        d.forward(&mut s, &tokens, LogitRows::All, true, None)
            .unwrap();
        logits(d, &s)
    };
    assert_eq!(run(&dec), run(&dec_mtp));
}

/// Block kinds are read as llama.cpp reads them; metadata a hybrid file
/// must get right is refused by name.
#[test]
fn hybrid_metadata_is_read_as_llama_cpp_reads_it_and_refused_by_name() {
    let m = synthetic_qwen35(&SyntheticHybrid::default(), SEED);
    let file = GgufFile::from_bytes(m.bytes.clone()).unwrap();
    let cases: [(&str, blockdraft_gguf::Value, &str); 5] = [
        (
            "qwen35.attention.recurrent_layers",
            vec![true; 5].into(),
            "recurrent_layers",
        ),
        ("qwen35.ssm.inner_size", 63u32.into(), "inner_size"),
        ("qwen35.ssm.time_step_rank", 3u32.into(), "time_step_rank"),
        (
            "qwen35.rope.dimension_sections",
            vec![4i32, 4, 0, 0].into(),
            "dimension_sections",
        ),
        (
            "qwen35.full_attention_interval",
            0u32.into(),
            "full_attention_interval",
        ),
    ];
    // The block kinds come from the file's list where it has one, else
    // from the interval (4 where absent).
    let kinds = |edit: &dyn Fn(&mut blockdraft_gguf::Metadata)| {
        let mut md = file.metadata().clone();
        edit(&mut md);
        ModelConfig::from_metadata(&md).unwrap().recurrent_layers
    };
    assert_eq!(
        kinds(&|_| {}),
        [true, true, false, true, true, false],
        "interval 3"
    );
    let listed = vec![false, true, true, true, true, false, true];
    assert_eq!(
        kinds(&|md| md.set("qwen35.attention.recurrent_layers", listed.clone())),
        listed[..6]
    );
    let unset = |md: &mut blockdraft_gguf::Metadata| {
        let mut kept = blockdraft_gguf::Metadata::default();
        for (k, v) in md
            .iter()
            .filter(|(k, _)| *k != "qwen35.full_attention_interval")
        {
            kept.set(k, v.clone());
        }
        *md = kept;
    };
    assert_eq!(kinds(&unset), [true, true, true, false, true, true]);
    for (key, value, named) in cases {
        let mut md = file.metadata().clone();
        md.set(key, value);
        let err = ModelConfig::from_metadata(&md).unwrap_err();
        assert!(
            matches!(&err, ModelError::InvalidMetadata { key, .. } if key.contains(named)),
            "{key}: {err}"
        );
    }
}

// ---- against llama.cpp -------------------------------------------------------

/// The fixtures' models by name.
fn fixture_models() -> [(&'static str, SyntheticHybrid); 2] {
    [
        ("default", SyntheticHybrid::default()),
        ("narrow", narrow()),
    ]
}

/// FNV-1a (64 bits) of a file: whether the generator still writes the
/// model a fixture was made from.
fn fnv1a64(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Writes the fixtures' models into `$QWEN35_FIXTURE_DIR`, with their
/// hashes (run by `tests/reference/qwen35/make_fixtures.sh`).
#[test]
#[ignore = "writes the models tests/reference/qwen35/make_fixtures.sh runs llama.cpp on"]
fn write_fixture_models() {
    let dir = std::path::PathBuf::from(std::env::var_os("QWEN35_FIXTURE_DIR").unwrap());
    for (name, h) in fixture_models() {
        let m = synthetic_qwen35(&h, SEED);
        std::fs::write(dir.join(format!("qwen35-{name}.gguf")), &m.bytes).unwrap();
        std::fs::write(dir.join(format!("qwen35-{name}.fnv")), fnv1a64(&m.bytes)).unwrap();
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Worst relative error of each part of a fixture.
#[derive(Default)]
struct Worst {
    prefill: f64,
    decode: f64,
    rollback: f64,
}

/// llama.cpp's logits on the same random GGUFs: a 120-token prefill (every
/// row), 4 decode steps, rollback trials keeping 0..=4 of a 5-row verify
/// and 1 of 3 single-token steps, each followed by a next token.
#[test]
fn logits_match_llamacpp_on_the_same_files() {
    for (name, h) in fixture_models() {
        let path = format!("llamacpp/qwen35-{name}.json");
        let fx = common::fixture(&path);
        let m = synthetic_qwen35(&h, SEED);
        assert_eq!(
            fx["gguf_fnv1a64"].as_str().unwrap(),
            fnv1a64(&m.bytes),
            "{name}: the generator no longer writes the model of tests/fixtures/{path} (remake \
             it with tests/reference/qwen35/make_fixtures.sh)"
        );
        let dec = load(&m);
        let v = h.dims.n_vocab;
        let mut worst = Worst::default();
        let check = |got: &[f32], want: &[f64], part: &mut f64, what: String| {
            let err = max_rel_err(got, want);
            assert!(err < 1e-4, "{name}: {what} off by {err}");
            *part = part.max(err);
            // The greedy token too, unless llama.cpp's top two nearly tie.
            let mut order: Vec<usize> = (0..want.len()).collect();
            order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
            if want[order[0]] - want[order[1]] > 1e-3 {
                let top = blockdraft_core::sampling::argmax(got) as usize;
                assert_eq!(top, order[0], "{name}: {what}: greedy token");
            }
        };
        let mut state = dec.try_new_state(256, 128).unwrap();
        let prompt = ids(&fx["prompt"]);
        dec.forward(&mut state, &prompt, LogitRows::All, true, None)
            .unwrap();
        for (r, (got, want)) in logits(&dec, &state)
            .chunks(v)
            .zip(rows(&fx["prefill"]))
            .enumerate()
        {
            check(got, &want, &mut worst.prefill, format!("prefill row {r}"));
        }
        for (i, step) in fx["decode"].as_array().unwrap().iter().enumerate() {
            let t = step["token"].as_u64().unwrap() as u32;
            dec.forward(&mut state, &[t], LogitRows::Last, true, None)
                .unwrap();
            let want: Vec<f64> = rows(&serde_json::json!([step["logits"]])).remove(0);
            check(
                &logits(&dec, &state),
                &want,
                &mut worst.decode,
                format!("decode {i}"),
            );
        }
        let l = state.len();
        for trial in fx["rollback"].as_array().unwrap() {
            let (batch, keep) = (
                ids(&trial["batch"]),
                trial["keep"].as_u64().unwrap() as usize,
            );
            let at = state.checkpoint();
            dec.forward(&mut state, &batch, LogitRows::All, true, None)
                .unwrap();
            for (r, (got, want)) in logits(&dec, &state)
                .chunks(v)
                .zip(rows(&trial["batch_logits"]))
                .enumerate()
            {
                check(
                    got,
                    &want,
                    &mut worst.rollback,
                    format!("keep {keep}: batch row {r}"),
                );
            }
            state.commit(at, keep).unwrap();
            let next = trial["next"].as_u64().unwrap() as u32;
            dec.forward(&mut state, &[next], LogitRows::Last, true, None)
                .unwrap();
            let want = rows(&serde_json::json!([trial["logits"]])).remove(0);
            check(
                &logits(&dec, &state),
                &want,
                &mut worst.rollback,
                format!("keep {keep}: next"),
            );
            // Back to L: within the rows logged since the checkpoint.
            state.truncate(l).unwrap();
        }
        let single = &fx["single_step_rollback"];
        let at = state.checkpoint();
        for t in ids(&single["steps"]) {
            dec.forward(&mut state, &[t], LogitRows::Last, true, None)
                .unwrap();
        }
        state
            .commit(at, single["keep"].as_u64().unwrap() as usize)
            .unwrap();
        let next = single["next"].as_u64().unwrap() as u32;
        dec.forward(&mut state, &[next], LogitRows::Last, true, None)
            .unwrap();
        let want = rows(&serde_json::json!([single["logits"]])).remove(0);
        check(
            &logits(&dec, &state),
            &want,
            &mut worst.rollback,
            "single steps".into(),
        );
        println!(
            "{name}: worst relative error vs llama.cpp: prefill {:.1e}, decode {:.1e}, rollback {:.1e}",
            worst.prefill, worst.decode, worst.rollback
        );
    }
}

// ---- speculative decoding on a hybrid target -------------------------------

/// A hybrid of 7 blocks (DeltaNet 0, 1, 3, 4, 6; attention 2, 5) and width
/// 48, the target of [`synthetic_block_drafters`] (taps 1, 4, 7: after a
/// DeltaNet block, after an attention block, the output).
fn drafted_target() -> SyntheticHybrid {
    let mut h = SyntheticHybrid::default();
    h.dims.n_layer = 7;
    h.dims.n_embd = 48;
    h
}

/// Every drafter kind gives plain greedy decoding's tokens on a hybrid
/// target: n-gram, oracles whose every draft is accepted and whose every
/// draft is rejected, draft models (attention-only, and hybrid: the target
/// itself, whose drafts all pass, and another, whose drafts mostly fail),
/// and each DFlash variant.
#[test]
fn every_drafter_kind_on_a_hybrid_target_is_identical_to_plain() {
    let h = drafted_target();
    let v = h.dims.n_vocab;
    let target = Arc::new(load(&synthetic_qwen35(&h, SEED)));
    let other_hybrid = Arc::new(load(&synthetic_qwen35(&h, SEED + 1)));
    let dims = SyntheticDims {
        n_vocab: v,
        ..SyntheticDims::default()
    };
    let attention_only = Arc::new(load(&synthetic_decoder("qwen2", dims, 3)));
    let block_files: Vec<(&str, GgufFile)> = synthetic_block_drafters(v)
        .into_iter()
        .map(|(kind, bytes)| (kind, GgufFile::from_bytes(bytes).unwrap()))
        .collect();
    let n = 24;
    let prompts = [
        random_tokens(7, v, 21),
        [5u32, 17, 40, 5, 17, 40, 5, 17, 40, 5, 17].to_vec(),
    ];
    for prompt in &prompts {
        let want = greedy_plain(&target, prompt, n);
        let sequence: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        let mut drafters: Vec<(String, Box<dyn Drafter<CpuBackend>>)> = vec![
            ("n-gram".into(), Box::new(NgramDrafter::default())),
            (
                "oracle, all accepted".into(),
                Box::new(OracleDrafter::new(sequence.clone(), 0.0, v, 1)),
            ),
            (
                "oracle, none accepted".into(),
                Box::new(OracleDrafter::new(sequence.clone(), 1.0, v, 1)),
            ),
        ];
        for (name, model) in [
            ("attention-only draft model", &attention_only),
            ("the target as its draft model", &target),
            ("another hybrid draft model", &other_hybrid),
        ] {
            let d = DraftModelDrafter::new(model.clone(), v, prompt.len() + n + 16).unwrap();
            drafters.push((name.into(), Box::new(d)));
        }
        for (kind, file) in &block_files {
            let d = DFlashDrafter::load(file, &target, prompt.len() + n + 16, 32).unwrap();
            drafters.push((format!("{kind} drafter"), Box::new(d)));
        }
        for (name, mut d) in drafters {
            let (got, stats) =
                greedy_speculative(&target, d.as_mut(), prompt, n, PolicyConfig::fixed(5));
            assert_eq!(got, want, "{name}");
            assert!(stats.rounds > 0, "{name}: {stats:?}");
            match name.as_str() {
                "oracle, all accepted" | "the target as its draft model" => {
                    assert_eq!(stats.accepted, stats.drafted, "{name}: {stats:?}")
                }
                "oracle, none accepted" => assert_eq!(stats.accepted, 0, "{name}: {stats:?}"),
                _ => {}
            }
        }
    }
}

/// Writes `$QWEN35_BENCH_DIR/{hybrid,attention}-0.8b.gguf`: random Q8_0
/// models of Qwen3.5-0.8B's geometry (32k vocabulary), hybrid, and of the
/// same size with every block attention, for `bench` to compare verify
/// costs.
#[test]
#[ignore = "writes 1.1 GB of benchmark models"]
fn write_benchmark_models() {
    let dir = std::path::PathBuf::from(std::env::var_os("QWEN35_BENCH_DIR").unwrap());
    let h = SyntheticHybrid::qwen35_0_8b(32_768, blockdraft_gguf::GgmlType::Q8_0);
    // A DeltaNet block holds 3.2M more weights than an attention block;
    // 768 more FFN columns in every block (3 × 1024 × 768 × 24 = 56.6M of
    // the 18 blocks' 57.6M) make the attention-only model as large.
    let mut all_attention = SyntheticHybrid { interval: 1, ..h };
    all_attention.dims.n_ff += 768;
    for (name, geometry) in [("hybrid", h), ("attention", all_attention)] {
        let bytes = with_vocabulary(&synthetic_qwen35(&geometry, 1).bytes, h.dims.n_vocab);
        std::fs::write(dir.join(format!("{name}-0.8b.gguf")), bytes).unwrap();
    }
}

/// `model` with an SPM vocabulary of `n` made-up tokens (byte tokens,
/// `<s>`, `</s>`), which the command line needs to load it.
fn with_vocabulary(model: &[u8], n: usize) -> Vec<u8> {
    let file = GgufFile::from_bytes(model.to_vec()).unwrap();
    let mut w = blockdraft_gguf::GgufWriter::new();
    w.add_all(file.metadata());
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    types.extend(std::iter::repeat_n(6, 256));
    let words = n - tokens.len();
    tokens.extend((0..words).map(|i| format!("\u{2581}w{i}")));
    types.extend(std::iter::repeat_n(1, words));
    w.add("tokenizer.ggml.model", "llama");
    w.add(
        "tokenizer.ggml.tokens",
        tokens.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    w.add("tokenizer.ggml.token_type", types);
    w.add("tokenizer.ggml.scores", vec![0.0f32; n]);
    for t in file.tensors() {
        let data = file.tensor_data(&t.name).unwrap();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, data.to_vec())
            .unwrap();
    }
    w.to_bytes().unwrap()
}
