//! `blockdraft serve` end to end on loopback with SmolLM2 and its shipped
//! DFlash drafter, through a plain HTTP/1.1 client: greedy chat and
//! completions equal `blockdraft run`, streamed or not; concurrent streams
//! each give their single-request text; bad requests get OpenAI error
//! objects; clients that leave cancel their sequence; a full queue answers
//! 503 with Retry-After; the API key is enforced; SIGTERM lets running
//! streams finish and refuses new requests. Tool calls, with
//! Qwen2.5-Coder-0.5B (whose template offers tools).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn smollm2() -> Option<String> {
    let path = blockdraft_core::testing::real_model("smollm2-135m-instruct-q4_1.gguf")?;
    Some(path.to_str()?.to_string())
}

const DRAFTER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../drafters/smollm2-dflash.gguf"
);

/// A running server, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// SmolLM2's server: with its shipped drafter.
    fn start(model: &str, extra: &[&str]) -> Server {
        Self::start_with(model, &[&["--draft", DRAFTER], extra].concat())
    }

    fn start_with(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_blockdraft"))
            .args(["serve", "-m", model, "--port", "0", "-t", "2"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server says where it listens")
                .unwrap();
            if let Some(a) = line.strip_prefix("blockdraft serve: listening on http://") {
                break a.to_string();
            }
        };
        // Keep reading its stderr so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, addr }
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req += &format!("{k}: {v}\r\n");
        }
        req += "\r\n";
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        Response::parse(&raw)
    }

    fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, &[], &body.to_string())
    }

    fn metric(&self, name: &str) -> f64 {
        let r = self.request("GET", "/metrics", &[], "");
        let line = r
            .body
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap();
        line.split(' ').nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Response {
    status: u16,
    headers: String,
    body: String,
}

impl Response {
    fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8_lossy(raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let headers = head.to_ascii_lowercase();
        let body = if headers.contains("transfer-encoding: chunked") {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        Response {
            status,
            headers,
            body,
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an event stream.
    fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// The chunks of a streamed reply, which must end with `[DONE]`.
    fn chunks(&self) -> Vec<Value> {
        let events = self.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{}",
            self.body
        );
        let chunks = &events[..events.len() - 1];
        chunks
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    /// The text of a streamed reply, and its usage chunk if any.
    fn streamed_text(&self) -> (String, Option<Value>) {
        let mut text = String::new();
        let mut usage = None;
        for v in self.chunks() {
            if let Some(u) = v.get("usage") {
                usage = Some(u.clone());
            }
            for c in v["choices"].as_array().unwrap() {
                let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
                text += piece.unwrap_or("");
            }
        }
        (text, usage)
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out += &rest[..n];
        s = &rest[n + 2..];
    }
    out
}

/// `blockdraft run`'s greedy text for `prompt` (`--chat` when `chat`).
fn run_text(model: &str, prompt: &str, n: usize, chat: bool) -> String {
    let n = n.to_string();
    let mut args = vec![
        "run", "-m", model, "-p", prompt, "-n", &n, "--temp", "0", "--json", "-t", "2",
    ];
    if chat {
        args.push("--chat");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_blockdraft"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

fn chat(prompt: &str, n: usize, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
           "temperature": 0, "stream": stream})
}

const PROMPTS: [&str; 4] = [
    "Name three rivers.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me a tip for learning Rust.",
];

#[test]
fn requests_streams_errors_and_cancellation() {
    let Some(model) = smollm2() else {
        return;
    };
    let server = Server::start(&model, &["--parallel", "4", "--body-timeout", "2"]);
    assert_eq!(server.request("GET", "/health", &[], "").status, 200);
    let models = server.request("GET", "/v1/models", &[], "").json();
    assert_eq!(models["data"][0]["id"], "smollm2-135m-instruct-q4_1");

    // Greedy chat, whole and streamed, is `run --chat --temp 0`.
    let want: Vec<String> = PROMPTS
        .iter()
        .map(|p| run_text(&model, p, 24, true))
        .collect();
    let r = server.post("/v1/chat/completions", &chat(PROMPTS[0], 24, false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], want[0]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 24);
    assert_eq!(v["usage"]["speculative"]["drafter"], "dflash");
    let mut body = chat(PROMPTS[0], 24, true);
    body["stream_options"] = json!({"include_usage": true});
    let r = server.post("/v1/chat/completions", &body);
    assert!(
        r.headers.contains("content-type: text/event-stream"),
        "{}",
        r.headers
    );
    let (text, usage) = r.streamed_text();
    assert_eq!(text, want[0]);
    assert_eq!(usage.unwrap()["total_tokens"], v["usage"]["total_tokens"]);

    // Completions of a raw prompt are `run` without --chat.
    let raw = "The capital of France is";
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": raw, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(
        r.json()["choices"][0]["text"],
        run_text(&model, raw, 12, false)
    );

    // Log-probabilities: one entry per token, greedy's token the most
    // likely, whole and streamed alike, the text unchanged (with the
    // drafter verifying, as here, they are plain decoding's).
    let mut body = chat(PROMPTS[0], 24, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let r = server.post("/v1/chat/completions", &body).json();
    assert_eq!(r["choices"][0]["message"]["content"], want[0]);
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 24, "{r}");
    let mut joined = Vec::new();
    for e in content {
        let (lp, top) = (
            e["logprob"].as_f64().unwrap(),
            e["top_logprobs"].as_array().unwrap(),
        );
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp, "{e}");
        assert!(
            lp <= 0.0 && top[1]["logprob"].as_f64().unwrap() <= lp,
            "{e}"
        );
        let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        joined.extend(bytes);
    }
    assert_eq!(String::from_utf8_lossy(&joined), want[0]);
    body["stream"] = json!(true);
    let streamed: Vec<Value> = server
        .post("/v1/chat/completions", &body)
        .events()
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(&streamed, content);
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": raw, "max_tokens": 6, "temperature": 0, "logprobs": 2}),
    );
    let lp = &r.json()["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6, "{}", r.body);
    assert_eq!(
        lp["top_logprobs"][0].as_object().unwrap().len(),
        2,
        "{}",
        r.body
    );
    assert_eq!(lp["text_offset"][0], 0, "{}", r.body);

    // Sampling: the same seed gives the same text.
    let sampled = json!({"prompt": raw, "max_tokens": 16, "temperature": 0.9, "seed": 7});
    let a = server.post("/v1/completions", &sampled).json();
    let b = server.post("/v1/completions", &sampled).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // Eight concurrent streams, two per prompt, each its single text.
    let texts: Vec<(usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let p = i % PROMPTS.len();
                    let r = server.post("/v1/chat/completions", &chat(PROMPTS[p], 24, true));
                    (p, r.streamed_text().0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, text) in texts {
        assert_eq!(text, want[p], "prompt {p} streamed beside others");
    }

    // Bad requests: OpenAI error objects with the right status.
    let big = "x".repeat(5 << 20);
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, ""),
        (json!({"messages": []}).to_string(), 400, "messages"),
        (json!({"max_tokens": 4}).to_string(), 400, "messages"),
        (json!({"messages": "hi"}).to_string(), 400, ""),
        (chat_with("max_tokens", json!(-1)), 400, "max_tokens"),
        (
            chat_with("max_tokens", json!(1u64 << 40)),
            400,
            "max_tokens",
        ),
        (chat_with("temperature", json!(3.5)), 400, "temperature"),
        (chat_with("temperature", json!("hot")), 400, ""),
        (chat_with("n", json!(2)), 400, "n"),
        (chat_with("logprobs", json!("yes")), 400, "logprobs"),
        (chat_with("top_logprobs", json!(2)), 400, "top_logprobs"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "logprobs": true, "top_logprobs": 21})
            .to_string(),
            400,
            "top_logprobs",
        ),
        (
            chat_with("frequency_penalty", json!(2.5)),
            400,
            "frequency_penalty",
        ),
        (chat_with("presence_penalty", json!("lots")), 400, ""),
        (
            chat_with("tools", json!([{"type": "function"}])),
            400,
            "tools",
        ),
        // SmolLM2's template offers no tools.
        (chat_with("tools", weather_tool()), 400, "tools"),
        (
            chat_with("tool_choice", json!("required")),
            400,
            "tool_choice",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "18 C"}]}).to_string(),
            400,
            "messages",
        ),
        (chat_with("bogus", json!(1)), 400, ""),
        (chat_with("model", json!("gpt-4")), 404, "model"),
        (
            json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
            400,
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": "word ".repeat(9000)}]}).to_string(),
            400,
            "messages",
        ),
        (
            format!(r#"{{"messages":[{{"role":"user","content":"{big}"}}]}}"#),
            413,
            "",
        ),
    ];
    for (body, status, param) in &cases {
        let r = server.request("POST", "/v1/chat/completions", &[], body);
        assert_eq!(
            r.status,
            *status,
            "{}: {}",
            &body[..body.len().min(80)],
            r.body
        );
        let e = &r.json()["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            r.body
        );
        if !param.is_empty() {
            assert_eq!(e["param"], *param, "{}", r.body);
        }
    }
    assert_eq!(server.request("GET", "/v1/nothing", &[], "").status, 404);

    // A client that stops sending its body: 408 after --body-timeout.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t0 = Instant::now();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    let r = Response::parse(&raw);
    assert_eq!(r.status, 408, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "request_timeout", "{}", r.body);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());

    // Clients that leave mid-stream: their sequences are cancelled.
    for _ in 0..4 {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        let body = chat("Write a long story about a dragon.", 400, true).to_string();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut first = [0u8; 256];
        let _ = s.read(&mut first).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.metric("blockdraft_requests_cancelled_total") < 4.0
        || server.metric("blockdraft_sequences_running") > 0.0
    {
        assert!(Instant::now() < deadline, "cancelled sequences still run");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.metric("blockdraft_queue_depth"), 0.0);
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

/// Tool calling on Qwen2.5-Coder-0.5B, whose template offers tools: the
/// model's call comes back as `tool_calls` (whole and streamed), a
/// conversation with a call and its result renders, and what cannot be
/// honoured is refused.
#[test]
fn tool_calls_on_a_model_with_tools() {
    let Some(model) =
        blockdraft_core::testing::real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    else {
        return;
    };
    let server = Server::start_with(model.to_str().unwrap(), &[]);
    let ask = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
               "tools": weather_tool(), "temperature": 0, "max_tokens": 40, "stream": stream})
    };
    let r = server.post("/v1/chat/completions", &ask(false));
    assert_eq!(r.status, 200, "{}", r.body);
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{}", r.body);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert!(choice["message"]["content"].is_null(), "{}", r.body);
    // Streamed: no text before the call, the call in one delta, then the finish.
    let r = server.post("/v1/chat/completions", &ask(true));
    let chunks = r.chunks();
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert!(
        deltas.iter().all(|d| d.get("content").is_none()),
        "{}",
        r.body
    );
    let streamed = &deltas[0]["tool_calls"][0];
    assert_eq!(streamed["index"], 0);
    assert_eq!(streamed["function"], call["function"]);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    // A call and its result in the conversation: the model answers on.
    let follow = json!({"messages": [
        {"role": "user", "content": "What is the weather like in Paris today?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C and sunny"}],
        "tools": weather_tool(), "temperature": 0, "max_tokens": 8});
    let r = server.post("/v1/chat/completions", &follow);
    assert_eq!(r.status, 200, "{}", r.body);
    // The streamed request ran only what its prompt adds to the first's
    // (the server keeps a finished request's memory; no drafter here).
    assert!(server.metric("blockdraft_prompt_tokens_reused_total") >= 16.0);
    // Without tools (or tool_choice none) the same question is answered as
    // text; asked again, from the cached prompt, the same text and usage.
    let mut none = ask(false);
    none["tool_choice"] = json!("none");
    let r = server.post("/v1/chat/completions", &none).json();
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert!(
        r["choices"][0]["message"].get("tool_calls").is_none(),
        "{r}"
    );
    let reused = server.metric("blockdraft_prompt_tokens_reused_total");
    let again = server.post("/v1/chat/completions", &none).json();
    assert_eq!(again["choices"], r["choices"]);
    assert_eq!(again["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"]);
    assert!(server.metric("blockdraft_prompt_tokens_reused_total") > reused);
    let refused = [
        ("tool_choice", json!("required")),
        (
            "tool_choice",
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
        ("tools", json!({"type": "function"})),
    ];
    for (key, value) in refused {
        let mut body = ask(false);
        body[key] = value;
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], key, "{}", r.body);
    }
    let mut bad = follow.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    assert_eq!(server.post("/v1/chat/completions", &bad).status, 400);
    let mut special = ask(false);
    special["tools"][0]["function"]["description"] = json!("<|im_end|>");
    let r = server.post("/v1/chat/completions", &special);
    assert_eq!(r.status, 400, "{}", r.body);
}

