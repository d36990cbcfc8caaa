//! Routes, authentication, CORS, and the replies: one JSON object, or
//! server-sent events (`data: {chunk}` … `data: [DONE]`).

use crate::api::{self, ApiError, Endpoint, GenRequest};
use crate::metrics::Metrics;
use crate::worker::{Done, Job, Output, Piece, Scored, Worker};
use crate::{Model, Options};
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use blockdraft_core::backend::prelude::*;
use blockdraft_core::chat_template::{ChatTemplate, ToolCall, ToolCallFormat};
use blockdraft_core::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

/// What every handler reads.
struct Shared {
    model_name: String,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    n_ctx: usize,
    options: Options,
    has_drafter: bool,
    queue: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    created: u64,
}

type AppState = Arc<Shared>;

pub async fn run<B: Backend>(
    model: Model<B>,
    options: Options,
    on_listening: impl FnOnce(std::net::SocketAddr),
) -> std::io::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let tokenizer = Arc::new(model.tokenizer);
    let n_ctx = options.ctx_size.unwrap_or(model.decoder.config.n_ctx_train);
    let (queue, jobs) = mpsc::channel(options.queue.max(1));
    let has_drafter = model.drafter.is_some();
    let worker = Worker {
        decoder: model.decoder,
        tokenizer: tokenizer.clone(),
        drafter: model.drafter,
        policy: model.policy,
        parallel: options.parallel.max(1),
        timeout: options.request_timeout,
        metrics: metrics.clone(),
    };
    let engine = std::thread::Builder::new()
        .name("blockdraft-engine".into())
        .spawn(move || worker.run(jobs))?;
    let shared = Arc::new(Shared {
        model_name: model.name,
        tokenizer,
        template: model.template,
        n_ctx,
        has_drafter,
        queue,
        metrics,
        next_id: AtomicU64::new(1),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        options: options.clone(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics_text))
        // Outermost first: the key is checked before any body is read.
        .route_layer(middleware::from_fn_with_state(shared.clone(), read_body))
        .route_layer(middleware::from_fn_with_state(shared.clone(), authenticate))
        .route("/health", get(health))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), cors))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port)).await?;
    on_listening(listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // No handler holds the queue now: the worker finishes what it has.
    drop(shared);
    let _ = tokio::task::spawn_blocking(move || engine.join()).await;
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
    eprintln!("blockdraft serve: shutting down; running requests finish, new ones are refused");
}

fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.status, &e.body())
}

async fn authenticate(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.options.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            s.metrics.rejected();
            let mut e =
                ApiError::invalid(None, "missing or wrong API key (Authorization: Bearer KEY)");
            e = e.with_code(401, "invalid_api_key");
            return error_response(&e);
        }
    }
    next.run(req).await
}

/// Reads a request's whole body before its handler runs, within the
/// body timeout and the size limit: a client that sends it too slowly gets
/// 408, one whose body is too large 413, and neither holds a connection
/// open for longer.
async fn read_body(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let limit = s.options.max_body_bytes;
    let deadline = tokio::time::Instant::now() + s.options.body_timeout;
    let mut frames = body.into_data_stream();
    let mut bytes = Vec::new();
    let refused = loop {
        match tokio::time::timeout_at(deadline, frames.next()).await {
            Ok(None) => break None,
            Ok(Some(Ok(chunk))) if bytes.len() + chunk.len() <= limit => {
                bytes.extend_from_slice(&chunk)
            }
            Ok(Some(Ok(_))) => {
                break Some(
                    ApiError::invalid(None, format!("the request body is over {limit} bytes"))
                        .with_code(413, "request_too_large"),
                )
            }
            Ok(Some(Err(e))) => {
                break Some(
                    ApiError::invalid(None, format!("cannot read the request body: {e}"))
                        .with_code(400, "bad_body"),
                )
            }
            Err(_) => {
                let secs = s.options.body_timeout.as_secs_f64();
                break Some(
                    ApiError::invalid(
                        None,
                        format!("the request body did not arrive within {secs} s"),
                    )
                    .with_code(408, "request_timeout"),
                );
            }
        }
    };
    if let Some(e) = refused {
        s.metrics.request();
        s.metrics.rejected();
        return error_response(&e);
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn cors(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Some(origin) = s.options.cors.clone() else {
        return next.run(req).await;
    };
    let mut res = if req.method() == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    res
}

async fn not_found() -> Response {
    error_response(&ApiError::invalid(None, "no such endpoint").with_code(404, "not_found"))
}

async fn health() -> Response {
    json_response(200, &json!({"status": "ok"}))
}

async fn models(State(s): State<AppState>) -> Response {
    json_response(
        200,
        &json!({"object": "list", "data": [{
            "id": s.model_name, "object": "model", "created": s.created, "owned_by": "blockdraft",
        }]}),
    )
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

async fn chat(
    State(s): State<AppState>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    generate(s, body, Endpoint::Chat).await
}

async fn completions(
    State(s): State<AppState>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    generate(s, body, Endpoint::Completions).await
}

async fn generate(
    s: AppState,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    s.metrics.request();
    // read_body has the whole body in memory already.
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            s.metrics.rejected();
            let e = ApiError::invalid(None, format!("cannot read the request body: {e}"));
            return error_response(&e.with_code(400, "bad_body"));
        }
    };
    let cx = api::Context {
        model_name: &s.model_name,
        tokenizer: &s.tokenizer,
        template: s.template.as_ref(),
        n_ctx: s.n_ctx,
        max_tokens: s.options.max_tokens,
        has_drafter: s.has_drafter,
    };
    let req = match api::parse(&body, endpoint, &cx) {
        Ok(r) => r,
        Err(e) => {
            s.metrics.rejected();
            return error_response(&e);
        }
    };
    let (out, outputs) = mpsc::unbounded_channel();
    let job = Job {
        request: req.clone(),
        out,
        queued: Instant::now(),
    };
    s.metrics.enqueued();
    if let Err(e) = s.queue.try_send(job) {
        s.metrics.dequeued();
        let (status, msg, code) = match e {
            mpsc::error::TrySendError::Full(_) => {
                s.metrics.queue_full();
                (
                    503,
                    "the server is busy: every sequence and queue slot is taken; retry shortly",
                    "server_busy",
                )
            }
            mpsc::error::TrySendError::Closed(_) => {
                (503, "the server is shutting down", "shutting_down")
            }
        };
        let mut res = error_response(&ApiError {
            status,
            message: msg.into(),
            kind: "server_error",
            param: None,
            code: Some(code),
        });
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return res;
    }
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{id}"),
            Endpoint::Completions => format!("cmpl-{id}"),
        },
        model: s.model_name.clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        endpoint,
        logprobs: req.logprobs.is_some(),
        tool_format: req.tool_format,
        tool_names: req.tool_names.clone(),
    };
    if req.stream {
        stream(reply, req, outputs)
    } else {
        whole(reply, outputs).await
    }
}

