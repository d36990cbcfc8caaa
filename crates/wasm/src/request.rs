//! A generation request as JS sends it (JSON), checked field by field.

use crate::error::ApiError;
use blockdraft_core::chat_template::{ChatMessage, ContentTokens};
use blockdraft_core::sampling::{limits, Bounds, SamplingParams};
use blockdraft_core::speculative::PolicyConfig;
use serde::{Deserialize, Serialize};

/// Tokens generated when the request does not say.
pub const DEFAULT_MAX_TOKENS: usize = 256;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    /// Penalty of tokens among the last `repeat_last_n` (1 disables).
    repeat_penalty: Option<f32>,
    /// Subtracted once from the logit of each token among the last
    /// `repeat_last_n` (OpenAI's; 0 disables).
    presence_penalty: Option<f32>,
    /// Subtracted per occurrence among the last `repeat_last_n` (0 disables).
    frequency_penalty: Option<f32>,
    repeat_last_n: Option<usize>,
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
    /// Use the drafter loaded with the model (default: when there is one).
    speculative: Option<bool>,
    /// Most tokens drafted per round.
    draft_max: Option<usize>,
    /// Parse special-token text in message content as special tokens
    /// (default false: content is plain text; only for trusted content).
    special_tokens_in_content: Option<bool>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: String,
}

#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text, tokenized as is (special-token text parsed: the caller
    /// writes the whole prompt).
    Text(String),
    /// A conversation rendered with the model's chat template; `content`
    /// says whether special-token text in the messages counts.
    Chat(Vec<ChatMessage>, ContentTokens),
}

#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Prompt,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub speculative: Option<bool>,
    pub draft_max: usize,
}

/// `v` checked against `bounds` (core's table, which the CLI's flags use too).
fn check_range(name: &str, v: f32, bounds: Bounds<f32>) -> Result<f32, ApiError> {
    bounds
        .check(v)
        .map_err(|e| ApiError::invalid(format!("{name} {e}")))
}

impl Request {
    pub fn from_json(json: &str) -> Result<Request, ApiError> {
        let raw: Raw = serde_json::from_str(json)
            .map_err(|e| ApiError::invalid(format!("bad generation request: {e}")))?;
        let content = match raw.special_tokens_in_content {
            Some(true) => ContentTokens::ParseSpecial,
            _ => ContentTokens::Plain,
        };
        if raw.special_tokens_in_content.is_some() && raw.messages.is_none() {
            return Err(ApiError::invalid(
                "special_tokens_in_content applies to chat messages only \
                 (a raw prompt's special-token text is always parsed)",
            ));
        }
        let prompt = match (raw.prompt, raw.messages) {
            (Some(p), None) => Prompt::Text(p),
            (None, Some(m)) if !m.is_empty() => Prompt::Chat(
                m.into_iter()
                    .map(|m| ChatMessage::new(m.role, m.content))
                    .collect(),
                content,
            ),
            (None, Some(_)) => return Err(ApiError::invalid("messages must not be empty")),
            _ => {
                return Err(ApiError::invalid(
                    "give exactly one of prompt (raw text) or messages (chat)",
                ))
            }
        };
        if raw.max_tokens == Some(0) {
            return Err(ApiError::invalid("max_tokens must be at least 1"));
        }
        let temperature = check_range(
            "temperature",
            raw.temperature.unwrap_or(1.0),
            limits::TEMPERATURE,
        )?;
        let sampling = SamplingParams {
            temperature,
            top_k: raw.top_k.unwrap_or(0),
            top_p: check_range("top_p", raw.top_p.unwrap_or(1.0), limits::TOP_P)?,
            min_p: check_range("min_p", raw.min_p.unwrap_or(0.0), limits::MIN_P)?,
            repeat_penalty: check_range(
                "repeat_penalty",
                raw.repeat_penalty.unwrap_or(1.0),
                limits::REPEAT_PENALTY,
            )?,
            presence_penalty: check_range(
                "presence_penalty",
                raw.presence_penalty.unwrap_or(0.0),
                limits::PRESENCE_PENALTY,
            )?,
            frequency_penalty: check_range(
                "frequency_penalty",
                raw.frequency_penalty.unwrap_or(0.0),
                limits::FREQUENCY_PENALTY,
            )?,
            repeat_last_n: limits::REPEAT_LAST_N
                .check(raw.repeat_last_n.unwrap_or(64))
                .map_err(|e| ApiError::invalid(format!("repeat_last_n {e}")))?,
            seed: raw.seed.unwrap_or_else(clock_seed),
        };
        let draft_max = PolicyConfig::LENGTHS
            .check(raw.draft_max.unwrap_or(8))
            .map_err(|e| ApiError::invalid(format!("draft_max {e}")))?;
        if raw.stop.len() > 16 {
            return Err(ApiError::invalid("at most 16 stop strings"));
        }
        Ok(Request {
            prompt,
            max_tokens: raw.max_tokens,
            sampling,
            stop: raw.stop,
            speculative: raw.speculative,
            draft_max,
        })
    }
}

