"""Soak test of a running `anydraft serve`: many concurrent streaming clients (the official `openai` client),
a mix of greedy and seeded sampled requests, some clients leaving mid-stream. Bounded in count and time,
loopback only; it stops by itself.

Checks: no server errors; no lost or duplicated tokens (every completed greedy stream equals the server's
non-streamed text for the same request, and its usage counts the same tokens); every row freed at the end
(running and waiting gauges back to 0); resident memory after warm-up (process_resident_memory_bytes).

    anydraft serve --port 8000 &
    python bench/soak.py --port 8000 --clients 64 --requests 1000 --json bench/results/<date>-serve/soak.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import openai

GSM8K_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"


def gsm8k_prompts(n: int, path: Path = GSM8K_TEST) -> list[str]:
    lines = path.read_text().splitlines()[:n]
    return [f"Question: {json.loads(line)['question']}\nAnswer:" for line in lines]


def server_samples(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name.split("{")[0]] = samples.get(name.split("{")[0], 0.0) + float(value)
    return samples


def plan_requests(num_requests: int, num_prompts: int, max_tokens_choices: list[int], sampled_fraction: float,
                  disconnect_fraction: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    plan = []
    for i in range(num_requests):
        sampled = rng.random() < sampled_fraction
        plan.append({"index": i, "prompt": rng.randrange(num_prompts), "max_tokens": rng.choice(max_tokens_choices),
                     "temperature": 0.8 if sampled else 0.0, "seed": rng.randrange(1 << 30) if sampled else None,
                     "disconnect_after": rng.randint(1, 3) if rng.random() < disconnect_fraction else None})
    return plan


async def _stream(client, model: str, prompt: str, item: dict) -> dict:
    text, chunks, usage, finish = [], 0, None, None
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=item["max_tokens"],
                                             temperature=item["temperature"], seed=item["seed"], stream=True,
                                             stream_options={"include_usage": True})
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text.append(choice.text)
                finish = choice.finish_reason or finish
            chunks += 1
            if item["disconnect_after"] is not None and chunks >= item["disconnect_after"]:
                break
    finally:
        await stream.close()
    return {"text": "".join(text), "usage": usage, "finish_reason": finish, "chunks": chunks}


async def soak(base_url: str, api_key: str = "unused", num_clients: int = 64, num_requests: int = 1000,
               max_tokens_choices: tuple[int, ...] = (16, 48), num_prompts: int = 32, sampled_fraction: float = 0.3,
               disconnect_fraction: float = 0.1, seed: int = 0, time_limit_s: float = 1800) -> dict:
    deadline = time.monotonic() + time_limit_s
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    prompts = gsm8k_prompts(num_prompts)
    plan = plan_requests(num_requests, num_prompts, list(max_tokens_choices), sampled_fraction, disconnect_fraction,
                         seed)
    gate = asyncio.Semaphore(num_clients)
    errors: list[str] = []

    async def reference(key):
        prompt_index, max_tokens = key
        async with gate:
            out = await client.completions.create(model=model, prompt=prompts[prompt_index], max_tokens=max_tokens,
                                                  temperature=0)
        return key, (out.choices[0].text, out.usage.completion_tokens)

    # Non-streamed greedy texts first (this is also the warm-up).
    keys = sorted({(p["prompt"], p["max_tokens"]) for p in plan if p["temperature"] == 0})
    references = dict(await asyncio.gather(*(reference(k) for k in keys)))
    rss = [server_samples(base_url).get("process_resident_memory_bytes", 0.0)]
    results: list[dict] = []
    started = time.monotonic()

    async def one(item):
        if time.monotonic() > deadline:
            return
        async with gate:
            try:
                out = await _stream(client, model, prompts[item["prompt"]], item)
            except Exception as e:   # any failure a client sees is a server error here
                errors.append(f"request {item['index']}: {type(e).__name__}: {e}")
                return
        results.append({**item, **out})
        if len(results) % max(1, num_requests // 10) == 0:
            rss.append(server_samples(base_url).get("process_resident_memory_bytes", 0.0))

    await asyncio.gather(*(one(item) for item in plan))
    wall = time.monotonic() - started
    rss.append(server_samples(base_url).get("process_resident_memory_bytes", 0.0))
    mismatched, unfinished, completion_tokens = [], [], 0
    for r in results:
        if r["disconnect_after"] is not None:
            continue
        if r["finish_reason"] is None or r["usage"] is None:
            unfinished.append(r["index"])
            continue
        completion_tokens += r["usage"]
        if r["temperature"] == 0 and (r["text"], r["usage"]) != references[(r["prompt"], r["max_tokens"])]:
            mismatched.append(r["index"])
    # Every row comes back: aborted streams are freed within a step, so the gauges settle at 0.
    for _ in range(600):
        samples = server_samples(base_url)
        if samples.get("anydraft:num_requests_running", 1) == samples.get("anydraft:num_requests_waiting", 1) == 0:
            break
        await asyncio.sleep(0.1)
    await client.close()
    greedy_checked = sum(1 for r in results if r["temperature"] == 0 and r["disconnect_after"] is None)
    return {
        "clients": num_clients, "requests_planned": num_requests, "requests_done": len(results),
        "disconnected_early": sum(1 for r in results if r["disconnect_after"] is not None),
        "sampled": sum(1 for r in results if r["temperature"] > 0), "greedy_checked": greedy_checked,
        "server_errors": errors, "mismatched_greedy": mismatched, "unfinished": unfinished,
        "running_after": samples.get("anydraft:num_requests_running"),
        "waiting_after": samples.get("anydraft:num_requests_waiting"),
        "completion_tokens": completion_tokens, "wall_seconds": round(wall, 2),
        "tokens_per_second": round(completion_tokens / wall, 1) if wall > 0 else 0.0,
        "rss_bytes_after_warmup": rss, "rss_growth_bytes": max(rss) - rss[0],
        "timed_out": time.monotonic() > deadline,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, nargs="+", default=[16, 48])
    p.add_argument("--sampled-fraction", type=float, default=0.3)
    p.add_argument("--disconnect-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=1800, help="seconds; requests not started by then are skipped")
    p.add_argument("--json", default=None, help="write the report here too")
    args = p.parse_args(argv)
    report = asyncio.run(soak(f"http://127.0.0.1:{args.port}", args.api_key, args.clients, args.requests,
                              tuple(args.max_tokens), sampled_fraction=args.sampled_fraction,
                              disconnect_fraction=args.disconnect_fraction, seed=args.seed,
                              time_limit_s=args.time_limit))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
              "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "command": " ".join(sys.argv), **report}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    ok = (not report["server_errors"] and not report["mismatched_greedy"] and not report["unfinished"]
          and report["running_after"] == 0 and not report["timed_out"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
