//! Unit tests on tiny hand-made vocabularies.

use super::unicode::BYTE_TO_CHAR;
use super::*;

/// A byte-level BPE vocabulary: the 256 byte characters (ids 0..256), then
/// `extra` tokens, with `merges`.
fn bpe_spec(extra: &[&str], merges: &[&str]) -> TokenizerSpec {
    let mut tokens: Vec<String> = BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
    tokens.extend(extra.iter().map(|s| s.to_string()));
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn id(tok: &Tokenizer, s: &str) -> u32 {
    tok.token_id(s).unwrap_or_else(|| panic!("no token {s:?}"))
}

#[test]
fn bpe_merges_follow_rank_order() {
    // "b c" ranks before "a b": abc -> a + bc, and "a bc" is no rule.
    let tok =
        Tokenizer::from_spec(bpe_spec(&["ab", "bc", "abc"], &["b c", "a b", "ab c"])).unwrap();
    assert_eq!(
        tok.encode("abc", false, false).unwrap(),
        vec![id(&tok, "a"), id(&tok, "bc")]
    );
    // "a b" first: ab + c, then "ab c" -> abc.
    let tok =
        Tokenizer::from_spec(bpe_spec(&["ab", "bc", "abc"], &["a b", "b c", "ab c"])).unwrap();
    assert_eq!(
        tok.encode("abc", false, false).unwrap(),
        vec![id(&tok, "abc")]
    );
    assert_eq!(tok.decode(&[id(&tok, "abc")]).unwrap(), "abc");
    // Equal pairs: leftmost first. "aaa" -> "aa" + "a".
    let tok = Tokenizer::from_spec(bpe_spec(&["aa"], &["a a"])).unwrap();
    assert_eq!(
        tok.encode("aaa", false, false).unwrap(),
        vec![id(&tok, "aa"), id(&tok, "a")]
    );
}

#[test]
fn bpe_byte_level_and_words() {
    let sp = format!("{}", BYTE_TO_CHAR[b' ' as usize]);
    let hi = format!("{sp}hi");
    let tok = Tokenizer::from_spec(bpe_spec(&["hi", &hi], &["h i", &format!("{sp} hi")])).unwrap();
    // Pre-tokenized into "hi" and " hi": merges never cross words.
    assert_eq!(
        tok.encode("hi hi", false, false).unwrap(),
        vec![id(&tok, "hi"), id(&tok, &hi)]
    );
    // Multi-byte characters become their byte tokens.
    let ids = tok.encode("é", false, false).unwrap();
    assert_eq!(
        ids,
        [0xC3, 0xA9]
            .iter()
            .map(|&b: &u8| {
                let c = BYTE_TO_CHAR[b as usize].to_string();
                id(&tok, &c)
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(tok.decode(&ids).unwrap(), "é");
    assert_eq!(tok.token_to_piece(ids[0]), vec![0xC3]);
}

fn spm_spec() -> TokenizerSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![
        token_type::UNKNOWN,
        token_type::CONTROL,
        token_type::CONTROL,
    ];
    let mut scores = vec![0.0f32, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -1.0f32),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("▁a", -3.0),
        ("ab", -1.5),
        ("bc", -0.5),
        ("abc", -4.0),
        ("<start_of_turn>", 0.0),
        ("<tag>", 0.0),
    ] {
        tokens.push(t.into());
        scores.push(s);
        types.push(match t {
            "<start_of_turn>" => token_type::CONTROL,
            "<tag>" => token_type::USER_DEFINED,
            _ => token_type::NORMAL,
        });
    }
    TokenizerSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos: Some(1),
        eos: Some(2),
        add_space_prefix: Some(false),
        ..Default::default()
    }
}

#[test]
fn spm_merges_by_score_and_byte_fallback() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    // Any adjacent pair forming a token merges: abc -> a + bc -> abc.
    assert_eq!(
        tok.encode("abc", false, false).unwrap(),
        vec![id(&tok, "abc")]
    );
    // Highest score first: bc (-0.5) before ab (-1.5), then ▁a (-3) beats
    // abc (-4). Had ab merged first, the result would be ▁ + abc.
    assert_eq!(
        tok.encode(" abc", false, false).unwrap(),
        vec![id(&tok, "▁a"), id(&tok, "bc")]
    );
    // Unknown characters fall back to bytes: é = C3 A9.
    let ids = tok.encode("aé", true, false).unwrap();
    assert_eq!(ids, vec![1, id(&tok, "a"), 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.decode(&ids).unwrap(), "aé");
    // Spaces are ▁.
    assert_eq!(
        tok.encode(" a", false, false).unwrap(),
        vec![id(&tok, "▁a")]
    );
    assert_eq!(tok.decode(&[id(&tok, "▁a")]).unwrap(), " a");
}

#[test]
fn spm_space_prefix_after_special() {
    let mut spec = spm_spec();
    spec.add_space_prefix = Some(true);
    let tok = Tokenizer::from_spec(spec).unwrap();
    let st = id(&tok, "<start_of_turn>");
    // A prefix space at the start and after each special token, as llama.cpp.
    assert_eq!(
        tok.encode("a<start_of_turn>a", false, true).unwrap(),
        vec![id(&tok, "▁a"), st, id(&tok, "▁a")]
    );
    // decode removes the first prefix space only.
    assert_eq!(
        tok.decode(&[id(&tok, "▁a"), id(&tok, "▁a")]).unwrap(),
        "a a"
    );
}

#[test]
fn special_tokens_partition() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    let st = id(&tok, "<start_of_turn>");
    let tag = id(&tok, "<tag>");
    // parse_special: control tokens are matched.
    let ids = tok.encode("<start_of_turn>a<tag>", false, true).unwrap();
    assert_eq!(ids, vec![st, id(&tok, "a"), tag]);
    // Without it only user-defined tokens are; the control text is plain text.
    let ids = tok.encode("<start_of_turn>a<tag>", false, false).unwrap();
    assert!(!ids.contains(&st));
    assert_eq!(*ids.last().unwrap(), tag);
    assert_eq!(tok.decode(&ids).unwrap(), "<start_of_turn>a<tag>");
    // Control tokens render as nothing unless asked.
    assert_eq!(tok.decode(&[st, id(&tok, "a")]).unwrap(), "a");
    assert_eq!(
        tok.decode_special(&[st, id(&tok, "a")]).unwrap(),
        "<start_of_turn>a"
    );
    assert!(tok.token_to_piece(st).is_empty());
}

