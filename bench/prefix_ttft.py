"""Prefix-reuse benchmark: time to first token on a shared-prefix workload and on a multi-turn chat, against one or
more running OpenAI-compatible servers (`anydraft serve`, the same with --no-enable-prefix-caching, `vllm serve`),
measured side by side: each repeat runs every server in turn.

- shared prefix: every request is one long prefix (--prefix-tokens, the same for all) + its own question
  (--suffix-tokens), --output-tokens out, --concurrency at once (the shape of `vllm bench serve --dataset-name
  random --random-prefix-len 1024 --random-input-len 64 --random-output-len 32 --max-concurrency 4`, on text).
- multi-turn chat: --turns turns, each turn's prompt the whole conversation so far (chat completions), one
  conversation at a time; TTFT of each turn. Without prefix reuse it grows with the conversation.

    anydraft serve --port 8000 &  anydraft serve --port 8001 --no-enable-prefix-caching &
    python bench/prefix_ttft.py --server ours=http://127.0.0.1:8000 --server no-prefix-cache=http://127.0.0.1:8001 \
        --json bench/results/<date>-prefix/prefix_ttft.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import gsm8k_prompts  # noqa: E402


def words(texts: list[str], num_words: int) -> str:
    """About num_words words of text (GSM8K questions joined): the token count follows each server's tokenizer."""
    out = " ".join(texts).split()
    while len(out) < num_words:
        out += out
    return " ".join(out[:num_words])


async def first_token(stream_call) -> tuple[float, str]:
    sent = time.perf_counter()
    ttft, text = None, ""
    async for chunk in await stream_call():
        piece = ""
        if chunk.choices:
            choice = chunk.choices[0]
            piece = getattr(choice, "text", None) or getattr(getattr(choice, "delta", None), "content", None) or ""
        if piece and ttft is None:
            ttft = time.perf_counter() - sent
        text += piece
    return ttft, text


async def shared_prefix(client, model: str, args, questions: list[str], repeat: int) -> list[float]:
    # One prefix per repeat (a repeat must not hit what the previous one cached), shared by its requests.
    start = repeat * 7 % len(questions)   # modulo: a repeat index past the questions must not reuse one prefix
    prefix = words(questions[start:] + questions, int(args.prefix_tokens * 0.75))
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int) -> float:
        suffix = words(questions[(i * 3 + repeat) % len(questions):], int(args.suffix_tokens * 0.75))
        async with gate:
            ttft, _ = await first_token(lambda: client.completions.create(
                model=model, prompt=f"{prefix}\n\nQuestion: {suffix}\nAnswer:", max_tokens=args.output_tokens,
                temperature=0, stream=True, extra_body={"ignore_eos": True}))
            return ttft
    return list(await asyncio.gather(*[one(i) for i in range(args.num_requests)]))


async def multi_turn(client, model: str, args, questions: list[str], repeat: int) -> list[float]:
    messages, ttfts = [], []
    for turn in range(args.turns):
        question = words(questions[(repeat * args.turns + turn) % len(questions):], int(args.turn_tokens * 0.75))
        messages.append({"role": "user", "content": question})
        ttft, text = await first_token(lambda: client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.reply_tokens, temperature=0, stream=True,
            extra_body={"ignore_eos": True}))
        messages.append({"role": "assistant", "content": text})
        ttfts.append(ttft)
    return ttfts


async def run(args) -> dict:
    questions = gsm8k_prompts(200 + args.prompt_offset)[args.prompt_offset:]
    servers = dict(s.split("=", 1) for s in args.server)
    clients = {label: openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0,
                                         timeout=1800) for label, url in servers.items()}
    models = {label: (await c.models.list()).data[0].id for label, c in clients.items()}
    results = {label: {"shared_prefix_ttft": [], "multi_turn_ttft": []} for label in servers}
    for repeat in range(args.repeats):   # interleaved: every server in each repeat
        for label, client in clients.items():
            results[label]["shared_prefix_ttft"] += await shared_prefix(client, models[label], args, questions,
                                                                        repeat + 100 * args.prompt_offset)
            results[label]["multi_turn_ttft"].append(await multi_turn(client, models[label], args, questions,
                                                                      repeat))
    for label, r in results.items():
        turns = list(zip(*r["multi_turn_ttft"]))
        r["shared_prefix_mean_ttft"] = statistics.mean(r["shared_prefix_ttft"])
        r["turn_median_ttft"] = [statistics.median(t) for t in turns]
        if turns:   # --turns 0: the shared-prefix workload only
            r["turn_last_over_first"] = r["turn_median_ttft"][-1] / r["turn_median_ttft"][0]
    return {"servers": servers, "models": models, "settings": vars(args), "results": results}


def table(out: dict) -> str:
    labels = list(out["results"])
    lines = ["| | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    r = out["results"]
    lines.append("| shared prefix, mean TTFT (s) | " + " | ".join(f"{r[l]['shared_prefix_mean_ttft']:.3f}"
                                                              for l in labels) + " |")
    for turn in range(len(r[labels[0]]["turn_median_ttft"])):
        lines.append(f"| chat turn {turn + 1}, median TTFT (s) | " +
                     " | ".join(f"{r[l]['turn_median_ttft'][turn]:.3f}" for l in labels) + " |")
    if r[labels[0]]["turn_median_ttft"]:
        lines.append("| turn last / turn 1 | " + " | ".join(f"{r[l]['turn_last_over_first']:.2f}" for l in labels)
                     + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", action="append", required=True, metavar="LABEL=URL")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--suffix-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--turn-tokens", type=int, default=96, help="user message length per turn")
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-offset", type=int, default=0, help="GSM8K test questions to skip")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()
    out = asyncio.run(run(args))
    from anydraft.provenance import provenance
    out["provenance"] = provenance(command=" ".join(sys.argv))
    print(table(out))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