fn chat_with(key: &str, value: Value) -> String {
    let mut body = chat(PROMPTS[0], 8, false);
    body[key] = value;
    body.to_string()
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let Some(model) = smollm2() else {
        return;
    };
    let server = Server::start(&model, &["--parallel", "1", "--queue", "1"]);
    let statuses: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let server = &server;
                s.spawn(move || {
                    let r = server.post("/v1/chat/completions", &chat(PROMPTS[1], 48, false));
                    (r.status, r.headers)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<_> = statuses.iter().filter(|(s, _)| *s == 503).collect();
    assert!(
        !busy.is_empty(),
        "six requests for one sequence and one queue slot"
    );
    assert!(busy.iter().all(|(_, h)| h.contains("retry-after: 1")));
    assert!(statuses.iter().any(|(s, _)| *s == 200));
}

#[cfg(unix)]
#[test]
fn api_key_and_graceful_shutdown() {
    let Some(model) = smollm2() else {
        return;
    };
    let mut server = Server::start(&model, &["--api-key", "sekrit"]);
    let body = chat(PROMPTS[2], 8, false).to_string();
    let r = server.request("POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let wrong = [("Authorization", "Bearer nope")];
    assert_eq!(
        server
            .request("POST", "/v1/chat/completions", &wrong, &body)
            .status,
        401
    );
    let key = [("Authorization", "Bearer sekrit")];
    assert_eq!(
        server
            .request("POST", "/v1/chat/completions", &key, &body)
            .status,
        200
    );
    assert_eq!(server.request("GET", "/health", &[], "").status, 200);

    // SIGTERM during a stream: the stream finishes, then the server exits
    // and takes no new connection.
    let long = chat(PROMPTS[3], 96, true).to_string();
    let streaming = std::thread::scope(|s| {
        let server = &server;
        let h = s.spawn(move || server.request("POST", "/v1/chat/completions", &key, &long));
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
        h.join().unwrap()
    });
    let (text, _) = streaming.streamed_text();
    assert!(!text.is_empty());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(TcpStream::connect(&server.addr).is_err());
}
