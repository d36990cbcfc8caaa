//! One model loaded on one backend, and generation with it: the browser's
//! counterpart of the CLI's `run` (same tokenization, stop strings and
//! engine, so the same greedy text).

use crate::error::{ApiError, Code};
use crate::request::{Prompt, Request, DEFAULT_MAX_TOKENS};
use blockdraft_core::backend::prelude::*;
use blockdraft_core::backend::KvType;
use blockdraft_core::chat_template::{ChatTemplate, TemplateError};
use blockdraft_core::generate::{ends_in_a_loop, generate, StopReason, TextStream};
use blockdraft_core::model::{Decoder, ModelConfig, StreamedModel};
use blockdraft_core::sampling::Sampler;
use blockdraft_core::speculative::{
    generate_speculative, DraftPolicy, PolicyConfig, SharedDrafter,
};
use blockdraft_core::tokenizer::Tokenizer;
use blockdraft_gguf::GgufFile;
use serde::Serialize;
use std::sync::Arc;

/// Rows per forward pass (prefill chunk, verify batch), as the CLI uses.
const MAX_BATCH: usize = 256;

pub struct Session<B: Backend> {
    decoder: Decoder<B>,
    tokenizer: Tokenizer,
    /// The chat template, or why chat requests cannot be served.
    template: Result<ChatTemplate, String>,
    drafter: SharedDrafter<B>,
    /// Whether the warm-up pass ran (on the first request).
    warmed: std::cell::Cell<bool>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SpeculativeUsage {
    pub drafter: String,
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance_rate: f64,
    /// Tokens committed per speculative round (accepted + 1).
    pub tau: f64,
}

/// What a request produced besides its text.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// `stop` (end of generation or a stop string), `length`, or `abort`.
    pub finish_reason: &'static str,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub prefill_tokens_per_second: f64,
    /// After the first token (which comes from prefill).
    pub decode_tokens_per_second: f64,
    pub speculative: Option<SpeculativeUsage>,
    /// The first request's warm-up pass ([`Decoder::warm_up`]: weight
    /// repacking, shader compilation), kept out of the prefill; 0 later.
    pub warmup_seconds: f64,
    /// The output ends in a loop (the same few tokens again and again):
    /// a repeat penalty (`repeat_penalty: 1.1`) usually helps.
    pub looping: bool,
}

