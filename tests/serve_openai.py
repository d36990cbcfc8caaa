#!/usr/bin/env python3
"""`blockdraft serve` driven by the official `openai` client (PyPI), on
loopback with SmolLM2 and its shipped DFlash drafter:

- chat and completions, streamed and not: greedy text equals
  `blockdraft run --temp 0` for the same prompt; the same seed gives the same
  sampled text, with the drafter and without; presence and frequency
  penalties give `run`'s text with the same penalties; logprobs (one entry
  per token, greedy's the most likely, their bytes the text) change no token;
- load: 32 concurrent streaming clients x 3 requests each; every reply
  complete and equal to its single-request text; prints aggregate tokens/s
  and p50/p99 time to first token;
- 8 clients disconnect mid-stream while others run: the rest complete and
  the server's running-sequence count returns to zero.

Usage: serve_openai.py BLOCKDRAFT MODEL DRAFTER (tests/run.sh runs it).
"""
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from openai import OpenAI

BIN, MODEL, DRAFTER = sys.argv[1:4]
PROMPTS = [
    "Name three rivers.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me a tip for learning Rust.",
]


def run_text(prompt, n, chat=True, extra=()):
    args = [BIN, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "--json", "-t", "2", *extra]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["text"]


def start_server():
    proc = subprocess.Popen(
        [BIN, "serve", "-m", MODEL, "--draft", DRAFTER, "--port", "0", "-t", "2",
         "--parallel", "8", "--queue", "128"],
        stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("blockdraft serve: listening on "):
            url = line.split("listening on ")[1].strip()
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, url
    raise SystemExit("the server did not start")


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


def check(cond, what):
    if not cond:
        raise SystemExit("FAIL: " + what)
    print("ok:", what)


def main():
    proc, url = start_server()
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        want = {p: run_text(p, 24) for p in PROMPTS}

        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=24, temperature=0)
        check(r.choices[0].message.content == want[PROMPTS[0]], "chat equals run --chat --temp 0")
        check(r.usage.completion_tokens == 24, "usage counts the completion")
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[1]}],
                                                max_tokens=24, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(text == want[PROMPTS[1]], "streamed chat equals run --chat --temp 0")
        check(chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 24, "the last chunk carries usage")

        lp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                            max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
        entries = lp.choices[0].logprobs.content
        check(lp.choices[0].message.content == want[PROMPTS[0]], "asking for logprobs changes no token")
        check(len(entries) == 24 and all(len(e.top_logprobs) == 3 for e in entries),
              "one logprobs entry per token, three alternatives each")
        check(all(e.top_logprobs[0].logprob == e.logprob <= 0 for e in entries),
              "greedy's token is the most likely one")
        check(bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace") == want[PROMPTS[0]],
              "the entries' bytes spell the text")

        raw = "The capital of France is"
        c = client.completions.create(model=model, prompt=raw, max_tokens=12, temperature=0)
        check(c.choices[0].text == run_text(raw, 12, chat=False), "completion equals run --temp 0")
        s = "".join(x.choices[0].text for x in client.completions.create(
            model=model, prompt=raw, max_tokens=12, temperature=0, stream=True) if x.choices)
        check(s == c.choices[0].text, "streamed completion equals the whole one")
        a, b = (client.completions.create(model=model, prompt=raw, max_tokens=16, temperature=0.9, seed=11)
                .choices[0].text for _ in range(2))
        check(a == b, "the same seed gives the same sampled text")
        plain = client.completions.create(model=model, prompt=raw, max_tokens=16, temperature=0.9, seed=11,
                                          extra_body={"speculative": False}).choices[0].text
        check(a == plain, "the drafter does not change a seeded sample")
        penalized = client.completions.create(model=model, prompt=raw, max_tokens=24, temperature=0,
                                              frequency_penalty=1.5, presence_penalty=0.5).choices[0].text
        check(penalized == run_text(raw, 24, chat=False,
                                    extra=("--frequency-penalty", "1.5", "--presence-penalty", "0.5",
                                           "--repeat-last-n", "64")),
              "penalties equal run --frequency-penalty --presence-penalty")

        # Load: 32 streaming clients x 3 requests.
        ttft, failures, tokens = [], [], [0]
        lock = threading.Lock()

        def client_loop(i):
            own = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
            for j in range(3):
                p = PROMPTS[(i + j) % len(PROMPTS)]
                t0 = time.monotonic()
                first, text = None, ""
                for ch in own.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                                      max_tokens=24, temperature=0, stream=True,
                                                      stream_options={"include_usage": True}):
                    if ch.choices and ch.choices[0].delta.content:
                        first = first or time.monotonic() - t0
                        text += ch.choices[0].delta.content
                    if ch.usage:
                        with lock:
                            tokens[0] += ch.usage.completion_tokens
                with lock:
                    ttft.append(first)
                    if text != want[p]:
                        failures.append((p, text))

        t0 = time.monotonic()
        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        ttft.sort()
        print(f"load: 96 requests, {tokens[0]} tokens in {elapsed:.1f} s = {tokens[0] / elapsed:.1f} tok/s; "
              f"time to first token p50 {statistics.median(ttft):.2f} s, p99 {ttft[int(0.99 * (len(ttft) - 1))]:.2f} s")
        check(not failures and len(ttft) == 96, f"every reply complete and equal to its single text ({len(failures)} differ)")

        # 8 clients leave mid-stream while 4 others run.
        def leaver():
            own = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            s = own.chat.completions.create(model=model,
                                            messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                                            max_tokens=400, temperature=0, stream=True)
            next(iter(s))
            s.close()

        done = []

        def stayer(p):
            own = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
            r = own.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                            max_tokens=24, temperature=0)
            done.append(r.choices[0].message.content == want[p])

        ts = [threading.Thread(target=leaver) for _ in range(8)] + \
             [threading.Thread(target=stayer, args=(p,)) for p in PROMPTS]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        check(done == [True] * 4, "requests beside disconnecting clients complete unchanged")
        deadline = time.monotonic() + 60
        while (metric(url, "blockdraft_requests_cancelled_total") < 8
               or metric(url, "blockdraft_sequences_running") > 0):
            if time.monotonic() > deadline:
                raise SystemExit("FAIL: cancelled sequences still run")
            time.sleep(0.1)
        check(True, "the 8 that left were cancelled and no sequence is left running")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


main()
