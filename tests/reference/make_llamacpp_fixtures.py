#!/usr/bin/env python3
"""Produce llama.cpp reference fixtures (tokenization + greedy traces).

Runs an ALREADY-BUILT llama.cpp `llama-server` (CPU only), one model at a time,
and records through its HTTP API:

  tests/fixtures/llamacpp/tokenize-<model>.json
      token ids from POST /tokenize for a varied set of texts, for every
      combination of add_special / parse_special.
  tests/fixtures/llamacpp/greedy-<model>.json
      greedy (temperature 0) continuations of N tokens from POST /completion,
      prompts given as token ids, with the raw (pre-sampling) top-k log-probs
      of the model's distribution at each generated position.

Usage:
  python3 tests/reference/make_llamacpp_fixtures.py BIN_DIR MODELS_DIR \
      [--out tests/fixtures/llamacpp] [--models smollm2,qwen05,qwen15,gemma] \
      [--only tokenize|greedy] [--n-predict 64] [--n-probs 5] [--config precise|default]

BIN_DIR is the llama.cpp build's bin dir (holding llama-server), MODELS_DIR the
dir filled by tests/fetch_models.sh. Only the Python standard library is used.
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODELS = {
    # key: (file name, sha256, is a chat/instruct model)
    "smollm2": ("smollm2-135m-instruct-q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", True),
    "qwen05": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", True),
    "qwen15": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", True),
    "gemma": ("gemma-3-270m-q4_k_m.gguf",
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", False),
}

# Texts for tokenization. Keep stable: fixtures are compared case by case.
TOKENIZE_TEXTS = [
    "",
    " ",
    "\n",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "   leading three spaces",
    "trailing spaces   ",
    "  both sides  ",
    "a  b   c    d\t\te\n\n\nf \t \n g",
    "   \t\n  ",
    "\r\nWindows line endings\r\nsecond line\r\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "<div class=\"x\"><p>Hello &amp; goodbye</p></div>",
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
    "1234567890 3.14159 2026-11-29 1,000,000 -42 0x1F 1e-6",
    "12345678901234567890123456789012345678901234567890",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "안녕하세요 세계",
    "I love 🦀 and 🐍! 👍🏽👍",
    "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, 🇫🇷🇯🇵, 🧑🏻‍💻",
    "Café, naïve, résumé, Ångström, Œuvre, straße, Øresund",
    "e\u0301 vs \u00e9; a\u0308 vs \u00e4; n\u0303; Z\u0351\u0363a\u0338lgo",
    "https://example.com/path/to/page?query=1&lang=en#section and user@example.org",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>Text after endoftext<|endoftext|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hello<eos>",
    "<|im_start|>",
    "<|im_start broken <start_of_turn <|endoftext",
    "English русский ελληνικά العربية עברית हिन्दी ไทย 中文",
    "I'm sure you don't know what they'll say; we've been there, it's Bob's, y'all'd've.",
    "I'M SURE YOU DON'T; HE'S; WE'LL; THEY'RE",
    "\u201cQuoted\u201d \u2018single\u2019 \u2014 em dash \u2013 en dash \u2026 \u00abguillemets\u00bb \u00bfQu\u00e9? \u00a1S\u00ed! \u3001\u3002",
    "\u2200x \u2208 \u211d: x\u00b2 \u2265 0, \u2211\u1d62 a\u1d62 \u2260 \u221e, \u221a2 \u2248 1.414",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 \U00013000 \ua66e \u200b zero\u200bwidth \ufeffbom",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!???? ============ ----",
    "HELLO WORLD ALL CAPS, CamelCaseIdentifier snake_case_identifier kebab-case __dunder__",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. "
    "The Apollo 11 mission launched from Kennedy Space Center on July 16 and "
    "returned safely to Earth eight days later, splashing down in the Pacific Ocean.",
]

CHAT_USER = "Write a haiku about the ocean."


def greedy_prompts(is_chat):
    """(name, text or messages) pairs. Chat prompts are rendered later."""
    p = [
        ("story", "Once upon a time, in a small village by the sea, there lived"),
        ("code", "def fibonacci(n):"),
        ("factual", "Question: What is the capital of France?\nAnswer:"),
        ("list", "The first ten prime numbers are"),
    ]
    if is_chat:
        p.append(("chat", [{"role": "user", "content": CHAT_USER}]))
    else:
        # Gemma 3 base has no chat template in its GGUF; use Gemma's turn format
        # as raw text (the turn markers are real special tokens in its vocab).
        p.append(("chat", "<start_of_turn>user\n" + CHAT_USER + "<end_of_turn>\n<start_of_turn>model\n"))
    return p


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def llama_commit(bin_dir):
    """Commit of the llama.cpp checkout that holds bin_dir (build/bin), if any."""
    d = os.path.abspath(bin_dir)
    for _ in range(4):
        if os.path.exists(os.path.join(d, ".git")):
            try:
                return subprocess.check_output(["git", "-C", d, "rev-parse", "HEAD"], text=True,
                                               stderr=subprocess.DEVNULL).strip()
            except (OSError, subprocess.CalledProcessError):
                break
        d = os.path.dirname(d)
    return None


def llama_version(server_bin):
    try:
        out = subprocess.run([server_bin, "--version"], capture_output=True, text=True, timeout=60)
        for line in (out.stdout + out.stderr).splitlines():
            if line.startswith("version:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


# The precise configuration: flash attention's f16 internals and an f16 KV
# cache move top-1 log-probs by 0.3-0.7 on average on SmolLM2 (measured),
# which would make llama.cpp a noisy reference. The default one is what a
# user running `llama-server -m MODEL` gets (flash attention "auto", on for
# the CPU, and an f16 KV cache); its traces are `greedy-<model>-default.json`.
CONFIGS = {
    "precise": ["-fa", "off", "-ctk", "f32", "-ctv", "f32"],
    "default": [],
}


class Server:
    def __init__(self, server_bin, model_path, threads, ctx, log_path, config="precise"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Arguments after the model path / port are what the fixtures record.
        self.flags = ["--temp", "0", "-c", str(ctx), "-t", str(threads), "-ngl", "0",
                      "-np", "1", "--no-warmup", "-cram", "0"] + CONFIGS[config]
        self.argv = [server_bin, "-m", model_path, "--host", "127.0.0.1", "--port", str(self.port)] + self.flags
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)

    def recorded_command(self, model_file):
        return " ".join(["llama-server", "-m", "$MODELS/" + model_file, "--host", "127.0.0.1",
                         "--port", "$PORT"] + self.flags)

    def wait_ready(self, timeout=600):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError("llama-server did not become ready")

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=600) as r:
            return json.loads(r.read().decode("utf-8"))

    def post(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                return json.loads(r.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST {path} -> {e.code}: {e.read().decode('utf-8', 'replace')}") from None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def tokenize(srv, text, add_special, parse_special):
    r = srv.post("/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special})
    return r["tokens"]


def detokenize(srv, ids):
    return srv.post("/detokenize", {"tokens": ids})["content"]


def header(key, srv, meta, props):
    fname, sha, _ = MODELS[key]
    return {
        "model": fname,
        "sha256": sha,
        "llama_cpp_commit": meta["commit"],
        "llama_cpp_version": meta["version"],
        "server_command": srv.recorded_command(fname),
        "n_vocab": meta["n_vocab"],
        "add_bos": meta["add_bos"],
    }


def model_meta(srv):
    props = srv.get("/props")
    models = srv.get("/v1/models")
    n_vocab = None
    try:
        n_vocab = models["data"][0]["meta"]["n_vocab"]
    except (KeyError, IndexError, TypeError):
        pass
    # add_bos as llama.cpp applies it: tokenize "" with add_special.
    return props, n_vocab


def make_tokenize(key, srv, meta):
    cases = []
    n_vocab = meta["n_vocab"]
    for text in TOKENIZE_TEXTS:
        for add_special in (True, False):
            for parse_special in (True, False):
                ids = tokenize(srv, text, add_special, parse_special)
                assert all(isinstance(i, int) and 0 <= i < n_vocab for i in ids), (key, text, ids)
                cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                              "ids": ids})
        # Sanity: without special tokens added, detokenizing gives the text back
        # for most tokenizers; report (not fail) mismatches.
        ids = tokenize(srv, text, False, False)
        back = detokenize(srv, ids)
        if back != text:
            print(f"  [{key}] note: detokenize(tokenize({text[:40]!r})) = {back[:40]!r}", file=sys.stderr)
    return cases


def make_greedy(key, srv, meta, n_predict, n_probs):
    fname, sha, is_chat = MODELS[key]
    n_vocab = meta["n_vocab"]
    out = []
    for name, prompt in greedy_prompts(is_chat):
        if isinstance(prompt, list):
            text = srv.post("/apply-template", {"messages": prompt})["prompt"]
            kind = "chat_template"
        else:
            text = prompt
            kind = "raw"
        # add_special=True adds BOS exactly when the model's add_bos says so;
        # parse_special=True so chat markers become their special tokens.
        prompt_ids = tokenize(srv, text, True, True)
        body = {
            "prompt": prompt_ids,
            "n_predict": n_predict,
            "temperature": 0,
            "n_probs": n_probs,
            "post_sampling_probs": False,
            "return_tokens": True,
            "cache_prompt": False,
            "stream": False,
        }
        r = srv.post("/completion", body)
        ignore_eos = False
        if len(r.get("tokens", [])) < n_predict:
            print(f"  [{key}] {name}: stopped after {len(r.get('tokens', []))} tokens "
                  f"({r.get('stop_type')}); rerunning with ignore_eos", file=sys.stderr)
            body["ignore_eos"] = True
            ignore_eos = True
            r = srv.post("/completion", body)
        toks = r["tokens"]
        probs = r["completion_probabilities"]
        assert len(toks) == n_predict, (key, name, len(toks))
        assert len(probs) == n_predict, (key, name, len(probs))
        top = []
        logprobs = []
        mismatches = []
        for i, (t, p) in enumerate(zip(toks, probs)):
            assert p["id"] == t, (key, name, i, p["id"], t)
            assert 0 <= t < n_vocab
            entries = [[q["id"], q["logprob"]] for q in p["top_logprobs"]]
            assert len(entries) == n_probs, (key, name, i, entries)
            if entries[0][0] != t:
                mismatches.append(i)
            top.append(entries)
            logprobs.append(p["logprob"])
        if mismatches and not ignore_eos:
            print(f"  [{key}] {name}: WARNING greedy token != top-1 at positions {mismatches}", file=sys.stderr)
        out.append({
            "name": name,
            "prompt_kind": kind,
            "prompt_text": text,
            "prompt_tokens": prompt_ids,
            "ignore_eos": ignore_eos,
            "tokens": toks,
            "logprobs": logprobs,
            "top_logprobs": top,
            "text": detokenize(srv, toks),
            "top1_mismatch_positions": mismatches,
        })
        print(f"  [{key}] {name}: {detokenize(srv, toks)[:70]!r}", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin_dir")
    ap.add_argument("models_dir")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "fixtures", "llamacpp"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--only", choices=["tokenize", "greedy"])
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--n-probs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model files")
    ap.add_argument("--config", choices=list(CONFIGS), default="precise",
                    help="llama.cpp's precise configuration (f32 KV cache, no flash attention; "
                         "greedy-<model>.json) or its defaults (greedy-<model>-default.json, "
                         "greedy traces only)")
    ap.add_argument("--commit", help="the llama.cpp commit built, where the build dir is not in a "
                                      "git checkout (e.g. a `git archive` export)")
    args = ap.parse_args()
    if args.config == "default":
        args.only = "greedy"
    suffix = "" if args.config == "precise" else "-" + args.config

    server_bin = os.path.join(args.bin_dir, "llama-server")
    if not os.access(server_bin, os.X_OK):
        sys.exit(f"no llama-server in {args.bin_dir}")
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    commit = args.commit or llama_commit(args.bin_dir)
    version = llama_version(server_bin)

    for key in args.models.split(","):
        key = key.strip()
        fname, sha, _ = MODELS[key]
        path = os.path.join(args.models_dir, fname)
        if not os.path.exists(path):
            sys.exit(f"missing {path}; run tests/fetch_models.sh {key}")
        if not args.no_verify and sha256_file(path) != sha:
            sys.exit(f"sha256 mismatch for {path}")
        print(f"[{key}] starting llama-server on {fname}", file=sys.stderr)
        srv = Server(server_bin, path, args.threads, args.ctx, f"/tmp/llama-server-{key}.log",
                     args.config)
        try:
            srv.wait_ready()
            props, n_vocab = model_meta(srv)
            add_bos = len(tokenize(srv, "", True, False)) > 0
            meta = {"commit": commit, "version": version, "n_vocab": n_vocab, "add_bos": add_bos}
            assert n_vocab, "n_vocab not reported by /v1/models"
            if args.only in (None, "tokenize"):
                t0 = time.time()
                doc = header(key, srv, meta, props)
                doc["endpoint"] = "POST /tokenize {content, add_special, parse_special}"
                doc["cases"] = make_tokenize(key, srv, meta)
                write_json(os.path.join(out_dir, f"tokenize-{key}.json"), doc)
                print(f"[{key}] tokenize: {len(doc['cases'])} cases, {time.time() - t0:.1f}s", file=sys.stderr)
            if args.only in (None, "greedy"):
                t0 = time.time()
                doc = header(key, srv, meta, props)
                doc["endpoint"] = "POST /completion"
                doc["request"] = {"n_predict": args.n_predict, "temperature": 0, "n_probs": args.n_probs,
                                  "post_sampling_probs": False, "return_tokens": True,
                                  "cache_prompt": False, "prompt": "<prompt_tokens>"}
                doc["notes"] = ("top_logprobs[i] = top n_probs [id, logprob] of the raw (pre-sampling) "
                                "softmax of the logits that produced tokens[i], sorted by logit; "
                                "logprobs[i] = raw logprob of tokens[i]. Prompt = prompt_tokens as ids "
                                "(tokenized with add_special=true, parse_special=true). If ignore_eos is "
                                "true, EOG tokens were banned by logit bias (so tokens[i] may differ from "
                                "top-1 at those positions).")
                doc["prompts"] = make_greedy(key, srv, meta, args.n_predict, args.n_probs)
                write_json(os.path.join(out_dir, f"greedy-{key}{suffix}.json"), doc)
                print(f"[{key}] greedy: {time.time() - t0:.1f}s", file=sys.stderr)
        finally:
            srv.stop()


def write_json(path, doc):
    """Header fields one per line, then each case / prompt as one compact line:
    small, deterministic and diff-friendly. Plain JSON for any reader."""
    def one(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    lines = []
    items = list(doc.items())
    for n, (k, v) in enumerate(items):
        comma = "," if n + 1 < len(items) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f" {one(k)}: [")
            lines.extend(f"  {one(e)}" + ("," if j + 1 < len(v) else "") for j, e in enumerate(v))
            lines.append(" ]" + comma)
        else:
            lines.append(f" {one(k)}: {one(v)}{comma}")
    text = "{\n" + "\n".join(lines) + "\n}\n"
    json.loads(text)  # self-check
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    size = os.path.getsize(path)
    print(f"  wrote {path} ({size} bytes)", file=sys.stderr)
    if size > 300_000:
        print(f"  WARNING: {path} is over 300 KB", file=sys.stderr)


if __name__ == "__main__":
    main()
