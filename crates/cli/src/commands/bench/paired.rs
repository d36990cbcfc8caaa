//! `bench --against OTHER`: two models on one backend, measured in pairs:
//! each decode repetition and each verify pass of -m's right beside one of
//! OTHER's, the order alternating from pair to pair. A machine whose speed
//! drifts by 10–20 % from one minute to the next moves both halves of a
//! pair alike, so the median of the per-pair ratios holds where a ratio of
//! two separate runs' medians does not.

use super::{decode_rate, progress, time_forward, time_verify, warmed_up, Args};
use crate::commands::median;
use crate::interrupt;
use crate::load::{load_beside, Loaded};
use anyhow::Result;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::model::{Decoder, DecoderState, LogitRows};
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;

/// One model's side of the comparison.
struct Side<'a, B: Backend> {
    dec: &'a Decoder<B>,
    state: DecoderState<B>,
    tokens: Vec<u32>,
}

impl<'a, B: Backend> Side<'a, B> {
    fn new(dec: &'a Decoder<B>, needed: usize, what: &str) -> Result<Self> {
        let why = format!("{what}: the benchmark's -n or --verify-ctx + --verify-max");
        let (state, tokens) = warmed_up(dec, needed, &why)?;
        Ok(Side { dec, state, tokens })
    }
}

/// Seconds of the two sides' measurements, pair by pair.
#[derive(Default)]
struct Pairs(Vec<[f64; 2]>);

impl Pairs {
    fn median_of(&self, side: usize) -> f64 {
        median(&self.0.iter().map(|p| p[side]).collect::<Vec<_>>())
    }

    /// Median over the pairs of -m's time over the other's.
    fn ratio(&self) -> f64 {
        median(&self.0.iter().map(|p| p[0] / p[1]).collect::<Vec<_>>())
    }
}

/// The sides in the order pair `i` measures them: -m first in even pairs.
fn order(i: usize) -> [usize; 2] {
    if i.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// The paired benchmark; returns whether Ctrl-C cut it short (what was
/// measured is printed either way).
pub fn bench<B: Backend>(args: &Args, loaded: &Loaded<B>, other: &Path) -> Result<bool> {
    let beside = load_beside(&args.model, other, loaded.decoder.backend.clone())?;
    let needed = (args.n_gen + 1).max(args.verify_ctx + args.verify_max);
    progress("warming up both models");
    let mut sides = [
        Side::new(&loaded.decoder, needed, "-m")?,
        Side::new(&beside.decoder, needed, "--against")?,
    ];

    let mut decode = Pairs::default();
    'reps: for rep in 0..if args.n_gen > 0 { args.reps } else { 0 } {
        let mut secs = [0.0; 2];
        for i in order(rep) {
            let s = &mut sides[i];
            s.state.truncate(0)?;
            match decode_rate(s.dec, &mut s.state, s.tokens[0], args.n_gen)? {
                Some(tps) => secs[i] = 1.0 / tps,
                None => break 'reps,
            }
        }
        progress(format!(
            "decode pair {}/{}: {:.2} and {:.2} tok/s",
            rep + 1,
            args.reps,
            1.0 / secs[0],
            1.0 / secs[1]
        ));
        decode.0.push(secs);
    }

    let mut verify = Vec::new();
    if args.verify_max > 0 && !interrupt::requested() {
        progress(format!(
            "verify passes of k = 1..={} rows at context {}, in pairs",
            args.verify_max, args.verify_ctx
        ));
        for s in &mut sides {
            s.state.truncate(0)?;
            time_forward(
                s.dec,
                &mut s.state,
                &s.tokens[..args.verify_ctx],
                LogitRows::None,
            )?;
        }
        let k_max = sides
            .iter()
            .map(|s| s.state.logit_rows())
            .fold(args.verify_max, usize::min);
        for k in 1..=k_max {
            let mut pairs = Pairs::default();
            for rep in 0..args.reps.max(3) {
                let mut secs = [0.0; 2];
                for i in order(rep) {
                    let s = &mut sides[i];
                    let rows = &s.tokens[args.verify_ctx..args.verify_ctx + k];
                    secs[i] = time_verify(s.dec, &mut s.state, rows)?;
                }
                pairs.0.push(secs);
            }
            if interrupt::requested() {
                break;
            }
            verify.push((k, pairs));
        }
    }
    let interrupted = interrupt::requested();
    let names = [args.model.model.display(), other.display()];

    if args.json {
        let decode_json = (!decode.0.is_empty()).then(|| {
            json!({
                "pairs": decode.0.len(),
                "tokens_per_second": [1.0 / decode.median_of(0), 1.0 / decode.median_of(1)],
                "time_ratio": decode.ratio(),
            })
        });
        crate::out::println(json!({
            "model": names[0].to_string(),
            "against": names[1].to_string(),
            "backend": loaded.decoder.backend.name(),
            "threads": args.model.threads(),
            "n_gen": args.n_gen,
            "interrupted": interrupted,
            "decode": decode_json,
            "verify_context": args.verify_ctx,
            "verify": verify.iter().map(|(k, p)| json!({
                "k": k,
                "pairs": p.0.len(),
                "seconds": [p.median_of(0), p.median_of(1)],
                "time_ratio": p.ratio(),
            })).collect::<Vec<_>>(),
        }))?;
        return Ok(interrupted);
    }
    let mut out = String::new();
    if interrupted {
        let _ = writeln!(out, "(interrupted: what was measured before Ctrl-C)");
    }
    let _ = writeln!(out, "model    A {}", names[0]);
    let _ = writeln!(out, "against  B {}", names[1]);
    let _ = writeln!(out, "backend  {}", loaded.decoder.backend.name());
    let _ = writeln!(
        out,
        "(each of A's measurements beside one of B's, the order alternating; A/B is the median of the pairs' time ratios)"
    );
    if !decode.0.is_empty() {
        let _ = writeln!(
            out,
            "decode   tg{:<5} A {:>8.2} tok/s  B {:>8.2} tok/s  A/B {:.3} ({} pairs)",
            args.n_gen,
            1.0 / decode.median_of(0),
            1.0 / decode.median_of(1),
            decode.ratio(),
            decode.0.len()
        );
    }
    if !verify.is_empty() {
        let _ = writeln!(out, "verify   T(k) at context {}:", args.verify_ctx);
        for (k, p) in &verify {
            let _ = writeln!(
                out,
                "  k={k:<3} A {:>8.2} ms  B {:>8.2} ms  A/B {:.3} ({} pairs)",
                p.median_of(0) * 1e3,
                p.median_of(1) * 1e3,
                p.ratio(),
                p.0.len()
            );
        }
    }
    crate::out::print(&out)?;
    Ok(interrupted)
}
