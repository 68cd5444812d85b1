"""Step-interleaved timing: several LLMs decode their prompts taking turns step by step, each timed over its own
steps. On a machine whose speed drifts by tens of percent within seconds (a shared VM), timing whole runs one after
another, even in rotating rounds, lets a drift land on one contender; steps are milliseconds apart."""
from __future__ import annotations

import time

from ..config import SamplingParams
from ..llm import LLM


def step_interleaved(runs: dict[str, tuple[LLM, list[str], list[SamplingParams]]], turn: int = 0
                     ) -> dict[str, tuple[int, float, list[list[int]]]]:
    """Each LLM decodes its prompts together (as its generate() does: queue them, then step until done), the LLMs
    taking turns step by step in an order rotating at every turn (starting from `turn`). Per name: tokens
    generated, its own seconds (queueing and steps), and the outputs' token ids in prompt order."""
    names, seconds, requests = list(runs), dict.fromkeys(runs, 0.0), {}
    for name, (llm, prompts, params) in runs.items():
        start = time.perf_counter()
        requests[name] = [llm.engine.add_request(prompt, p) for prompt, p in zip(prompts, params, strict=True)]
        seconds[name] += time.perf_counter() - start
    engines = {name: runs[name][0].engine for name in names}
    while any(engine.has_unfinished() for engine in engines.values()):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            if engines[name].has_unfinished():
                start = time.perf_counter()
                engines[name].step()
                seconds[name] += time.perf_counter() - start
        turn += 1
    return {name: (sum(len(r.output_target_ids) for r in requests[name]), seconds[name],
                   [list(r.output_target_ids) for r in requests[name]]) for name in names}
