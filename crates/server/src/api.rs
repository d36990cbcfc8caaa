//! The OpenAI request bodies, checked field by field into a [`GenRequest`],
//! and the error object every failure is answered with.

use blockdraft_core::chat_template::{
    ChatMessage, ChatTemplate, ContentTokens, ToolCall, ToolCallFormat,
};
use blockdraft_core::sampling::{limits, Bounds, SamplingParams, MAX_TOP_LOGPROBS};
use blockdraft_core::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error as OpenAI's API returns it: an HTTP status and
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    pub fn with_code(mut self, status: u16, code: &'static str) -> Self {
        self.status = status;
        self.code = Some(code);
        self
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message content: a string, or a list of parts of which only text ones
/// are understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    /// An assistant message's calls.
    tool_calls: Option<Vec<CallIn>>,
    /// A tool message's answer to this call.
    tool_call_id: Option<String>,
}

/// A function call of an assistant message, as OpenAI writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallIn {
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: FunctionIn,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionIn {
    name: String,
    /// A JSON object, as a string (OpenAI) or as is.
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// A completion prompt: one string, or a list holding one.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    One(String),
    Many(Vec<String>),
}

/// The fields both endpoints share, and the ones each adds. Unknown fields
/// are refused, not ignored: a client asking for something this server
/// does not do must hear so.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    prompt: Option<PromptField>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// llama.cpp's multiplicative penalty (1 disables).
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<i64>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    logit_bias: Option<Value>,
    /// Ignored by OpenAI's own API for generation; accepted.
    user: Option<String>,
    /// Turn speculation off (or insist on it) for this request.
    speculative: Option<bool>,
}

/// Which endpoint a body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A checked request, tokenized.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub speculative: Option<bool>,
    /// Log-probabilities of each token with this many alternatives
    /// (chat's `logprobs: true` + `top_logprobs`, completions' `logprobs`).
    pub logprobs: Option<usize>,
    /// The format to read function calls back in, when the request offered
    /// tools.
    pub tool_format: Option<ToolCallFormat>,
    /// The names of the tools offered.
    pub tool_names: Vec<String>,
}

/// What checking a body needs to know about the server.
pub struct Context<'a> {
    pub model_name: &'a str,
    pub tokenizer: &'a Tokenizer,
    pub template: Option<&'a ChatTemplate>,
    /// Positions one sequence may hold (prompt + answer).
    pub n_ctx: usize,
    /// Most tokens one request may ask for.
    pub max_tokens: usize,
    pub has_drafter: bool,
}

fn unsupported(param: &'static str, what: &str) -> ApiError {
    ApiError::invalid(
        Some(param),
        format!("{what} is not supported by this server"),
    )
    .with_code(400, "unsupported_parameter")
}