impl<B: Backend> Session<B> {
    /// The session of `model`, whose weights are already resident on
    /// `backend`, with `drafter`.
    pub fn load(
        backend: Arc<B>,
        mut model: StreamedModel<B>,
        drafter: DrafterSource,
        kv_type: KvType,
    ) -> Result<Self, ApiError> {
        let tokenizer = Tokenizer::from_metadata(&model.metadata).map_err(|e| {
            ApiError::new(
                Code::UnsupportedModel,
                format!("cannot build the model's tokenizer: {e}"),
            )
        })?;
        let template = match ChatTemplate::from_metadata(&model.metadata) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => {
                Err("the model has no chat template; use completions with a raw prompt".into())
            }
            Err(e) => Err(format!(
                "the model's chat template cannot be used ({e}); use completions with a raw prompt"
            )),
        };
        let decoder = ModelConfig::from_metadata(&model.metadata)
            .and_then(|config| {
                Decoder::load_with_config(config, &mut model, None, backend.clone(), &mut |_| {})
            })
            .map_err(|e| ApiError::model("model", e))?
            .with_kv_type(kv_type);
        let drafter = match drafter {
            DrafterSource::None => SharedDrafter::None,
            DrafterSource::Ngram => SharedDrafter::Ngram,
            DrafterSource::Gguf(d) => {
                SharedDrafter::from_gguf(&d, &decoder).map_err(|e| ApiError::model("drafter", e))?
            }
        };
        Ok(Session {
            decoder,
            tokenizer,
            template,
            drafter,
            warmed: std::cell::Cell::new(false),
        })
    }

    pub fn backend(&self) -> &B {
        &self.decoder.backend
    }

    pub fn backend_name(&self) -> String {
        self.decoder.backend_name()
    }

    pub fn kv_type(&self) -> KvType {
        self.decoder.kv_type()
    }

    pub fn drafter_kind(&self) -> &'static str {
        self.drafter.kind()
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_ok()
    }

    pub fn n_ctx_train(&self) -> usize {
        self.decoder.config.n_ctx_train
    }

    /// Runs `req`; `on_text` receives the text as it is generated (stop
    /// strings held back and cut) and returns `false` to abort.
    pub async fn generate(
        &self,
        req: &Request,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Usage, ApiError> {
        let prompt = match &req.prompt {
            Prompt::Text(t) => self
                .tokenizer
                .encode(t, true, true)
                .map_err(|e| ApiError::invalid(format!("cannot tokenize the prompt: {e}")))?,
            Prompt::Chat(messages, content) => {
                let template = self
                    .template
                    .as_ref()
                    .map_err(|e| ApiError::new(Code::UnsupportedModel, e.clone()))?;
                // The CLI's `run --chat` tokenizes through the same function.
                template
                    .encode(&self.tokenizer, messages, true, *content)
                    .map_err(|e| match e {
                        TemplateError::SpecialTokenInRole { .. }
                        | TemplateError::UntrackedContent(_)
                        | TemplateError::Tokenizer(_) => ApiError::invalid(e.to_string()),
                        _ => ApiError::invalid(format!("cannot render the chat template: {e}")),
                    })?
            }
        };
        if prompt.is_empty() {
            return Err(ApiError::invalid("the prompt tokenizes to nothing"));
        }
        let cfg = &self.decoder.config;
        let room = cfg.n_ctx_train.saturating_sub(prompt.len());
        let max_tokens = req
            .max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS.min(room))
            .max(1);
        // The context rule the CLI applies too.
        let n_ctx = cfg
            .context_size(prompt.len() + max_tokens, None)
            .map_err(|e| {
                ApiError::invalid(format!(
                    "the prompt ({} tokens) plus max_tokens ({max_tokens}): {e}; shorten the \
                     prompt or lower max_tokens",
                    prompt.len()
                ))
            })?;

        let mut text = TextStream::new(&self.tokenizer, req.stop.clone());
        let mut stopped = false;
        let mut aborted = false;
        let mut failure = None;
        let mut on_token = |t: u32| {
            let (emit, hit) = match text.push(t) {
                Ok(p) => p,
                Err(e) => {
                    failure = Some(ApiError::new(
                        Code::Generation,
                        format!("cannot decode token {t}: {e}"),
                    ));
                    return false;
                }
            };
            stopped = hit;
            if !emit.is_empty() && !on_text(&emit) {
                aborted = true;
                return false;
            }
            !hit
        };
        let is_eog = |t| self.tokenizer.is_eog(t);
        let mut usage = Usage::default();
        if !self.warmed.replace(true) {
            let t = web_time::Instant::now();
            self.decoder.warm_up().await.map_err(ApiError::generation)?;
            self.drafter.warm_up().await.map_err(ApiError::generation)?;
            usage.warmup_seconds = t.elapsed().as_secs_f64();
        }
        let mut state = self
            .decoder
            .try_new_state(n_ctx, MAX_BATCH)
            .map_err(ApiError::generation)?;
        let mut sampler = Sampler::new(req.sampling.clone());
        let drafter = match req.speculative {
            Some(false) => None,
            _ => self
                .drafter
                .for_sequence(self.decoder.config.n_vocab, n_ctx, MAX_BATCH)
                .map_err(|e| ApiError::model("drafter", e))?,
        };
        if req.speculative == Some(true) && drafter.is_none() {
            return Err(ApiError::invalid(
                "speculative: true needs a drafter; load the engine with one (or \"ngram\")",
            ));
        }
        let reason = match drafter {
            None => {
                let (tokens, reason, st) = generate(
                    &self.decoder,
                    &mut state,
                    &prompt,
                    max_tokens,
                    &mut sampler,
                    &is_eog,
                    &mut on_token,
                )
                .await
                .map_err(ApiError::generation)?;
                usage.completion_tokens = st.generated_tokens;
                usage.prefill_seconds = st.prefill_seconds;
                usage.decode_seconds = st.decode_seconds;
                usage.prefill_tokens_per_second = st.prefill_tokens_per_second();
                usage.decode_tokens_per_second = st.decode_tokens_per_second();
                usage.looping = ends_in_a_loop(&tokens);
                reason
            }
            Some(mut drafter) => {
                let mut policy = DraftPolicy::new(PolicyConfig {
                    n_max: req.draft_max,
                    ..PolicyConfig::default()
                });
                let (tokens, reason, st) = generate_speculative(
                    &self.decoder,
                    &mut state,
                    drafter.as_mut(),
                    &mut policy,
                    &prompt,
                    max_tokens,
                    &mut sampler,
                    &is_eog,
                    &mut on_token,
                    &mut |_| {},
                )
                .await
                .map_err(ApiError::generation)?;
                usage.completion_tokens = st.generated_tokens;
                usage.prefill_seconds = st.prefill_seconds;
                usage.decode_seconds = st.decode_seconds;
                usage.prefill_tokens_per_second = if st.prefill_seconds > 0.0 {
                    st.prompt_tokens as f64 / st.prefill_seconds
                } else {
                    0.0
                };
                usage.decode_tokens_per_second = st.decode_tokens_per_second();
                usage.looping = ends_in_a_loop(&tokens);
                usage.speculative = Some(SpeculativeUsage {
                    drafter: st.drafter.clone(),
                    rounds: st.rounds,
                    drafted: st.drafted,
                    accepted: st.accepted,
                    acceptance_rate: st.acceptance_rate(),
                    tau: st.tau(),
                });
                reason
            }
        };
        if let Some(e) = failure {
            return Err(e);
        }
        if !stopped && !aborted {
            let tail = text.finish();
            if !tail.is_empty() {
                on_text(&tail);
            }
        }
        usage.prompt_tokens = prompt.len();
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
        usage.finish_reason = match reason {
            _ if aborted => "abort",
            StopReason::Length => "length",
            StopReason::EndOfGeneration | StopReason::Caller => "stop",
        };
        Ok(usage)
    }
}

