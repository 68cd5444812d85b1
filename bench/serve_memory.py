"""Memory of `anydraft serve` at start: peak RSS while loading, RSS once ready, and the KV pool it logged, for the
flags given (e.g. the grown 1.7B pair with defaults, or with --kv-cache-memory). Then it sends --concurrency
greedy completions of --prompt-tokens (about) and --max-tokens, all at once, checks they all finish, and records
RSS after, the preemptions and the pool usage /metrics saw.

    python bench/serve_memory.py --json bench/results/<date>-kv/grown-default.json -- \
        --model qwen3-target@qwen3-1.7b --draft smollm2-draft@smollm2-135m
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import gsm8k_prompts  # noqa: E402


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process] + process.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=0, help="requests sent at once after start (0: none)")
    p.add_argument("--prompt-tokens", type=int, default=1900)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: anydraft serve's flags")
    args = p.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "anydraft.cli", "serve", "--port", str(port), *serve_args]
    log_path = Path(args.json or "serve_memory").with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(command, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    process, peak, start = psutil.Process(server.pid), 0, time.perf_counter()
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"server exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
            peak = max(peak, tree_rss(process))
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        ready_seconds = time.perf_counter() - start
        time.sleep(2)
        result = {"command": command, "ready_seconds": round(ready_seconds, 1), "peak_rss_loading_bytes": peak,
                  "rss_ready_bytes": tree_rss(process),
                  "kv_log": [line for line in log_path.read_text().splitlines() if "KV cache" in line][:1]}
        if args.concurrency:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
            model = client.models.list().data[0].id
            questions = gsm8k_prompts(200)
            words = " ".join(questions).split()

            def one(i: int) -> int:
                prompt = " ".join(words[i * 37:] + words)[: args.prompt_tokens * 4]   # ~4 characters a token
                out = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens,
                                                temperature=0, extra_body={"ignore_eos": True})
                return out.usage.completion_tokens
            peak_serving, max_running, done = [0], [0.0], threading.Event()

            def watch():   # peak RSS and the most requests running at once (the server's gauge)
                while not done.is_set():
                    peak_serving[0] = max(peak_serving[0], tree_rss(process))
                    try:   # a long prefill step can hold the server past the timeout: skip that sample
                        text = httpx.get(url + "/metrics", timeout=30).text
                    except httpx.HTTPError:
                        continue
                    for line in text.splitlines():
                        if line.startswith("anydraft:num_requests_running"):
                            max_running[0] = max(max_running[0], float(line.rsplit(" ", 1)[1]))
                    time.sleep(0.5)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                tokens = list(pool.map(one, range(args.concurrency)))
            done.set()
            text = httpx.get(url + "/metrics", timeout=30).text
            metric = lambda name: sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()   # noqa: E731
                                      if l.startswith(name))
            result.update({"concurrency": args.concurrency, "completion_tokens": tokens,
                           "seconds": round(time.perf_counter() - t0, 1), "peak_rss_serving_bytes": peak_serving[0],
                           "num_preemptions": metric("anydraft:num_preemptions_total"),
                           "max_running": max_running[0]})
        from anydraft.provenance import provenance
        result["provenance"] = provenance(command=" ".join(sys.argv))
        print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