/// Parses and checks `bytes` for `endpoint`, tokenizing the prompt.
pub fn parse(bytes: &[u8], endpoint: Endpoint, cx: &Context<'_>) -> Result<GenRequest, ApiError> {
    let body: Body = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(
            None,
            format!("the request body is not a valid request: {e}"),
        )
    })?;
    if let Some(m) = &body.model {
        if m != cx.model_name {
            return Err(ApiError::invalid(
                Some("model"),
                format!(
                    "the model `{m}` does not exist; this server has `{}`",
                    cx.model_name
                ),
            )
            .with_code(404, "model_not_found"));
        }
    }
    if body.n.is_some_and(|n| n != 1) {
        return Err(unsupported("n", "n other than 1"));
    }
    let logprobs = logprobs_request(endpoint, &body.logprobs, &body.top_logprobs)?;
    let tools = tools_request(endpoint, &body.tools, &body.tool_choice, cx)?;
    if let Some(f) = &body.response_format {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(unsupported(
                "response_format",
                "a response format other than text",
            ));
        }
    }
    if body
        .logit_bias
        .as_ref()
        .is_some_and(|b| b.as_object().is_none_or(|o| !o.is_empty()))
    {
        return Err(unsupported("logit_bias", "logit_bias"));
    }
    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(
            body.messages.as_deref(),
            tools.as_ref().map(|(t, _)| t),
            body.prompt.is_some(),
            cx,
        )?,
        Endpoint::Completions => {
            completion_prompt(body.prompt.as_ref(), body.messages.is_some(), cx)?
        }
    };
    let max_tokens = match (body.max_tokens, body.max_completion_tokens) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                "give max_tokens or max_completion_tokens, not both",
            ))
        }
        (Some(n), None) | (None, Some(n)) => {
            if n < 1 || n as u64 > cx.max_tokens as u64 {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    format!("max_tokens must be within 1..={}, got {n}", cx.max_tokens),
                ));
            }
            n as usize
        }
        (None, None) => cx
            .max_tokens
            .min(cx.n_ctx.saturating_sub(prompt.len()))
            .max(1),
    };
    if prompt.len() + max_tokens > cx.n_ctx {
        return Err(ApiError::invalid(
            Some("messages"),
            format!(
                "this model's context holds {} tokens; the prompt has {} and max_tokens is \
                 {max_tokens}: shorten the prompt or lower max_tokens",
                cx.n_ctx,
                prompt.len()
            ),
        )
        .with_code(400, "context_length_exceeded"));
    }
    let range = |param: &'static str, v: Option<f32>, default: f32, b: Bounds<f32>| {
        let v = v.unwrap_or(default);
        b.check(v)
            .map_err(|e| ApiError::invalid(Some(param), format!("{param} {e}")))
    };
    let top_k = match body.top_k {
        None => 0,
        Some(k) if k >= 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                Some("top_k"),
                format!("top_k must be at least 0, got {k}"),
            ))
        }
    };
    let repeat_last_n = match body.repeat_last_n {
        None => 64,
        Some(n) if n >= 0 => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                Some("repeat_last_n"),
                format!("repeat_last_n must be at least 0, got {n}"),
            ))
        }
    };
    let sampling = SamplingParams {
        temperature: range("temperature", body.temperature, 1.0, limits::TEMPERATURE)?,
        top_k,
        top_p: range("top_p", body.top_p, 1.0, limits::TOP_P)?,
        min_p: range("min_p", body.min_p, 0.0, limits::MIN_P)?,
        repeat_penalty: range(
            "repeat_penalty",
            body.repeat_penalty,
            1.0,
            limits::REPEAT_PENALTY,
        )?,
        presence_penalty: range(
            "presence_penalty",
            body.presence_penalty,
            0.0,
            limits::PRESENCE_PENALTY,
        )?,
        frequency_penalty: range(
            "frequency_penalty",
            body.frequency_penalty,
            0.0,
            limits::FREQUENCY_PENALTY,
        )?,
        repeat_last_n,
        seed: match body.seed {
            Some(s) => s as u64,
            None => clock_seed(),
        },
    };
    let stop = match body.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            Some("stop"),
            "stop takes up to 4 non-empty strings",
        ));
    }
    if body.speculative == Some(true) && !cx.has_drafter {
        return Err(ApiError::invalid(
            Some("speculative"),
            "speculative: true needs a drafter; start the server with --draft",
        ));
    }
    let stream = body.stream.unwrap_or(false);
    if body.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            Some("stream_options"),
            "stream_options applies to streamed requests (stream: true) only",
        ));
    }
    let _ = body.user;
    Ok(GenRequest {
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        speculative: body.speculative,
        logprobs,
        tool_names: tools.as_ref().map_or_else(Vec::new, |(t, _)| tool_names(t)),
        tool_format: tools.map(|(_, f)| f),
    })
}