#[test]
fn plain_ranges_keep_control_text_as_text() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    let st = id(&tok, "<start_of_turn>");
    let tag = id(&tok, "<tag>");
    let text = "<start_of_turn>a<start_of_turn><tag><start_of_turn>";
    // Only the middle one (in 15..36) stays text; <tag> matches anyway.
    let ids = tok
        .encode_with_plain(text, false, std::slice::from_ref(&(15..36)))
        .unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == st).count(), 2);
    assert_eq!((ids[0], *ids.last().unwrap()), (st, st));
    assert!(ids.contains(&tag));
    assert_eq!(tok.decode_special(&ids).unwrap(), text);
    // No ranges: encode with parse_special; the whole text: without it.
    assert_eq!(
        tok.encode_with_plain(text, true, &[]).unwrap(),
        tok.encode(text, true, true).unwrap()
    );
    assert_eq!(
        tok.encode_with_plain(text, true, std::slice::from_ref(&(0..text.len())))
            .unwrap(),
        tok.encode(text, true, false).unwrap()
    );
    assert!(tok.is_special(st) && !tok.is_special(tag) && tok.is_special(0));
    assert_eq!(tok.find_special("x<tag><start_of_turn>"), Some(st));
    assert_eq!(tok.find_special("x<tag>"), None);
}

