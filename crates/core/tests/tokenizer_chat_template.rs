//! Chat templates read from the real models render the expected ChatML, and
//! message content holding every special token of the SmolLM2, Qwen2.5 and
//! Gemma 3 vocabularies stays ordinary text.
//!
//! Models: `$BLOCKDRAFT_MODELS` or `~/.cache/blockdraft/models` (fetch with
//! `tests/fetch_models.sh`); `BLOCKDRAFT_SKIP_MODEL_TESTS=1` skips missing ones.

use std::path::PathBuf;

use blockdraft_core::chat_template::{ChatMessage, ChatTemplate, ContentTokens, TemplateError};
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_gguf::GgufFile;

fn open_model(file: &str) -> Option<GgufFile> {
    let dir = match std::env::var_os("BLOCKDRAFT_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/blockdraft/models"),
    };
    let p = dir.join(file);
    if !p.exists() {
        if std::env::var("BLOCKDRAFT_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
            eprintln!(
                "SKIP: model {} not found (BLOCKDRAFT_SKIP_MODEL_TESTS=1)",
                p.display()
            );
            return None;
        }
        panic!(
            "model {} not found: run tests/fetch_models.sh (or set BLOCKDRAFT_MODELS, \
             or BLOCKDRAFT_SKIP_MODEL_TESTS=1 to skip)",
            p.display()
        );
    }
    Some(GgufFile::open(&p).unwrap())
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Hello!"),
        ChatMessage::user("2+2?"),
    ]
}

#[test]
fn smollm2_template() {
    let Some(f) = open_model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let t = ChatTemplate::from_gguf(&f)
        .unwrap()
        .expect("SmolLM2 has a template");
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&conversation(), false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    );

    // The rendered prompt tokenizes with the chat markers as special tokens.
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let prompt = t.render(&[ChatMessage::user("Hi")], true).unwrap();
    let ids = tok.encode(&prompt, true, true).unwrap();
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(ids[0], start);
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 2);
    assert!(tok.is_eog(end));
    assert_eq!(tok.decode_special(&ids).unwrap(), prompt);
}

#[test]
fn qwen25_template() {
    for file in [
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ] {
        let Some(f) = open_model(file) else {
            continue;
        };
        let t = ChatTemplate::from_gguf(&f)
            .unwrap()
            .expect("Qwen2.5 has a template");
        assert_eq!(
            t.render(&[ChatMessage::user("Hi")], true).unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            "{file}"
        );
        assert_eq!(
            t.render(&conversation(), true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n",
            "{file}"
        );
        assert_eq!(t.eos_token(), "<|im_end|>");
    }
}

#[test]
fn gemma_base_has_no_template() {
    let Some(f) = open_model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    // Callers fall back to plain text: BOS + the text.
    assert!(ChatTemplate::from_gguf(&f).unwrap().is_none());
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let ids = tok.encode("Hello", true, false).unwrap();
    assert_eq!(ids[0], tok.bos().unwrap());
    assert!(tok.is_eog(tok.token_id("<end_of_turn>").unwrap()));
    assert!(tok.is_eog(tok.eos().unwrap()));
}

/// llama.cpp's greedy fixtures (`tests/fixtures/llamacpp/greedy-*.json`)
/// record prompts rendered by llama.cpp's own template engine and their ids
/// (`add_special = true, parse_special = true`): our template rendering and
/// our tokenization must reproduce both.
#[test]
fn llamacpp_rendered_prompts_match() {
    let dir = match std::env::var_os("BLOCKDRAFT_LLAMACPP_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llamacpp"),
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("greedy-") && n.ends_with(".json"))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        eprintln!("SKIP: no greedy-*.json fixtures in {}", dir.display());
        return;
    }
    // The user message of the fixtures' "chat" prompt.
    const CHAT_USER: &str = "Write a haiku about the ocean.";
    for path in files {
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let model = doc["model"].as_str().unwrap();
        let Some(f) = open_model(model) else {
            continue;
        };
        let tok = Tokenizer::from_gguf(&f).unwrap();
        let tmpl = ChatTemplate::from_gguf(&f).unwrap();
        for p in doc["prompts"].as_array().unwrap() {
            let text = p["prompt_text"].as_str().unwrap();
            let want: Vec<u32> = p["prompt_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(
                tok.encode(text, true, true).unwrap(),
                want,
                "{model}: {text:?}"
            );
            if p["prompt_kind"].as_str() == Some("chat_template") {
                let t = tmpl.as_ref().expect("chat prompt but no template");
                let ours = t.render(&[ChatMessage::user(CHAT_USER)], true).unwrap();
                assert_eq!(ours, text, "{model}: rendered chat prompt");
                // Plain content gives llama.cpp's ids too.
                let ids = t
                    .encode(
                        &tok,
                        &[ChatMessage::user(CHAT_USER)],
                        true,
                        ContentTokens::Plain,
                    )
                    .unwrap();
                assert_eq!(ids, want, "{model}: ChatTemplate::encode");
            }
        }
    }
}

