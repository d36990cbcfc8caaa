//! `blockdraft serve`: the OpenAI-compatible server (crates/server) on the
//! loaded model.

use crate::args::at_least;
use crate::drafter::DraftArgs;
use crate::load::{with_backend, Job, Loaded, ModelArgs};
use anyhow::{Context, Result};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::chat_template::ChatTemplate;
use blockdraft_server::{Model, Options};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one, printed at start).
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together (plain steps share one target pass).
    #[arg(long = "parallel", default_value_t = 4, value_parser = at_least(1))]
    pub parallel: usize,
    /// Requests that may wait for a free sequence; beyond it, 503.
    #[arg(long = "queue", default_value_t = 64, value_parser = at_least(1))]
    pub queue: usize,
    /// Context of each request in tokens, prompt and answer (default: the
    /// model's trained context).
    #[arg(short = 'c', long = "ctx-size", value_parser = at_least(1))]
    pub ctx_size: Option<usize>,
    /// Most tokens one request may generate.
    #[arg(long = "max-tokens", default_value_t = 4096, value_parser = at_least(1))]
    pub max_tokens: usize,
    /// Seconds a request may run; then it ends with finish_reason `length`.
    #[arg(long = "timeout", default_value_t = 600, value_parser = at_least(1))]
    pub timeout: usize,
    /// Seconds a client may take to send a request's body; then 408.
    #[arg(long = "body-timeout", default_value_t = 30, value_parser = at_least(1))]
    pub body_timeout: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Allow browser pages from this origin (`*` for any).
    #[arg(long = "cors")]
    pub cors: Option<String>,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20, value_parser = at_least(1024))]
    pub max_body: usize,
    /// The model's name in /v1/models and requests (default: the file name).
    #[arg(long = "alias")]
    pub alias: Option<String>,
    #[command(flatten)]
    pub draft: DraftArgs,
}

pub fn run(args: Args) -> Result<()> {
    args.draft.check()?;
    if let Some(n) = args.ctx_size {
        anyhow::ensure!(
            n > 1,
            "--ctx-size must leave room for a prompt and an answer"
        );
    }
    let model = args.model.clone();
    with_backend(&model, args)
}

impl Job for Args {
    fn run<B: Backend>(self, loaded: Loaded<B>) -> Result<()> {
        let name = self.alias.clone().unwrap_or_else(|| {
            let stem = self.model.model.file_stem().unwrap_or_default();
            stem.to_string_lossy().into_owned()
        });
        if let Some(n) = self.ctx_size {
            loaded.decoder.config.context_size(n, Some(n))?;
        }
        let template = match ChatTemplate::from_gguf(&loaded.file) {
            Ok(t) => t,
            Err(e) => {
                crate::out::warn(format!(
                    "the model's chat template cannot be used ({e}): /v1/chat/completions is off"
                ));
                None
            }
        };
        let drafter = crate::drafter::shared(&self.draft, &loaded)?;
        let options = Options {
            host: self.host,
            port: self.port,
            parallel: self.parallel,
            queue: self.queue,
            ctx_size: self.ctx_size,
            api_key: self.api_key,
            cors: self.cors,
            max_body_bytes: self.max_body,
            max_tokens: self.max_tokens,
            request_timeout: Duration::from_secs(self.timeout as u64),
            body_timeout: Duration::from_secs(self.body_timeout as u64),
        };
        let model = Model {
            name,
            decoder: loaded.decoder,
            tokenizer: loaded.tokenizer,
            template,
            drafter,
            policy: self.draft.policy(),
        };
        blockdraft_server::serve(model, options, |addr| {
            eprintln!("blockdraft serve: listening on http://{addr}");
        })
        .context("the server stopped")
    }
}