/// The tools offered to the model, and the format its calls come back
/// in: `None` without tools (or with `tool_choice: "none"`). Only chat
/// takes them, through a template that offers tools in a format known
/// here; the model decides whether to call (`tool_choice` `auto`), since
/// forcing a call would need constrained decoding.
fn tools_request(
    endpoint: Endpoint,
    tools: &Option<Value>,
    choice: &Option<Value>,
    cx: &Context<'_>,
) -> Result<Option<(Value, ToolCallFormat)>, ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a),
        Some(v) => {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools must be a list of functions, got {v}"),
            ))
        }
    };
    match (choice.as_ref().and_then(Value::as_str), choice) {
        (_, None | Some(Value::Null)) | (Some("auto" | "none"), _) => {}
        (Some("required"), _) | (None, Some(Value::Object(_))) => {
            return Err(unsupported(
                "tool_choice",
                "forcing a tool call (tool_choice `required` or a named function)",
            ))
        }
        (_, Some(v)) => {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice must be `none`, `auto`, `required` or a function, got {v}"),
            ))
        }
    }
    let Some(tools) = tools else {
        return Ok(None);
    };
    if endpoint == Endpoint::Completions {
        return Err(unsupported("tools", "tools on /v1/completions (use chat)"));
    }
    for (i, t) in tools.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        if t.get("type").and_then(Value::as_str) != Some("function")
            || name.is_none_or(str::is_empty)
        {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ));
        }
    }
    if choice.as_ref().and_then(Value::as_str) == Some("none") {
        return Ok(None);
    }
    let format = cx
        .template
        .and_then(ChatTemplate::tool_call_format)
        .ok_or_else(|| {
            unsupported(
                "tools",
                "tool calling with this model (its chat template offers no tools in a known format)",
            )
        })?;
    Ok(Some((Value::Array(tools.clone()), format)))
}

/// How many alternatives each token's log-probabilities list, if asked:
/// chat takes `logprobs: true` and `top_logprobs: 0..=20`, completions
/// `logprobs: 0..=20` (the alternatives' count).
fn logprobs_request(
    endpoint: Endpoint,
    logprobs: &Option<Value>,
    top_logprobs: &Option<Value>,
) -> Result<Option<usize>, ApiError> {
    let count = |param: &'static str, v: &Value| match v.as_u64() {
        Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(n as usize),
        _ => Err(ApiError::invalid(
            Some(param),
            format!("{param} must be an integer within 0..={MAX_TOP_LOGPROBS}, got {v}"),
        )),
    };
    fn given(v: &Option<Value>) -> Option<&Value> {
        v.as_ref().filter(|v| !v.is_null())
    }
    match endpoint {
        Endpoint::Chat => {
            let asked = match given(logprobs) {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(ApiError::invalid(
                        Some("logprobs"),
                        format!("logprobs must be a boolean, got {v}"),
                    ))
                }
            };
            match (asked, given(top_logprobs)) {
                (false, None) => Ok(None),
                (false, Some(_)) => Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs needs logprobs: true",
                )),
                (true, None) => Ok(Some(0)),
                (true, Some(v)) => count("top_logprobs", v).map(Some),
            }
        }
        Endpoint::Completions => {
            if given(top_logprobs).is_some() {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "completions take the count in logprobs; top_logprobs is chat's",
                ));
            }
            match given(logprobs) {
                None | Some(Value::Bool(false)) => Ok(None),
                Some(v) => count("logprobs", v).map(Some),
            }
        }
    }
}