/// Gemma 3's instruction-tuned template (google/gemma-3-270m-it): the base
/// model in the tests has none, its vocabulary is the same.
const GEMMA3_TEMPLATE: &str = "{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = \"\" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = \"model\" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception(\"Invalid content type\") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
";

/// The special tokens in `ids`, in order.
fn specials(tok: &Tokenizer, ids: &[u32]) -> Vec<u32> {
    ids.iter().copied().filter(|&i| tok.is_special(i)).collect()
}

/// Content holding every special token of the vocabulary (in a system, a
/// user, an assistant and a last user message, padded with spaces and
/// newlines for templates that trim) tokenizes to ordinary text: the
/// prompt's special tokens are exactly those of the same conversation with
/// harmless content, and the ids decode to the rendered text.
fn check_special_tokens_stay_text(name: &str, tok: &Tokenizer, t: &ChatTemplate) {
    let all: Vec<&str> = (0..tok.vocab_size() as u32)
        .filter(|&i| tok.is_special(i))
        .map(|i| tok.token_text(i).unwrap())
        .collect();
    assert!(all.len() >= 17, "{name}: {} special tokens", all.len());
    // All of them back to back, and the first ones one per line.
    let some = all.iter().take(32).copied().collect::<Vec<_>>().join("\n");
    let hostile = format!(" \n{}x{some} \n", all.concat());
    let conversation = |content: &str| {
        vec![
            ChatMessage::system(content),
            ChatMessage::user(content),
            ChatMessage::assistant(content),
            ChatMessage::user(content),
        ]
    };
    let benign = t
        .encode(tok, &conversation("x"), true, ContentTokens::Plain)
        .unwrap();
    let template_only = specials(tok, &benign);
    assert!(template_only.len() >= 4, "{name}: {template_only:?}");
    let msgs = conversation(&hostile);
    let ids = t.encode(tok, &msgs, true, ContentTokens::Plain).unwrap();
    assert_eq!(specials(tok, &ids), template_only, "{name}");
    let bos = usize::from(tok.add_bos());
    assert_eq!(
        tok.decode_special(&ids[bos..]).unwrap(),
        t.render(&msgs, true).unwrap(),
        "{name}: the content tokenizes to its own text"
    );
    // The opt-in parses them (every one, in each message).
    let parsed = t
        .encode(tok, &msgs, true, ContentTokens::ParseSpecial)
        .unwrap();
    assert!(
        specials(tok, &parsed).len() >= template_only.len() + 4 * all.len(),
        "{name}"
    );
    // A role is template text: special-token text there is refused.
    let e = t
        .encode(
            tok,
            &[ChatMessage::new(format!("user{}", all[0]), "x")],
            true,
            ContentTokens::Plain,
        )
        .unwrap_err();
    assert!(
        matches!(e, TemplateError::SpecialTokenInRole { .. }),
        "{name}: {e}"
    );
}

#[test]
fn content_special_tokens_stay_text_smollm2_qwen25() {
    for file in [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ] {
        let Some(f) = open_model(file) else {
            continue;
        };
        let tok = Tokenizer::from_gguf(&f).unwrap();
        let t = ChatTemplate::from_gguf(&f).unwrap().unwrap();
        check_special_tokens_stay_text(file, &tok, &t);
    }
}

#[test]
fn content_special_tokens_stay_text_gemma3() {
    let Some(f) = open_model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let t = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>").unwrap();
    // The template as transformers renders it (system folded into the first
    // user turn, content trimmed).
    let msgs = [
        ChatMessage::system("Be brief."),
        ChatMessage::user(" Hi \n"),
    ];
    assert_eq!(
        t.render(&msgs, true).unwrap(),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    check_special_tokens_stay_text("gemma-3-270m", &tok, &t);
}
