//! The step machine on the CPU backend: sequences stepped together (plain
//! steps batched into one target pass, speculative rounds alone, sequences
//! joining late) give exactly the tokens each gives alone, for plain
//! greedy and sampled decoding and for every drafter kind, on attention
//! and on hybrid targets; every sequence shares the models' weights, and
//! making one uploads none.

use blockdraft_core::backend::prelude::*;
use blockdraft_core::engine::{Engine, Event, Held, Sequence};
use blockdraft_core::model::{Decoder, LogitRows};
use blockdraft_core::sampling::{Sampler, SamplingParams, TokenLogprobs};
use blockdraft_core::speculative::{
    DFlashDrafter, DFlashModel, DraftModelDrafter, DraftPolicy, Drafter, NgramDrafter,
    PolicyConfig, SharedDrafter,
};
use blockdraft_core::testing::{
    block_on, synthetic_block_drafters, synthetic_decoder, synthetic_dflash, synthetic_qwen35,
    SyntheticDFlash, SyntheticDims, SyntheticHybrid,
};
use blockdraft_core::ModelError;
use blockdraft_cpu::CpuBackend;
use blockdraft_gguf::{GgmlType, GgufFile};
use std::sync::Arc;

const N: usize = 24;

/// How a test sequence decodes.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Greedy,
    Sampled(u64),
    SampledDFlash(u64),
    Ngram,
    DraftModel,
    DFlash,
}

struct Models {
    target: Arc<Decoder<CpuBackend>>,
    draft: Arc<Decoder<CpuBackend>>,
    dflash: Arc<DFlashModel<CpuBackend>>,
}

fn models() -> Models {
    models_of(false)
}

/// Three-block models: llama, or hybrid (`qwen35`: two gated-DeltaNet
/// blocks, then gated attention), whose draft model is hybrid too.
fn models_of(hybrid: bool) -> Models {
    let dims = SyntheticDims {
        n_layer: 3,
        ..SyntheticDims::default()
    };
    let be = Arc::new(CpuBackend::new(2));
    let load = |seed| {
        let bytes = if hybrid {
            let h = SyntheticHybrid {
                dims: SyntheticDims {
                    n_layer: 3,
                    ..SyntheticHybrid::default().dims
                },
                ..SyntheticHybrid::default()
            };
            synthetic_qwen35(&h, seed).bytes
        } else {
            synthetic_decoder("llama", dims, seed).bytes
        };
        let file = GgufFile::from_bytes(bytes).unwrap();
        Arc::new(Decoder::load(&file, be.clone(), &mut |_| {}).unwrap())
    };
    let target = load(41);
    let spec = SyntheticDFlash {
        block_size: 4,
        ..SyntheticDFlash::small(target.config.n_embd, vec![1, 3], GgmlType::Q8_0)
    };
    let dflash = GgufFile::from_bytes(synthetic_dflash(&spec, 9).bytes).unwrap();
    let dflash = Arc::new(DFlashModel::load(&dflash, &target).unwrap());
    Models {
        target,
        draft: load(41),
        dflash,
    }
}

fn prompt(i: usize, n_vocab: usize) -> Vec<u32> {
    // Repeating patterns give the n-gram drafter something to find.
    (0..12 + i)
        .map(|j| ((j % (3 + i)) * 37 + i * 11) as u32 % n_vocab as u32)
        .collect()
}

fn sequence<'a>(m: &Models, kind: Kind, prompt: &[u32]) -> Sequence<'a, CpuBackend> {
    let n_ctx = prompt.len() + N + 16;
    let params = match kind {
        Kind::Sampled(seed) | Kind::SampledDFlash(seed) => SamplingParams {
            temperature: 0.9,
            seed,
            ..SamplingParams::greedy()
        },
        _ => SamplingParams::greedy(),
    };
    let seq = Sequence::new(
        Held::owned(m.target.new_state(n_ctx, 16)),
        prompt,
        N,
        Held::owned(Sampler::new(params)),
        |_| false,
    );
    let drafter: Box<dyn Drafter<CpuBackend>> = match kind {
        Kind::Greedy | Kind::Sampled(_) => return seq,
        Kind::Ngram => Box::new(NgramDrafter::default()),
        Kind::DraftModel => Box::new(
            DraftModelDrafter::new(m.draft.clone(), m.target.config.n_vocab, n_ctx).unwrap(),
        ),
        Kind::DFlash | Kind::SampledDFlash(_) => {
            Box::new(DFlashDrafter::new(m.dflash.clone(), n_ctx, 16))
        }
    };
    seq.with_drafter(
        Held::Owned(drafter),
        Held::owned(DraftPolicy::new(PolicyConfig::default())),
    )
}