fn chat_prompt(
    messages: Option<&[Message]>,
    tools: Option<&Value>,
    has_prompt: bool,
    cx: &Context<'_>,
) -> Result<Vec<u32>, ApiError> {
    if has_prompt {
        return Err(ApiError::invalid(
            Some("prompt"),
            "chat completions take messages, not prompt (use /v1/completions)",
        ));
    }
    let messages = match messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => {
            return Err(ApiError::invalid(
                Some("messages"),
                "messages must not be empty",
            ))
        }
        None => return Err(ApiError::invalid(Some("messages"), "messages is required")),
    };
    let template = cx.template.ok_or_else(|| {
        ApiError::invalid(
            Some("messages"),
            "the model has no chat template; use /v1/completions with a raw prompt",
        )
    })?;
    let tool_template = template.tool_call_format().is_some();
    let mut chat = Vec::with_capacity(messages.len());
    for m in messages {
        let role_ok = match m.role.as_str() {
            "system" | "developer" | "user" | "assistant" => true,
            "tool" => tool_template,
            _ => false,
        };
        if !role_ok {
            return Err(ApiError::invalid(
                Some("messages"),
                format!(
                    "role `{}` is not supported (system, developer, user, assistant{})",
                    m.role,
                    if tool_template { ", tool" } else { "" }
                ),
            ));
        }
        if m.tool_calls.is_some() && (m.role != "assistant" || !tool_template) {
            return Err(ApiError::invalid(
                Some("messages"),
                "tool_calls belong to assistant messages of a model with tools",
            ));
        }
        let _ = (&m.name, &m.tool_call_id);
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(unsupported(
                                "messages",
                                &format!("content of type `{kind}`"),
                            ))
                        }
                    }
                }
                text
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        let mut message = ChatMessage::new(role, text);
        for c in m.tool_calls.iter().flatten() {
            message.tool_calls.push(tool_call(c)?);
        }
        chat.push(message);
    }
    // Content is plain text: a message cannot open another turn by writing
    // the template's markers.
    let ids = template
        .encode_with_tools(cx.tokenizer, &chat, tools, true, ContentTokens::Plain)
        .map_err(|e| ApiError::invalid(Some("messages"), format!("cannot render the chat: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "the messages tokenize to nothing",
        ));
    }
    Ok(ids)
}

/// The function names of checked `tools`.
fn tool_names(tools: &Value) -> Vec<String> {
    let names = tools.as_array().into_iter().flatten();
    names
        .filter_map(|t| t["function"]["name"].as_str().map(String::from))
        .collect()
}

/// An assistant message's call, its arguments an object (OpenAI sends
/// them as a JSON string; templates print them as an object).
fn tool_call(c: &CallIn) -> Result<ToolCall, ApiError> {
    let bad = |what: String| ApiError::invalid(Some("messages"), what);
    if c.kind.as_deref().is_some_and(|k| k != "function") {
        return Err(bad(format!(
            "a tool call of type `{}`; only functions are known",
            c.kind.as_deref().unwrap_or_default()
        )));
    }
    let arguments = match &c.function.arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            bad(format!(
                "the arguments of the call to `{}` are not JSON: {e}",
                c.function.name
            ))
        })?,
        Some(v) => v.clone(),
    };
    if !arguments.is_object() {
        return Err(bad(format!(
            "the arguments of the call to `{}` must be a JSON object",
            c.function.name
        )));
    }
    Ok(ToolCall {
        id: c.id.clone().unwrap_or_default(),
        name: c.function.name.clone(),
        arguments,
    })
}

fn completion_prompt(
    prompt: Option<&PromptField>,
    has_messages: bool,
    cx: &Context<'_>,
) -> Result<Vec<u32>, ApiError> {
    if has_messages {
        return Err(ApiError::invalid(
            Some("messages"),
            "completions take prompt, not messages (use /v1/chat/completions)",
        ));
    }
    let text = match prompt {
        Some(PromptField::One(t)) => t,
        Some(PromptField::Many(v)) if v.len() == 1 => &v[0],
        Some(PromptField::Many(_)) => return Err(unsupported("prompt", "more than one prompt")),
        None => return Err(ApiError::invalid(Some("prompt"), "prompt is required")),
    };
    // A raw prompt is the caller's whole text: special-token text in it
    // counts, as in llama-server's completions.
    let ids = cx.tokenizer.encode(text, true, true).map_err(|e| {
        ApiError::invalid(Some("prompt"), format!("cannot tokenize the prompt: {e}"))
    })?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "the prompt tokenizes to nothing",
        ));
    }
    Ok(ids)
}

/// A seed for requests that give none.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
