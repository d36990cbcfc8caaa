//! Chat templates: rendering a conversation into the prompt text a model was
//! trained on, from the Jinja template stored in `tokenizer.chat_template`.
//!
//! Templates come from model files and are untrusted. They are rendered by
//! [`minijinja`] in a sandbox: no loader (no `include`/`import` of files), a
//! fuel budget that stops runaway loops and allocations, a recursion limit,
//! and a cap on the output size. Every failure is a [`TemplateError`]; a
//! template never panics the caller.
//!
//! What templates see, as in Hugging Face's `apply_chat_template`:
//! `messages` (a list of `{role, content}`), `add_generation_prompt`,
//! `bos_token`, `eos_token`, `tools` (none), `raise_exception(msg)`,
//! `strftime_now(fmt)`, Python string/dict/list methods (`.strip()`,
//! `.startswith()`, `.items()`...) and Jinja's `loop` variables. Blocks are
//! rendered with `trim_blocks` and `lstrip_blocks`, like transformers does.
//!
//! Models without a template (base models such as Gemma 3 270M) give
//! `Ok(None)` from [`ChatTemplate::from_gguf`]; callers should then feed the
//! user's text as plain text (encoded with BOS as the model asks), with no
//! role markup.

use std::io;

use blockdraft_gguf::{GgufError, GgufFile, Metadata};
use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, ErrorKind, Value};

/// The metadata key holding the template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Default fuel: roughly this many template instructions per render.
pub const DEFAULT_FUEL: u64 = 2_000_000;
/// Default nesting limit for macros, loops and includes.
pub const DEFAULT_RECURSION_LIMIT: usize = 64;
/// Default cap on the rendered prompt, in bytes.
pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

const TEMPLATE_NAME: &str = "chat_template";

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The model has no `tokenizer.chat_template`.
    #[error("the model has no chat template ({CHAT_TEMPLATE_KEY})")]
    Missing,
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// The template ran out of fuel (a runaway loop or allocation).
    #[error("chat template exceeded its fuel budget of {0} (runaway template?)")]
    OutOfFuel(u64),
    /// The template nested deeper than the recursion limit.
    #[error("chat template exceeded the recursion limit of {0}")]
    RecursionLimit(usize),
    /// The rendered text grew past the output cap.
    #[error("chat template output exceeded {0} bytes")]
    OutputTooLarge(usize),
    /// Any other runtime error (unknown filter, bad operation...).
    #[error("chat template error: {0}")]
    Render(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Limits applied to every render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    pub fuel: u64,
    pub recursion_limit: usize,
    pub max_output: usize,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        TemplateLimits {
            fuel: DEFAULT_FUEL,
            recursion_limit: DEFAULT_RECURSION_LIMIT,
            max_output: DEFAULT_MAX_OUTPUT,
        }
    }
}

/// A compiled chat template with the special-token strings it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    limits: TemplateLimits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Reads `tokenizer.chat_template` and the BOS/EOS token texts from a
    /// GGUF file; `Ok(None)` when the model has no template.
    pub fn from_gguf(file: &GgufFile) -> Result<Option<ChatTemplate>, TemplateError> {
        Self::from_metadata(file.metadata())
    }

    /// Like [`ChatTemplate::from_gguf`], from metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Option<ChatTemplate>, TemplateError> {
        let Some(source) = md.opt_str(CHAT_TEMPLATE_KEY)? else {
            return Ok(None);
        };
        let token = |key: &str| -> Result<String, TemplateError> {
            let Some(id) = md.opt_u32(key)? else {
                return Ok(String::new());
            };
            let Some(tokens) = md.opt_str_array("tokenizer.ggml.tokens")? else {
                return Ok(String::new());
            };
            Ok(tokens
                .get(id as usize)
                .map(|s| s.to_string())
                .unwrap_or_default())
        };
        let bos = token("tokenizer.ggml.bos_token_id")?;
        let eos = token("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos).map(Some)
    }

    /// Compiles `source` with the default [`TemplateLimits`].
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        Self::with_limits(source, bos_token, eos_token, TemplateLimits::default())
    }

    /// Compiles `source` with explicit limits.
    pub fn with_limits(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
        limits: TemplateLimits,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        // Same whitespace handling as transformers' apply_chat_template.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion_limit);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(|e| map_error(e, &limits))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            limits,
        })
    }

    /// Renders the conversation. With `add_generation_prompt`, the text ends
    /// with the header of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        let ctx = context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => Value::from(()),
        };
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| map_error(e, &self.limits))?;
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: self.limits.max_output,
            overflow: false,
        };
        let res = tmpl.render_captured_to(ctx, &mut out);
        if out.overflow {
            return Err(TemplateError::OutputTooLarge(self.limits.max_output));
        }
        res.map_err(|e| map_error(e, &self.limits))?;
        String::from_utf8(out.buf).map_err(|e| TemplateError::Render(e.to_string()))
    }

    /// The BOS token text given to the template.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token text given to the template.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// Output sink that refuses to grow past `cap` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    overflow: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            self.overflow = true;
            return Err(io::Error::other("chat template output too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{msg}"),
    ))
}

