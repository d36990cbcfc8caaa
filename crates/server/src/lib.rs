//! `blockdraft serve`: an OpenAI-compatible HTTP server.
//!
//! One worker thread owns the [`Engine`](blockdraft_core::engine::Engine)
//! and steps every running request together (plain steps batched into one
//! target pass); HTTP handlers check and tokenize a request, queue it
//! ([`worker`]), and turn the events it sends back into a JSON reply or a
//! stream of server-sent events ([`http`]). The queue is bounded: a full one
//! answers 503 with `Retry-After`. A client that goes away cancels its
//! request at the next step.

mod api;
mod http;
mod metrics;
mod worker;

use blockdraft_core::backend::prelude::*;
use blockdraft_core::chat_template::ChatTemplate;
use blockdraft_core::model::Decoder;
use blockdraft_core::speculative::{PolicyConfig, SharedDrafter};
use blockdraft_core::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Duration;

/// What `serve` loads: the model, its tokenizer and chat template, and
/// the drafter every request may use.
pub struct Model<B: Backend> {
    /// The name `/v1/models` lists and requests must give (or omit).
    pub name: String,
    pub decoder: Arc<Decoder<B>>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub drafter: SharedDrafter<B>,
    pub policy: PolicyConfig,
}

/// Server settings (the CLI's flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Requests waiting for a free sequence beyond `parallel`.
    pub queue: usize,
    /// Context of every sequence (prompt + answer); default: the model's.
    pub ctx_size: Option<usize>,
    pub api_key: Option<String>,
    /// `Access-Control-Allow-Origin` for browser clients.
    pub cors: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most tokens one request may generate.
    pub max_tokens: usize,
    /// A request still running after this is finished (`length`).
    pub request_timeout: Duration,
    /// A request whose body has not arrived after this gets 408.
    pub body_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 4,
            queue: 64,
            ctx_size: None,
            api_key: None,
            cors: None,
            max_body_bytes: 4 << 20,
            max_tokens: 4096,
            request_timeout: Duration::from_secs(600),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `model` until SIGINT or SIGTERM: then no new request is taken
/// and the server returns once the running ones have finished.
/// `on_listening` gets the bound address (port 0 picks a free one).
pub fn serve<B: Backend>(
    model: Model<B>,
    options: Options,
    on_listening: impl FnOnce(std::net::SocketAddr),
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(http::run(model, options, on_listening))
}