/// Tokens of `seq` driven alone to the end.
fn alone(m: &Models, mut seq: Sequence<'_, CpuBackend>) -> Vec<u32> {
    block_on(seq.run_alone(&m.target, &mut |_| true, &mut |_| {}))
        .unwrap()
        .0
}

#[test]
fn sequences_stepped_together_give_the_tokens_of_each_alone() {
    stepped_together(&models());
}

/// The same on a hybrid target, whose recurrent state every sequence rolls
/// back on its own (batched plain steps, rounds, a hybrid draft model).
#[test]
fn hybrid_sequences_stepped_together_give_the_tokens_of_each_alone() {
    stepped_together(&models_of(true));
}

fn stepped_together(m: &Models) {
    let loaded = m.target.backend.weight_bytes_loaded();
    let n_vocab = m.target.config.n_vocab;
    let kinds = [
        Kind::Greedy,
        Kind::Sampled(3),
        Kind::Ngram,
        Kind::DraftModel,
        Kind::DFlash,
        Kind::DFlash,
        Kind::SampledDFlash(5),
        Kind::Greedy,
    ];
    let want: Vec<Vec<u32>> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| alone(m, sequence(m, k, &prompt(i, n_vocab))))
        .collect();
    // A seed draws the same tokens with a drafter as without.
    let sampled = kinds
        .iter()
        .position(|k| matches!(k, Kind::SampledDFlash(_)))
        .unwrap();
    assert_eq!(
        want[sampled],
        alone(m, sequence(m, Kind::Sampled(5), &prompt(sampled, n_vocab)))
    );

    // Rounds among the batch: the two paths interleaved (the default
    // speculates only alone; tested below).
    let mut engine = Engine::new(m.target.clone()).with_rounds_among_batch();
    // The last one joins after a few steps, as a server's request would.
    let mut seqs: Vec<Sequence<'_, CpuBackend>> = kinds[..kinds.len() - 1]
        .iter()
        .enumerate()
        .map(|(i, &k)| sequence(m, k, &prompt(i, n_vocab)))
        .collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); kinds.len()];
    let mut finished = vec![false; kinds.len()];
    for step in 0.. {
        if step == 3 {
            let last = kinds.len() - 1;
            seqs.push(sequence(m, kinds[last], &prompt(last, n_vocab)));
        }
        if step > 3 && seqs.iter().all(Sequence::is_finished) {
            break;
        }
        assert!(step < 10 * N, "the sequences never finished");
        for (i, event) in block_on(engine.step(&mut seqs)).unwrap() {
            match event {
                Event::Token(t) => got[i].push(t),
                Event::Finished(_) => finished[i] = true,
                Event::Failed(e) => panic!("sequence {i} ({:?}): {e}", kinds[i]),
                Event::Round(_) | Event::Logprobs(_) => {}
            }
        }
    }
    for (i, kind) in kinds.iter().enumerate() {
        assert_eq!(got[i], want[i], "sequence {i} ({kind:?})");
        assert!(finished[i], "sequence {i} ({kind:?}) finished");
        assert_eq!(seqs[i].tokens(), &want[i][..]);
    }
    assert_eq!(
        m.target.backend.weight_bytes_loaded(),
        loaded,
        "sequences upload no weights"
    );
    let (passes, steps) = engine.batched();
    assert!(
        passes > N / 2 && steps > 3 * passes,
        "plain steps are batched: {passes} passes carried {steps} steps"
    );
}