fn map_error(e: minijinja::Error, limits: &TemplateLimits) -> TemplateError {
    let detail = e.detail().unwrap_or("").to_owned();
    match e.kind() {
        ErrorKind::SyntaxError | ErrorKind::BadEscape | ErrorKind::InvalidDelimiter => {
            TemplateError::Syntax(e.to_string())
        }
        ErrorKind::OutOfFuel => TemplateError::OutOfFuel(limits.fuel),
        ErrorKind::WriteFailure => TemplateError::OutputTooLarge(limits.max_output),
        ErrorKind::InvalidOperation if detail.starts_with(RAISED_PREFIX) => {
            TemplateError::Raised(detail[RAISED_PREFIX.len()..].to_owned())
        }
        ErrorKind::InvalidOperation if detail.contains("recursion limit") => {
            TemplateError::RecursionLimit(limits.recursion_limit)
        }
        _ => TemplateError::Render(e.to_string()),
    }
}

/// `strftime_now(format)`: the current UTC date/time. Supports `%d %m %Y %y
/// %b %B %H %M %S %j %%`; other directives are copied as written.
fn strftime_now(format: String) -> String {
    let secs = now_unix_secs();
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let doy = days - days_from_civil(y, 1, 1) + 1;
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{doy:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
fn now_unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// wasm32-unknown-unknown has no clock in std; templates get a fixed date
/// (26 Jul 2024, the default Llama 3 templates use themselves).
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
fn now_unix_secs() -> i64 {
    1_721_952_000
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) -> days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let s = t.render(&[ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn pycompat_loop_and_raise() {
        let src = "{% for m in messages %}{% if m.role not in ['user','assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{{ loop.index }}:{{ m.content.strip().upper() }}{{ '|' if not loop.last }}{% if m.content.startswith(' ') %}*{% endif %}{% endfor %}{{ bos_token }}{{ eos_token }}{% if tools %}T{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let s = t
            .render(
                &[ChatMessage::user(" a "), ChatMessage::assistant("b")],
                false,
            )
            .unwrap();
        assert_eq!(s, "1:A|*2:B<s></s>");
        let e = t.render(&[ChatMessage::system("x")], false).unwrap_err();
        assert!(
            matches!(e, TemplateError::Raised(ref m) if m == "bad role system"),
            "{e:?}"
        );
    }

    #[test]
    fn hostile_templates_fail_cleanly() {
        assert!(matches!(
            ChatTemplate::new("{% for x in messages %}", "", ""),
            Err(TemplateError::Syntax(_))
        ));
        assert!(matches!(
            ChatTemplate::new("{{ 1 + }}", "", ""),
            Err(TemplateError::Syntax(_))
        ));
        // Nested loops far past the fuel budget.
        let t = ChatTemplate::new(
            "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], false).unwrap_err();
        assert!(
            matches!(
                e,
                TemplateError::OutOfFuel(_) | TemplateError::OutputTooLarge(_)
            ),
            "{e:?}"
        );
        // Unbounded recursion.
        let t = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], false).unwrap_err();
        assert!(
            matches!(
                e,
                TemplateError::RecursionLimit(_) | TemplateError::OutOfFuel(_)
            ),
            "{e:?}"
        );
        // Huge output from one expression.
        let t = ChatTemplate::new("{{ 'x' * 1000000000 }}", "", "").unwrap();
        let e = t.render(&[], false).unwrap_err();
        assert!(
            matches!(
                e,
                TemplateError::OutOfFuel(_) | TemplateError::OutputTooLarge(_)
            ),
            "{e:?}"
        );
        // Output cap with a generous fuel budget.
        let limits = TemplateLimits {
            fuel: u64::MAX / 2,
            recursion_limit: 16,
            max_output: 1000,
        };
        let t = ChatTemplate::with_limits(
            "{% for a in range(10000) %}xxxxxxxxxx{% endfor %}",
            "",
            "",
            limits,
        )
        .unwrap();
        assert!(matches!(
            t.render(&[], false),
            Err(TemplateError::OutputTooLarge(1000))
        ));
        // No loader: includes fail.
        let t = ChatTemplate::new("{% include '/etc/passwd' %}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_930), (2024, 7, 26));
        assert_eq!(days_from_civil(2024, 7, 26), 19_930);
        let s = strftime_now("%d %b %Y".into());
        assert_eq!(s.len(), 11, "{s}");
    }
}
