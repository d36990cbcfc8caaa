#!/usr/bin/env python3
"""`blockdraft serve` and llama.cpp's `llama-server -np N` side by side on the
same GGUF and threads, in one run: for 1, 4 and 8 concurrent streaming chat
clients (each sends REQUESTS requests, greedy, MAX_TOKENS tokens, distinct
prompts), the aggregate generated tokens per second and the median time to
first token. Each concurrency level is measured on both servers back to back,
so both see the same machine load; every server gets `--parallel`/`-np` equal
to the largest level, the given threads and a context big enough for all
slots. With --draft, blockdraft also runs with that drafter (a third column).

Usage: serve_vs_llamacpp.py BLOCKDRAFT LLAMA_SERVER MODEL [--draft D]
       [--threads 2] [--clients 1,4,8] [--requests 3] [--max-tokens 128]
Needs the `openai` client (tests/serve-requirements.txt).
"""
import argparse
import os
import statistics
import subprocess
import threading
import time
import urllib.request

from openai import OpenAI

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in three sentences.",
    "Give me a recipe for a simple tomato soup.",
    "What are the main differences between TCP and UDP?",
    "Write a short poem about autumn leaves.",
    "How do I reverse a linked list in C?",
    "Summarise the plot of a heist movie you invent.",
    "List five tips for writing clear documentation.",
]


def wait_ready(url, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not become ready")


def start(cmd, port, what):
    env = dict(os.environ)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, what)
    return proc, url


def one_level(url, clients, requests, max_tokens):
    """Aggregate streamed tokens/s and TTFTs of `clients` concurrent clients."""
    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    ttfts, tokens = [], []
    lock = threading.Lock()

    def worker(c):
        for r in range(requests):
            prompt = PROMPTS[(c * requests + r) % len(PROMPTS)]
            t0 = time.perf_counter()
            first, n = None, 0
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content and first is None:
                    first = time.perf_counter() - t0
                if chunk.usage is not None:
                    n = chunk.usage.completion_tokens
            with lock:
                ttfts.append(first if first is not None else time.perf_counter() - t0)
                tokens.append(n)

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(tokens) / wall, statistics.median(ttfts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("blockdraft")
    ap.add_argument("llama_server")
    ap.add_argument("model")
    ap.add_argument("--draft")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    levels = [int(c) for c in a.clients.split(",")]
    slots = max(levels)
    ctx = slots * 512
    t = str(a.threads)
    servers = {
        "blockdraft": [a.blockdraft, "serve", "-m", a.model, "-t", t, "--parallel", str(slots),
                       "--port", "18081", "--ctx-size", "512"],
        "llama-server": [a.llama_server, "-m", a.model, "-t", t, "-tb", t, "-np", str(slots),
                         "-c", str(ctx), "--port", "18082", "--no-webui"],
    }
    ports = {"blockdraft": 18081, "llama-server": 18082}
    if a.draft:
        servers["blockdraft+draft"] = servers["blockdraft"][:] + ["--draft", a.draft]
        servers["blockdraft+draft"][servers["blockdraft+draft"].index("18081")] = "18083"
        ports["blockdraft+draft"] = 18083
    procs = {}
    try:
        for name, cmd in servers.items():
            procs[name] = start(cmd, ports[name], name)
        results = {}
        for n in levels:
            for name, (_, url) in procs.items():
                one_level(url, 1, 1, 8)  # warm: page the weights in
                results[(name, n)] = one_level(url, n, a.requests, a.max_tokens)
                print(f"measured {name} at {n} clients", flush=True)
        names = list(servers)
        print(f"{'clients':>7} " + " ".join(f"{x + ' t/s':>22} {'p50 TTFT s':>10}" for x in names)
              + "  ratio (t/s vs llama-server)")
        for n in levels:
            row = f"{n:>7} "
            for name in names:
                tps, ttft = results[(name, n)]
                row += f"{tps:>22.2f} {ttft:>10.3f}"
            base = results[("llama-server", n)][0]
            row += "  " + " ".join(f"{name} {results[(name, n)][0] / base:.2f}x"
                                   for name in names if name != "llama-server")
            print(row)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