/// By default a sequence speculates only while it decodes alone: beside
/// others, every sequence takes the batched plain step (the same tokens).
#[test]
fn sequences_speculate_only_while_decoding_alone() {
    let m = models();
    let n_vocab = m.target.config.n_vocab;
    // DFlash drafting 4 every round, whatever it costs.
    let drafting = |p: &[u32]| {
        let n_ctx = p.len() + N + 16;
        Sequence::new(
            Held::owned(m.target.new_state(n_ctx, 16)),
            p,
            N,
            Held::owned(Sampler::new(SamplingParams::greedy())),
            |_| false,
        )
        .with_drafter(
            Held::Owned(Box::new(DFlashDrafter::new(m.dflash.clone(), n_ctx, 16))),
            Held::owned(DraftPolicy::new(PolicyConfig::fixed(4))),
        )
    };
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, n_vocab)).collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| alone(&m, sequence(&m, Kind::Greedy, p)))
        .collect();
    let mut engine = Engine::new(m.target.clone());
    // The first decodes alone for a few steps, then two join it.
    let mut seqs = vec![drafting(&prompts[0])];
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let (mut rounds_together, mut rounds_alone) = (0, 0);
    for step in 0.. {
        if step == 4 {
            seqs.push(drafting(&prompts[1]));
            seqs.push(drafting(&prompts[2]));
        }
        if step > 4 && seqs.iter().all(Sequence::is_finished) {
            break;
        }
        // Past their prefill (which emits the first token), not finished.
        let decoding = (0..seqs.len())
            .filter(|&i| !seqs[i].is_finished() && !got[i].is_empty())
            .count();
        assert!(step < 10 * N, "the sequences never finished");
        for (i, event) in block_on(engine.step(&mut seqs)).unwrap() {
            match event {
                Event::Token(t) => got[i].push(t),
                Event::Round(r) if r.drafted > 0 && decoding > 1 => rounds_together += 1,
                Event::Round(r) if r.drafted > 0 => rounds_alone += 1,
                Event::Failed(e) => panic!("sequence {i}: {e}"),
                _ => {}
            }
        }
    }
    assert!(rounds_alone > 0, "rounds while the first decodes alone");
    assert_eq!(rounds_together, 0, "no round while others decode beside it");
    assert_eq!(got, want);
}

