//! The prompt a chat turn becomes: the model's template, then tokens. One
//! function so that `run --chat` and `gen-data` (whose drafter training data
//! must match inference exactly) tokenize a conversation the same way.
//!
//! Message text is plain text by default: `<|im_end|>` in `--prompt` or
//! `--system` stays those characters, and only the template's own markers
//! become special tokens ([`ChatTemplate::encode`]).

use anyhow::{bail, Context, Result};
use blockdraft_core::chat_template::{ChatMessage, ChatTemplate, ContentTokens};
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_gguf::GgufFile;

/// The model's chat template, or an error telling the user what to do.
pub fn template(file: &GgufFile) -> Result<ChatTemplate> {
    ChatTemplate::from_gguf(file)?
        .context("the model has no chat template (tokenizer.chat_template); run without --chat")
}

/// Token ids of `[system?, user]` rendered by `template`, ending with the
/// header of the assistant's turn. `content` says whether special-token
/// text in the messages counts ([`ContentTokens::ParseSpecial`], for
/// trusted pre-formatted text) or stays text (the default).
pub fn user_turn_tokens(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    system: Option<&str>,
    user: &str,
    content: ContentTokens,
) -> Result<Vec<u32>> {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", user));
    let ids = template.encode(tokenizer, &messages, true, content)?;
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    Ok(ids)
}