/// The drafter a model is loaded with.
pub enum DrafterSource {
    None,
    Ngram,
    Gguf(GgufFile),
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdraft_core::model::StreamingLoad;
    use blockdraft_core::testing::{block_on, real_model};
    use blockdraft_cpu::CpuBackend;

    /// The browser's session on SmolLM2 with the shipped DFlash drafter:
    /// the drafter's weights load with the model, and requests upload
    /// none (each gets only its own caches), yet the drafter runs and its
    /// greedy text is the plain one.
    #[test]
    fn requests_upload_no_weights() {
        let Some(path) = real_model("smollm2-135m-instruct-q4_1.gguf") else {
            return;
        };
        let drafter = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../drafters/smollm2-dflash.gguf"
        );
        let backend = Arc::new(CpuBackend::new(2));
        let mut load = StreamingLoad::new(backend.clone());
        load.begin_part(None).unwrap();
        load.push(&std::fs::read(path).unwrap()).unwrap();
        load.end_part().unwrap();
        let model = load.finish().unwrap();
        let drafter = GgufFile::open(std::path::Path::new(drafter)).unwrap();
        let session = Session::load(
            backend.clone(),
            model,
            DrafterSource::Gguf(drafter),
            KvType::F16,
        )
        .unwrap();
        let loaded = backend.weight_bytes_loaded();
        let text = |json: &str| {
            let req = Request::from_json(json).unwrap();
            let mut out = String::new();
            let usage = block_on(session.generate(&req, &mut |t| {
                out.push_str(t);
                true
            }))
            .unwrap();
            (out, usage)
        };
        let ask = r#"{"messages":[{"role":"user","content":"Name three rivers."}],"max_tokens":24,"temperature":0"#;
        let (plain, _) = text(&format!(r#"{ask},"speculative":false}}"#));
        for _ in 0..2 {
            let (spec, usage) = text(&format!("{ask}}}"));
            assert_eq!(spec, plain);
            assert_eq!(usage.speculative.unwrap().drafter, "dflash");
        }
        assert_eq!(
            backend.weight_bytes_loaded(),
            loaded,
            "requests upload no weights"
        );
    }
}