#[test]
fn bos_eos_and_eog() {
    let mut spec = spm_spec();
    spec.add_eos = Some(true);
    let tok = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert_eq!(tok.encode("", true, false).unwrap(), vec![1, 2]);
    assert_eq!(tok.encode("", false, false).unwrap(), Vec::<u32>::new());
    // </s> is EOS and in llama.cpp's end-of-generation text list.
    assert!(tok.is_eog(2));
    assert!(!tok.is_eog(1));
    assert_eq!(tok.vocab_size(), 3 + 256 + 10);

    // <|im_end|> / <|endoftext|> are end-of-generation by text.
    let mut spec = bpe_spec(&["<|im_end|>", "<|endoftext|>", "<|im_start|>"], &[]);
    let n = spec.tokens.len();
    let mut types = vec![token_type::NORMAL; n];
    types[n - 1] = token_type::CONTROL;
    types[n - 2] = token_type::CONTROL;
    spec.token_types = Some(types);
    spec.eos = Some(n as u32 - 3);
    let tok = Tokenizer::from_spec(spec).unwrap();
    let end = id(&tok, "<|im_end|>");
    let eot = id(&tok, "<|endoftext|>");
    assert!(tok.is_eog(end) && tok.is_eog(eot));
    assert!(!tok.is_eog(id(&tok, "<|im_start|>")));
    // <|im_end|> was NORMAL in the types but becomes a control token.
    assert!(tok.is_control(end));
    assert_eq!(
        tok.encode("x<|im_end|>", false, true).unwrap(),
        vec![id(&tok, "x"), end]
    );
}

#[test]
fn errors_are_typed() {
    let mut s = spm_spec();
    s.model = "wordpiece9".into();
    assert!(
        matches!(Tokenizer::from_spec(s), Err(TokenizerError::UnknownModel(m)) if m == "wordpiece9")
    );
    let mut s = bpe_spec(&[], &[]);
    s.pre = Some("klingon".into());
    assert!(
        matches!(Tokenizer::from_spec(s), Err(TokenizerError::UnknownPreTokenizer(m)) if m == "klingon")
    );
    let mut s = spm_spec();
    s.scores.as_mut().unwrap().truncate(5);
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::LengthMismatch { .. })
    ));
    let mut s = spm_spec();
    s.token_types.as_mut().unwrap().pop();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::LengthMismatch { .. })
    ));
    let s = bpe_spec(&[], &["ab"]);
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::BadMerge { index: 0, .. })
    ));
    let s = TokenizerSpec {
        model: "gpt2".into(),
        ..Default::default()
    };
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::EmptyVocab)
    ));

    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    assert!(matches!(
        tok.decode(&[1, 99_999]),
        Err(TokenizerError::IdOutOfRange { id: 99_999, .. })
    ));
    assert!(tok.token_to_piece(u32::MAX).is_empty());
    let mut d = tok.stream_decoder();
    assert!(d.push(u32::MAX).is_err());
}

#[test]
fn stream_decoder_holds_split_characters() {
    let tok = Tokenizer::from_spec(spm_spec()).unwrap();
    // 🎉 = F0 9F 8E 89, as four byte tokens, between two letters.
    let ids = tok.encode("a🎉b", false, false).unwrap();
    assert_eq!(ids.len(), 6);
    let mut d = StreamDecoder::new(&tok);
    let out: Vec<String> = ids.iter().map(|&i| d.push(i).unwrap()).collect();
    assert_eq!(out, vec!["a", "", "", "", "🎉", "b"]);
    assert_eq!(d.finish(), "");
    // An incomplete character left at the end is flushed lossily.
    let mut d = StreamDecoder::new(&tok);
    assert_eq!(d.push(3 + 0xF0).unwrap(), "");
    assert_eq!(d.pending(), &[0xF0]);
    assert_eq!(d.finish(), "\u{FFFD}");
    // A byte that can never start a character is replaced at once.
    let mut d = StreamDecoder::new(&tok);
    assert_eq!(d.push(3 + 0xFF).unwrap(), "\u{FFFD}");
    // decode is lossy only at the end.
    assert_eq!(tok.decode(&[3 + 0xF0, 3 + 0x9F]).unwrap(), "\u{FFFD}");
}

#[test]
fn clean_spaces_pass() {
    assert_eq!(clean_spaces(b"a , b ' c it 's"), b"a, b'c it's".to_vec());
    assert_eq!(clean_spaces(b"we 're here ."), b"we're here.".to_vec());
    assert_eq!(clean_spaces(b"don 't"), b"don 't".to_vec());
    assert_eq!(clean_spaces(b""), Vec::<u8>::new());
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<crate::chat_template::ChatTemplate>();
}