/// What every chunk or reply of one request repeats.
struct Reply {
    id: String,
    model: String,
    created: u64,
    endpoint: Endpoint,
    /// The request asked for log-probabilities.
    logprobs: bool,
    /// The request offered tools: calls in the answer are read back.
    tool_format: Option<ToolCallFormat>,
    /// The names of the tools offered.
    tool_names: Vec<String>,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// One choice: chat `message`/`delta` or completion `text`, with the
    /// log-probabilities of its tokens when asked (`offset`: where the
    /// text starts in the completion, for completions' `text_offset`).
    fn choice(
        &self,
        text: Option<&str>,
        scored: &[Scored],
        offset: usize,
        chunk: bool,
        first: bool,
        finish: Option<&str>,
    ) -> Value {
        let logprobs = if self.logprobs {
            self.logprobs_object(scored, offset)
        } else {
            Value::Null
        };
        match self.endpoint {
            Endpoint::Chat => {
                let key = if chunk { "delta" } else { "message" };
                let mut msg = serde_json::Map::new();
                if first || !chunk {
                    msg.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    msg.insert("content".into(), json!(t));
                }
                json!({"index": 0, key: msg, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": logprobs})
            }
        }
    }

    /// OpenAI's log-probabilities object of each endpoint: chat's
    /// `content` entries, or completions' parallel lists.
    fn logprobs_object(&self, scored: &[Scored], offset: usize) -> Value {
        // JSON has no infinity; OpenAI reports an impossible token so.
        let lp = |l: f32| {
            if l.is_finite() {
                l.max(-9999.0)
            } else {
                -9999.0
            }
        };
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |p: &Piece, l: f32| json!({"token": p.text, "logprob": lp(l), "bytes": p.bytes});
                let content: Vec<Value> = scored
                    .iter()
                    .map(|s| {
                        let mut e = entry(&s.token, s.logprob);
                        e["top_logprobs"] = s.top.iter().map(|(p, l)| entry(p, *l)).collect();
                        e
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Endpoint::Completions => {
                let mut at = offset;
                let offsets: Vec<usize> = scored
                    .iter()
                    .map(|s| {
                        let here = at;
                        at += s.token.text.chars().count();
                        here
                    })
                    .collect();
                json!({
                    "tokens": scored.iter().map(|s| s.token.text.clone()).collect::<Vec<_>>(),
                    "token_logprobs": scored.iter().map(|s| lp(s.logprob)).collect::<Vec<_>>(),
                    "top_logprobs": scored.iter().map(|s| {
                        s.top.iter().map(|(p, l)| (p.text.clone(), json!(lp(*l))))
                            .collect::<serde_json::Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    /// The calls in a finished answer `text` (with the text before them),
    /// when the request offered tools and the model made some.
    fn tool_calls(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        let offered = |name: &str| self.tool_names.iter().any(|n| n == name);
        self.tool_format?
            .parse(text, &format!("call_{}_", self.id), &offered)
    }

    /// A chat choice carrying `calls` (OpenAI's `tool_calls`, arguments as
    /// a JSON string), their content before them; a stream's delta gives
    /// each call its `index`.
    fn tool_choice(&self, content: &str, calls: &[ToolCall], chunk: bool, first: bool) -> Value {
        let calls: Vec<Value> = (calls.iter().enumerate())
            .map(|(i, c)| {
                let mut v = json!({
                    "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments.to_string()},
                });
                if chunk {
                    v["index"] = json!(i);
                }
                v
            })
            .collect();
        let mut msg = json!({"tool_calls": calls});
        if first || !chunk {
            msg["role"] = json!("assistant");
        }
        if !chunk || !content.is_empty() {
            msg["content"] = if content.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
        }
        let key = if chunk { "delta" } else { "message" };
        let finish = if chunk {
            Value::Null
        } else {
            json!("tool_calls")
        };
        json!({"index": 0, key: msg, "logprobs": null, "finish_reason": finish})
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// OpenAI's usage object, with blockdraft's speculative figures.
fn usage(done: &Done) -> Value {
    let mut u = json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    });
    if let Some(st) = &done.speculative {
        u["speculative"] = json!({
            "drafter": st.drafter, "rounds": st.rounds, "drafted": st.drafted,
            "accepted": st.accepted, "tau": st.tau(),
        });
    }
    u
}

async fn whole(reply: Reply, mut outputs: mpsc::UnboundedReceiver<Output>) -> Response {
    let (mut text, mut scored) = (String::new(), Vec::new());
    while let Some(o) = outputs.recv().await {
        match o {
            Output::Text(t, s) => {
                text.push_str(&t);
                scored.extend(s);
            }
            Output::Failed(e) => return error_response(&ApiError::server(e)),
            Output::Done(done) => {
                let finish = Some(done.finish_reason);
                let choice = match reply.tool_calls(&text) {
                    Some((content, calls)) => reply.tool_choice(&content, &calls, false, true),
                    None => reply.choice(Some(&text), &scored, 0, false, true, finish),
                };
                return json_response(
                    200,
                    &reply.envelope(false, vec![choice], Some(usage(&done))),
                );
            }
        }
    }
    error_response(&ApiError::server("the request ended without a reply"))
}

fn stream(reply: Reply, req: GenRequest, mut outputs: mpsc::UnboundedReceiver<Output>) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Result<Event, Infallible>>();
    // Forwards the worker's outputs as events; when the client goes away
    // its stream is dropped, sending fails, and dropping `outputs` tells
    // the worker to cancel.
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(Event::default().data(v.to_string()))).is_ok();
        let mut first = true;
        // Characters sent so far (completions' `text_offset`).
        let mut offset = 0;
        // With tools, what may be a call is held back until the answer
        // ends (the text from a possible `<tool_call>` on, with its tokens'
        // log-probabilities): then it is sent as calls, or as text.
        let (mut held, mut held_scored) = (String::new(), Vec::new());
        while let Some(o) = outputs.recv().await {
            let ok = match o {
                Output::Text(t, scored) => {
                    held.push_str(&t);
                    held_scored.extend(scored);
                    let send_to = match reply.tool_format {
                        Some(f) => f.call_start(&held, first).unwrap_or(held.len()),
                        None => held.len(),
                    };
                    if send_to == 0 {
                        continue;
                    }
                    let text: String = held.drain(..send_to).collect();
                    // Log-probabilities go with the text they were held with.
                    let scored: Vec<Scored> = if held.is_empty() {
                        std::mem::take(&mut held_scored)
                    } else {
                        Vec::new()
                    };
                    let choice = reply.choice(Some(&text), &scored, offset, true, first, None);
                    offset += text.chars().count();
                    first = false;
                    send(reply.envelope(true, vec![choice], None))
                }
                Output::Failed(e) => {
                    send(ApiError::server(e).body());
                    break;
                }
                Output::Done(done) => {
                    let mut finish = Some(done.finish_reason);
                    let mut ok = true;
                    if let Some((content, calls)) = reply.tool_calls(&held) {
                        let choice = reply.tool_choice(&content, &calls, true, first);
                        ok &= send(reply.envelope(true, vec![choice], None));
                        finish = Some("tool_calls");
                    } else if !held.is_empty() {
                        let choice =
                            reply.choice(Some(&held), &held_scored, offset, true, first, None);
                        ok &= send(reply.envelope(true, vec![choice], None));
                    }
                    first = false;
                    let choice = reply.choice(None, &[], offset, true, first, finish);
                    ok &= send(reply.envelope(true, vec![choice], None));
                    if req.include_usage {
                        ok &= send(reply.envelope(true, vec![], Some(usage(&done))));
                    }
                    ok && tx.send(Ok(Event::default().data("[DONE]"))).is_ok()
                }
            };
            if !ok {
                break;
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