/// A seed for requests that give none.
fn clock_seed() -> u64 {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let r = Request::from_json(r#"{"prompt":"hi","temperature":0,"seed":3}"#).unwrap();
        assert!(r.sampling.is_greedy());
        assert_eq!(r.sampling.seed, 3);
        assert_eq!(r.sampling.repeat_penalty, 1.0, "no penalty unless asked");
        let r = Request::from_json(r#"{"prompt":"hi","repeat_penalty":1.1,"repeat_last_n":32}"#)
            .unwrap();
        assert_eq!(
            (r.sampling.repeat_penalty, r.sampling.repeat_last_n),
            (1.1, 32)
        );
        let r =
            Request::from_json(r#"{"prompt":"hi","presence_penalty":-0.5,"frequency_penalty":1}"#)
                .unwrap();
        assert_eq!(
            (r.sampling.presence_penalty, r.sampling.frequency_penalty),
            (-0.5, 1.0)
        );
        let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
        assert!(matches!(
            Request::from_json(chat).unwrap().prompt,
            Prompt::Chat(_, ContentTokens::Plain)
        ));
        let trusted =
            r#"{"messages":[{"role":"user","content":"hi"}],"special_tokens_in_content":true}"#;
        assert!(matches!(
            Request::from_json(trusted).unwrap().prompt,
            Prompt::Chat(_, ContentTokens::ParseSpecial)
        ));
        for bad in [
            r#"{}"#,
            r#"{"prompt":"a","messages":[{"role":"user","content":"b"}]}"#,
            r#"{"prompt":"a","temperature":-1}"#,
            r#"{"prompt":"a","top_p":2}"#,
            r#"{"prompt":"a","repeat_penalty":0}"#,
            r#"{"prompt":"a","repeat_penalty":-1.1}"#,
            r#"{"prompt":"a","repeat_last_n":-1}"#,
            r#"{"prompt":"a","presence_penalty":2.5}"#,
            r#"{"prompt":"a","frequency_penalty":"high"}"#,
            r#"{"prompt":"a","draft_max":65}"#,
            r#"{"prompt":"a","draft_max":0}"#,
            r#"{"prompt":"a","max_tokens":0}"#,
            r#"{"prompt":"a","max_tokens":-3}"#,
            r#"{"prompt":"a","bogus":1}"#,
            r#"{"messages":[]}"#,
            r#"{"prompt":"a","special_tokens_in_content":true}"#,
            r#"{"messages":[{"role":"user","content":"b"}],"special_tokens_in_content":1}"#,
            r#"not json"#,
        ] {
            let e = Request::from_json(bad).unwrap_err();
            assert_eq!(e.code, crate::error::Code::InvalidArgument, "{bad}");
        }
    }
}
