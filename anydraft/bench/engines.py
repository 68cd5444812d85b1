"""anydraft's own contenders in the bench: one target runner shared by target-alone, same-vocab and TLI engines,
measured at batch 1 (one prompt at a time) with a discarded warm-up and repeats."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..config import SamplingParams, SpeculativeConfig, parse_dtype
from ..engine import Engine
from ..metrics import SpecStats
from ..model.loader import load_model, resolve_model_path
from ..model.runner import ModelRunner
from ..spec.factory import build_proposer
from ..spec.proposer import NoDraftProposer
from ..tokenizer import Tokenizer
from .inflate import InflateSpec, inflate_model, parameter_count


@dataclass
class TargetSetup:
    runner: ModelRunner
    tokenizer: Tokenizer
    path: str
    parameters: int
    inflate: InflateSpec | None      # set = cost-emulated target (same logits, bigger cost)


def load_target(name: str, dtype: str, max_model_len: int, inflate: InflateSpec | None) -> TargetSetup:
    """The target at batch 1; with `inflate`, enlarged in memory before its KV cache is built."""
    path = resolve_model_path(name)
    tokenizer = Tokenizer.from_dir(path)
    model, extras = load_model(path, parse_dtype(dtype), torch.device("cpu"))
    if inflate is not None:
        inflate_model(model, inflate)
    # + 16: room for a verification forward of up to k+1 tokens at the length limit (k <= 15), as LLM does.
    runner = ModelRunner(model, 1, max_model_len + 16, num_token_rows=tokenizer.vocab_size, extras=extras)
    return TargetSetup(runner, tokenizer, str(path), parameter_count(model), inflate)


def build_engine(target: TargetSetup, draft: str | None, k: int, max_model_len: int,
                 vocab_mode: str = "auto") -> tuple[Engine, dict, ModelRunner | None]:
    """(engine, draft_info, draft runner) for the target alone (draft None) or with a draft."""
    if draft is None:
        proposer = NoDraftProposer(target.runner.device, target.runner.vocab_rows)
        return Engine(target.runner, target.tokenizer, proposer, max_model_len), {"vocab_mode": None}, None
    spec = SpeculativeConfig(model=draft, num_speculative_tokens=k, vocab_mode=vocab_mode)
    proposer, info = build_proposer(spec, target.runner, target.tokenizer, 1, max_model_len)
    return Engine(target.runner, target.tokenizer, proposer, max_model_len), info, proposer.runner


def set_k(engine: Engine, k: int) -> None:
    """Reuse a built draft at another k (the sweep): the proposer and the engine both read k per step."""
    engine.proposer.num_speculative_tokens = k
    engine.k = k
    engine.max_model_len = min(engine.max_model_len, engine.target.cache.max_len - k)
    engine.stats = SpecStats(k)


def _one_pass(engine: Engine, prompts: list[str], params: SamplingParams) -> tuple[SpecStats, float, list]:
    """Every prompt alone (batch 1), in order; returns aggregate stats, seconds and per-prompt target ids."""
    stats = SpecStats(engine.k)
    outputs, seconds = [], 0.0
    for prompt in prompts:
        engine.stats = SpecStats(engine.k)
        request = engine.add_request(prompt, params)
        start = time.perf_counter()
        engine.run()
        seconds += time.perf_counter() - start
        stats.merge(engine.stats)
        outputs.append(request.output_target_ids)
    stats.wall_seconds = seconds
    return stats, seconds, outputs


def measure_engine(engine: Engine, prompts: list[str], params: SamplingParams, repeats: int) -> dict:
    """tok/s (median and best over repeats, after one discarded warm-up prompt), AL, acceptance by position."""
    warmup = SamplingParams(temperature=params.temperature, max_tokens=min(16, params.max_tokens), seed=params.seed)
    _one_pass(engine, prompts[:1], warmup)
    passes = [_one_pass(engine, prompts, params) for _ in range(repeats)]
    stats, _, outputs = passes[0]
    tokens_per_second = [p[0].num_emitted / p[1] for p in passes]
    split = stats.to_dict()["time_split_seconds"]
    return {
        "k": engine.k,
        "tokens_per_second_median": statistics.median(tokens_per_second),
        "tokens_per_second_best": max(tokens_per_second),
        "tokens_per_second_all": tokens_per_second,
        "seconds_median": statistics.median(p[1] for p in passes),
        "generated_tokens": stats.num_emitted,
        "acceptance_length": stats.acceptance_length if engine.k else 1.0,
        "acceptance_by_position": stats.acceptance_by_position,
        "target_forwards": stats.target_forwards,
        "time_split_seconds_first_repeat": split,
        "output_target_ids": outputs,
    }
