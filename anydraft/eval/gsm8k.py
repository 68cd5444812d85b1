"""GSM8K evaluation: prompts, answer extraction, accuracy / AL / tok/s, and the exact-match comparison
against the target alone (with a near-tie check at each first divergence)."""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import SamplingParams
from ..engine import Engine
from ..metrics import SpecStats

STOP_STRINGS = ["\nQuestion:", "\n\nQuestion"]
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


DEFAULT_DATA_DIR = Path("../shared/data/gsm8k")   # relative to where the command runs (a checkout's root)


def data_dir(given: str | Path | None) -> Path:
    """The GSM8K directory: the one given (--data), else ../shared/data/gsm8k when it exists."""
    if given is not None:
        path = Path(given)
        if not path.is_dir():
            raise FileNotFoundError(f"--data {path}: not a directory; give one holding GSM8K train.jsonl / test.jsonl")
        return path
    if DEFAULT_DATA_DIR.is_dir():
        return DEFAULT_DATA_DIR
    raise FileNotFoundError(f"no GSM8K data at {DEFAULT_DATA_DIR} (relative to {Path.cwd()}); pass --data DIR "
                            f"holding GSM8K train.jsonl and test.jsonl")


def load_split(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: GSM8K file not found; pass --data DIR holding train.jsonl and test.jsonl")
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: invalid JSON ({e})") from None
    return rows


def normalize_number(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value == int(value) else str(value)


def extract_answer(completion: str) -> str | None:
    """The number after '####'; otherwise the last number in the completion (the standard extraction)."""
    if "####" in completion:
        match = _NUMBER.search(completion.split("####", 1)[1])
        if match:
            return normalize_number(match.group())
    numbers = _NUMBER.findall(completion)
    return normalize_number(numbers[-1]) if numbers else None


def gold_answer(example: dict) -> str:
    return normalize_number(example["answer"].split("####")[-1])


def build_prompt(question: str, shots: list[dict], tokenizer=None, chat: bool = False) -> str:
    """Plain few-shot 'Question: ...\\nAnswer: ...' text, or the tokenizer's chat template."""
    if chat:
        messages = []
        for shot in shots:
            messages += [{"role": "user", "content": shot["question"]}, {"role": "assistant", "content": shot["answer"]}]
        messages.append({"role": "user", "content": question})
        return tokenizer.apply_chat_template(messages)
    context = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return f"{context}Question: {question}\nAnswer:"


@dataclass
class RunResult:
    completions: list[str]
    token_ids: list[list[int]]
    stats: SpecStats
    seconds: float


def run_engine(engine: Engine, prompts: list[str], params: SamplingParams | list[SamplingParams],
               progress=None) -> RunResult:
    """All prompts submitted at once (params: one for all, or one per prompt); the engine batches up to its row
    count."""
    engine.stats = SpecStats(engine.k)
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    requests = [engine.add_request(p, q) for p, q in zip(prompts, per_prompt, strict=True)]
    start = time.perf_counter()
    engine.run(progress)
    seconds = time.perf_counter() - start
    texts = [r.text for r in requests]
    return RunResult(texts, [r.output_target_ids for r in requests], engine.stats, seconds)


def near_tie(runner, prompt_ids: list[int], common_ids: list[int], row: int = 0) -> dict:
    """Top-2 target logits at the first divergence: a near-tie when within one bf16 step or relative gap < 1e-3."""
    runner.cache.reset(row)
    context = prompt_ids + common_ids
    runner.prefill(row, context[:-1])
    logits = runner.logits(runner.forward([row], torch.tensor([[context[-1]]], device=runner.device)))[0, -1]
    runner.cache.reset(row)
    top2 = torch.topk(logits.double(), 2).values.tolist()
    gap = top2[0] - top2[1]
    bf16_step = 2.0 ** (torch.tensor(abs(top2[0])).log2().floor().item() - 7) if top2[0] != 0 else 2.0 ** -133
    relative = gap / max(abs(top2[0]), 1e-12)
    return {"top1": top2[0], "top2": top2[1], "gap": gap, "relative_gap": relative,
            "near_tie": bool(gap <= bf16_step or relative < 1e-3)}


def accuracy_noise(correct: int, reference_correct: int, n: int) -> dict:
    """Two accuracies over the same n questions from independent samples: their difference, its standard error
    (binomial, unpooled) and whether it lies within two of them."""
    p, q = correct / n, reference_correct / n
    stderr = math.sqrt((p * (1 - p) + q * (1 - q)) / n)
    return {"difference": p - q, "stderr": stderr, "within_binomial_noise": abs(p - q) <= 2 * stderr}


def compare_runs(spec: RunResult, alone: RunResult, target_runner, prompt_ids: list[list[int]],
                 near_ties: bool = True) -> dict:
    """Exact-text matches, and for each mismatch the first diverging token and (near_ties: greedy runs, where a
    divergence can only be rounding) whether it is a near-tie."""
    mismatches = []
    for i, (a, b) in enumerate(zip(spec.token_ids, alone.token_ids)):
        if a == b:
            continue
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        entry = {"index": i, "first_divergence": first}
        if near_ties and first < min(len(a), len(b)):
            entry.update(near_tie(target_runner, prompt_ids[i], b[:first]))
        mismatches.append(entry)
    return {"exact_matches": len(spec.token_ids) - len(mismatches), "mismatches": mismatches,
            "near_tie_mismatches": sum(1 for m in mismatches if m.get("near_tie"))}
