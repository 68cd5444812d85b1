"""Serving benchmark: N concurrent streaming clients (the official `openai` client) on GSM8K prompts against a
running OpenAI-compatible server (`anydraft serve`, `vllm serve`, ...), at several concurrency levels.

Tokens are counted by the server (usage of the last chunk, include_usage), not as chunks: a speculative step
can put several tokens in one chunk. Reported per level: output tokens/s, TTFT p50/p99, TPOT p50/p99 (per
request: (last - first chunk time) / (tokens - 1)), ITL p50/p99 (gaps between chunks), and every request's
counts. Each request asks for exactly --max-tokens tokens (ignore_eos), so servers do the same work.

    anydraft serve --port 8000 &                       # or: anydraft serve --draft none ... / vllm serve ...
    python bench/serve.py --port 8000 --label anydraft-tli --json bench/results/<date>-serve/anydraft-tli.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import gsm8k_prompts  # noqa: E402


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def one_request(client, model: str, prompt: str, max_tokens: int) -> dict:
    sent = time.perf_counter()
    arrivals, tokens = [], None
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if any(c.text for c in chunk.choices):
            arrivals.append(time.perf_counter())
    return {"ttft": arrivals[0] - sent if arrivals else None, "tokens": tokens, "chunks": len(arrivals),
            "latency": time.perf_counter() - sent,
            "tpot": (arrivals[-1] - arrivals[0]) / (tokens - 1) if arrivals and tokens and tokens > 1 else None,
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:])]}


async def run_level(client, model: str, prompts: list[str], concurrency: int, num_requests: int,
                    max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def gated(i):
        async with gate:
            return await one_request(client, model, prompts[i % len(prompts)], max_tokens)

    start = time.perf_counter()
    results = await asyncio.gather(*(gated(i) for i in range(num_requests)))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] or 0 for r in results)
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    tpot = [r["tpot"] for r in results if r["tpot"] is not None]
    itl = [gap for r in results for gap in r["itl"]]
    ms = lambda x: None if x is None else round(1000 * x, 2)  # noqa: E731
    return {"concurrency": concurrency, "requests": num_requests, "output_tokens": tokens,
            "wall_seconds": round(wall, 3), "output_tokens_per_second": round(tokens / wall, 2),
            "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p99": ms(percentile(ttft, 99)),
            "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p99": ms(percentile(tpot, 99)),
            "itl_ms_p50": ms(percentile(itl, 50)), "itl_ms_p99": ms(percentile(itl, 99)),
            "tokens_per_chunk": round(tokens / max(1, sum(r["chunks"] for r in results)), 3),
            "mean_latency_s": round(statistics.fmean(r["latency"] for r in results), 3)}


async def bench(base_url: str, concurrency: list[int], requests_per_level: int, max_tokens: int, num_prompts: int,
                api_key: str) -> tuple[str, list[dict]]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=3600)
    model = (await client.models.list()).data[0].id
    prompts = gsm8k_prompts(num_prompts)
    await run_level(client, model, prompts, 1, 2, 8)   # warm-up (compiled graphs, caches)
    levels = []
    for c in concurrency:
        levels.append(await run_level(client, model, prompts, c, max(requests_per_level, c), max_tokens))
        print(json.dumps(levels[-1]), file=sys.stderr, flush=True)
    await client.close()
    return model, levels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--label", required=True, help="what this server is, e.g. anydraft-tli, anydraft-target, vllm-tli")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests-per-level", type=int, default=64, help="at least the concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=64, help="first N GSM8K test questions")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model, levels = asyncio.run(bench(f"http://127.0.0.1:{args.port}", args.concurrency, args.requests_per_level,
                                      args.max_tokens, args.num_prompts, args.api_key))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"label": args.label, "model": model, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "command": " ".join(sys.argv), "max_tokens": args.max_tokens, "levels": levels}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
