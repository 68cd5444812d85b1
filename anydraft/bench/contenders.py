"""Bench contenders behind one small protocol, and the interleaved rounds that time them side by side.

The unit of work is a group: B consecutive prompts submitted together and decoded as one batch of B rows
(batch 1: one prompt alone). Rows that finish leave; no other prompt joins (static batches, for every contender).

Why interleave: on a shared (virtual) machine the speed of the same code drifts by 2-4x over minutes. Timing
each contender in its own block of minutes turns that drift into fake ratios. Here every round runs group i
on every contender before group i+1, in an order that rotates per round, so drift hits all of them alike.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..config import SamplingParams
from ..engine import Engine
from .. import metrics
from ..metrics import SpecStats
from ..spec_decode.policy import AdaptiveK


class ContenderUnavailable(RuntimeError):
    """A contender in another process stopped answering: the bench drops it, records why, and goes on."""


@dataclass
class GroupRun:
    """One group of prompts decoded together by one contender."""
    output_target_ids: list[list[int]]          # per prompt, in the group's order
    seconds: float                              # the whole group
    target_forwards: int | None = None          # verification steps of all rows (None: the contender cannot tell)
    num_accepted: int | None = None             # accepted draft tokens over those steps
    accepted_at_position: list[int] | None = None
    stats: SpecStats | None = None              # anydraft's full statistics (time split)
    prompt_seconds: float | None = None         # until every prompt had its first token (None: cannot tell)


class Contender(Protocol):
    name: str
    system: str                     # "anydraft" | "hf" | "vllm": speedups are against the same system's k = 0
    k: int | str                    # 0 = target alone

    def warm_up(self, group: list[int]) -> None: ...
    def run(self, group: list[int]) -> GroupRun: ...     # group: prompt indices, decoded together


class EngineContender:
    """anydraft's engine on prompt texts (a group = its requests queued at once, as many rows as the engine has);
    `before_run` lets several contenders share one engine (k sweep)."""

    def __init__(self, name: str, engine: Engine, prompts: list[str], params: SamplingParams,
                 before_run: Callable[[], None] | None = None, k: int | None = None):
        self.name, self.system = name, "anydraft"
        self.engine, self.prompts, self.params = engine, prompts, params
        self.before_run = before_run
        self.k = engine.k if k is None else k
        self.adaptive = isinstance(engine.policy, AdaptiveK)    # k is then the most a step drafts

    def warm_up(self, group: list[int]) -> None:
        params = SamplingParams(temperature=self.params.temperature, max_tokens=min(16, self.params.max_tokens),
                                seed=self.params.seed)
        self._decode(group, params)

    def run(self, group: list[int]) -> GroupRun:
        return self._decode(group, self.params)

    def _decode(self, group: list[int], params: SamplingParams) -> GroupRun:
        if self.before_run is not None:
            self.before_run()
        engine = self.engine
        if len(group) > engine.target.cache.max_batch:
            raise ValueError(f"a group of {len(group)} prompts needs as many cache rows; the engine has "
                             f"{engine.target.cache.max_batch}")
        engine.stats = SpecStats(engine.k)
        requests = [engine.add_request(self.prompts[i], params) for i in group]
        start = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - start
        stats = engine.stats
        return GroupRun([list(r.output_target_ids) for r in requests], seconds, stats.target_forwards,
                        stats.num_accepted, list(stats.accepted_at_position), stats,
                        max(r.first_token_at for r in requests) - start)


def acceptance_length(num_tokens: int, target_forwards: int | None, num_accepted: int | None) -> float | None:
    """AL by metrics.acceptance_length for a system that counts accepted draft tokens. One that counts only
    verification forwards (HF assisted generation) emits accepted + 1 tokens per forward, so its accepted
    count is tokens - forwards. HF has no separate prompt forward: its first target forward reads the prompt
    and verifies the first drafts at once, so every forward it counts is a verification forward, as ours are.
    None without forwards."""
    if not target_forwards:
        return None
    if num_accepted is None:
        num_accepted = num_tokens - target_forwards
    return metrics.acceptance_length(num_accepted, target_forwards)


@dataclass
class _Tally:
    seconds: list[float]
    tokens: list[int]
    outputs: list[list[int]] = field(default_factory=list)   # first round, prompt order
    steps: list[list[int | None]] = field(default_factory=list)   # first round, per group: [target forwards, accepted]
    accepted_at_position: list[int] | None = None
    stats: SpecStats | None = None
    prompt_seconds: list[float | None] = field(default_factory=list)   # per round (None: a group could not tell)


def prompt_groups(num_prompts: int, batch_size: int) -> list[list[int]]:
    """Consecutive prompt indices in groups of batch_size (the bench asks for a multiple of it)."""
    return [list(range(start, min(start + batch_size, num_prompts))) for start in range(0, num_prompts, batch_size)]


def run_rounds(contenders: list[Contender], num_prompts: int, repeats: int,
               rounds_of: Callable[[Contender], int] = lambda c: -1,
               log: Callable[[str], None] = lambda m: None,
               dropped: dict[str, str] | None = None, batch_size: int = 1) -> dict[str, dict]:
    """Warm every contender up once (on the first group), then `repeats` rounds of: for each group of
    batch_size prompts, every contender in a rotating order. rounds_of(c) >= 0 caps a contender's rounds (a slow
    peer). Returns one result dict per name; a contender that raises ContenderUnavailable is left out of it,
    with the reason in `dropped`."""
    dropped = {} if dropped is None else dropped
    groups = prompt_groups(num_prompts, batch_size)

    def attempt(contender: Contender, call: Callable[[], GroupRun | None], where: str) -> GroupRun | None:
        try:
            return call()
        except ContenderUnavailable as e:
            dropped[contender.name] = f"stopped answering during {where}, dropped from the bench: {e}"
            log(f"{contender.name}: {dropped[contender.name]}")
            return None

    for contender in contenders:
        log(f"warm-up: {contender.name}")
        attempt(contender, lambda: contender.warm_up(groups[0]), "its warm-up")
    tallies = {c.name: _Tally([0.0] * repeats, [0] * repeats, prompt_seconds=[0.0] * repeats) for c in contenders}
    for round_index in range(repeats):
        active = [c for c in contenders if c.name not in dropped and (rounds_of(c) < 0 or round_index < rounds_of(c))]
        for group_index, group in enumerate(groups):
            shift = (round_index + group_index) % len(active)
            for contender in active[shift:] + active[:shift]:
                if contender.name in dropped:
                    continue
                run = attempt(contender, lambda: contender.run(group),
                              f"round {round_index + 1}, prompts {group[0]}-{group[-1]}")
                if run is not None:
                    _add(tallies[contender.name], run, round_index)
        log(f"round {round_index + 1}/{repeats}: " + ", ".join(
            f"{c.name} {tallies[c.name].tokens[round_index] / tallies[c.name].seconds[round_index]:.1f} tok/s"
            for c in active if c.name not in dropped))
    return {c.name: _summary(c, tallies[c.name], rounds_of(c) if rounds_of(c) >= 0 else repeats)
            for c in contenders if c.name not in dropped}


def _add(tally: _Tally, run: GroupRun, round_index: int) -> None:
    tally.seconds[round_index] += run.seconds
    tally.tokens[round_index] += sum(map(len, run.output_target_ids))
    if tally.prompt_seconds[round_index] is not None:
        tally.prompt_seconds[round_index] = (None if run.prompt_seconds is None
                                             else tally.prompt_seconds[round_index] + run.prompt_seconds)
    if round_index > 0:
        return
    tally.outputs += run.output_target_ids   # greedy: every round decodes the same tokens
    tally.steps.append([run.target_forwards, run.num_accepted])
    if run.accepted_at_position is not None:
        old = tally.accepted_at_position or [0] * len(run.accepted_at_position)
        tally.accepted_at_position = [a + b for a, b in zip(old, run.accepted_at_position)]
    if run.stats is not None:
        if tally.stats is None:
            tally.stats = SpecStats(run.stats.num_speculative_tokens)
        tally.stats.merge(run.stats)


def _summary(contender: Contender, tally: _Tally, num_rounds: int) -> dict:
    tokens_per_second = [t / s for t, s in zip(tally.tokens[:num_rounds], tally.seconds[:num_rounds])]
    forwards = _total([f for f, _ in tally.steps]) or None
    accepted = _total([a for _, a in tally.steps])
    by_position = None
    if forwards and tally.accepted_at_position is not None:
        by_position = [a / forwards for a in tally.accepted_at_position]
    result = {
        "k": contender.k,
        "tokens_per_second_median": statistics.median(tokens_per_second),
        "tokens_per_second_best": max(tokens_per_second),
        "tokens_per_second_all": tokens_per_second,
        "seconds_median": statistics.median(tally.seconds[:num_rounds]),
        "generated_tokens": tally.tokens[0],
        "acceptance_length": 1.0 if contender.k == 0 else acceptance_length(tally.tokens[0], forwards, accepted),
        "acceptance_by_position": by_position,
        "target_forwards": forwards,
        "per_group_steps": tally.steps if forwards else None,
        "output_target_ids": tally.outputs,
    }
    decode = _decode_tokens_per_second(tally, num_rounds, len(tally.outputs))
    if decode is not None:
        result["decode_tokens_per_second_median"] = decode
    if getattr(contender, "adaptive", False):
        result["adaptive"] = True
    if tally.stats is not None:
        stats = tally.stats.to_dict()
        result["time_split_seconds_first_repeat"] = stats["time_split_seconds"]
        result["k_histogram_first_repeat"] = stats["k_histogram"]   # drafted tokens per row step -> row steps
    return result


def _decode_tokens_per_second(tally: _Tally, num_rounds: int, num_prompts: int) -> float | None:
    """Median over rounds of the tokens after each prompt's first per second after it (TPOT's inverse at batch 1):
    the decode alone, without the prompts' forward. None where a contender cannot tell when first tokens came."""
    rates = []
    for tokens, seconds, prompt in zip(tally.tokens[:num_rounds], tally.seconds[:num_rounds],
                                       tally.prompt_seconds[:num_rounds]):
        if prompt is None or seconds <= prompt or tokens <= num_prompts:
            return None
        rates.append((tokens - num_prompts) / (seconds - prompt))
    return statistics.median(rates) if rates else None


def _total(counts: list[int | None]) -> int | None:
    """Sum of per-group counts; None when any group could not report one."""
    return None if any(c is None for c in counts) else sum(counts)