/// `SharedDrafter::from_gguf`, the one loader of the CLI, the server and
/// the browser: a DFlash file becomes shared DFlash weights, a model of the target's vocabulary a
/// shared draft model, and one of another vocabulary a typed error naming
/// both sizes, before any sequence exists.
#[test]
fn shared_drafters_load_from_gguf_by_kind() {
    let m = models();
    let dims = SyntheticDims {
        n_layer: 3,
        ..SyntheticDims::default()
    };
    let file = |bytes| GgufFile::from_bytes(bytes).unwrap();

    let spec = SyntheticDFlash::small(m.target.config.n_embd, vec![1, 3], GgmlType::Q8_0);
    let dflash = SharedDrafter::from_gguf(&file(synthetic_dflash(&spec, 3).bytes), &m.target)
        .expect("a DFlash drafter loads");
    assert_eq!(dflash.kind(), "dflash");
    let before = m.target.backend.weight_bytes_loaded();
    // One throwaway draft, uploading nothing.
    block_on(dflash.warm_up()).expect("the DFlash warm-up drafts");
    let seq = dflash
        .for_sequence(m.target.config.n_vocab, 64, 16)
        .unwrap()
        .expect("a drafter for the sequence");
    assert_eq!(m.target.backend.weight_bytes_loaded(), before);
    assert_eq!(seq.kind(), "dflash");

    let same = file(synthetic_decoder("llama", dims, 5).bytes);
    let draft = SharedDrafter::from_gguf(&same, &m.target).expect("a draft model loads");
    assert_eq!(draft.kind(), "draft-model");
    block_on(draft.warm_up()).unwrap();

    let other_vocab = SyntheticDims {
        n_vocab: dims.n_vocab + 8,
        ..dims
    };
    let other = file(synthetic_decoder("llama", other_vocab, 5).bytes);
    match SharedDrafter::from_gguf(&other, &m.target) {
        Err(ModelError::VocabularyMismatch { drafter, target }) => {
            assert_eq!((drafter, target), (other_vocab.n_vocab, dims.n_vocab));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(d) => panic!("a {} drafter of another vocabulary loaded", d.kind()),
    }
}

/// A block drafter's file where a model belongs (`run -m drafter.gguf`, the
/// npm package's `model`) is a typed error that says where it goes, for
/// every variant (their loading as drafters: the drafter tests).
#[test]
fn a_drafter_given_as_the_model_says_where_it_goes() {
    for (kind, bytes) in synthetic_block_drafters(64) {
        let file = GgufFile::from_bytes(bytes).unwrap();
        match Decoder::load(&file, Arc::new(CpuBackend::new(1)), &mut |_| {}) {
            Err(e @ ModelError::DrafterAsModel) => {
                assert!(e.to_string().contains("--draft"), "{kind}: {e}")
            }
            Err(e) => panic!("{kind}: wrong error: {e}"),
            Ok(_) => panic!("a {kind} drafter loaded as a model"),
        }
    }
}

/// Each token of sequences stepped together, with the log-probabilities
/// reported just before it.
fn scored_together(
    m: &Models,
    seqs: &mut [Sequence<'_, CpuBackend>],
) -> Vec<Vec<(u32, TokenLogprobs)>> {
    let mut engine = Engine::new(m.target.clone());
    let mut got = vec![Vec::new(); seqs.len()];
    let mut pending: Vec<Option<TokenLogprobs>> = vec![None; seqs.len()];
    while !seqs.iter().all(Sequence::is_finished) {
        for (i, event) in block_on(engine.step(seqs)).unwrap() {
            match event {
                Event::Logprobs(lp) => {
                    assert!(pending[i].replace(lp).is_none(), "two in a row");
                }
                Event::Token(t) => {
                    let lp = pending[i].take().expect("log-probabilities before a token");
                    assert_eq!(lp.token, t);
                    got[i].push((t, lp));
                }
                Event::Failed(e) => panic!("sequence {i}: {e}"),
                Event::Round(_) | Event::Finished(_) => {}
            }
        }
    }
    got
}

/// Log-probabilities are the target's own (its logits' softmax at each
/// position, the most likely tokens first), the same whatever drafts the
/// tokens and whether a step is batched, and asking for them changes no
/// token.
#[test]
fn logprobs_are_the_targets_whatever_drafts_the_tokens() {
    let m = models();
    let n_vocab = m.target.config.n_vocab;
    let kinds = [
        Kind::Greedy,
        Kind::DFlash,
        Kind::Ngram,
        Kind::Sampled(3),
        Kind::SampledDFlash(3),
    ];
    let p = prompt(2, n_vocab);
    let alone: Vec<Vec<(u32, TokenLogprobs)>> = kinds
        .iter()
        .map(|&k| {
            let seq = sequence(&m, k, &p).with_logprobs(4);
            scored_together(&m, &mut [seq]).remove(0)
        })
        .collect();
    let mut together: Vec<Sequence<'_, CpuBackend>> = kinds
        .iter()
        .map(|&k| sequence(&m, k, &p).with_logprobs(4))
        .collect();
    let together = scored_together(&m, &mut together);
    let tokens = |s: &[(u32, TokenLogprobs)]| s.iter().map(|x| x.0).collect::<Vec<_>>();
    for (i, kind) in kinds.iter().enumerate() {
        assert_eq!(
            tokens(&alone[i]),
            tokens_alone(&m, *kind, &p),
            "{kind:?}: the tokens of a sequence without log-probabilities"
        );
        assert_eq!(alone[i], together[i], "{kind:?}: stepped with others");
    }
    // Speculation reports plain decoding's figures, bit for bit.
    assert_eq!(alone[1], alone[0], "DFlash vs plain greedy");
    assert_eq!(alone[2], alone[0], "n-gram vs plain greedy");
    assert_eq!(alone[4], alone[3], "DFlash vs plain sampling");

    // Against the target's logits over the whole text in one pass.
    let greedy = &alone[0];
    let mut text = p.clone();
    text.extend(greedy.iter().map(|x| x.0));
    let mut state = m.target.new_state(text.len(), text.len());
    m.target
        .forward(
            &mut state,
            &text[..text.len() - 1],
            LogitRows::All,
            true,
            None,
        )
        .unwrap();
    let rows = block_on(m.target.backend.read(state.logits()));
    for (i, (t, lp)) in greedy.iter().enumerate() {
        let row = &rows[(p.len() - 1 + i) * n_vocab..][..n_vocab];
        let want = TokenLogprobs::from_logits(row, *t, 4);
        assert!(
            (lp.logprob - want.logprob).abs() < 1e-4,
            "token {i}: {lp:?} vs {want:?}"
        );
        assert_eq!(lp.top.len(), 4);
        // Greedy picks the most likely token.
        assert_eq!((lp.top[0].0, lp.top[0].1), (*t, lp.logprob));
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(lp.logprob <= 0.0);
    }
}

/// The tokens of a sequence of `kind` without log-probabilities, alone.
fn tokens_alone(m: &Models, kind: Kind, p: &[u32]) -> Vec<u32> {
    alone(m, sequence(m, kind, p))
}
