"""Forward costs measured on the runners, and the speculative-decoding cost model built on them.

Cost model (one verification step at batch 1): k draft decodes, then one target forward over k+1 tokens,
appending AL tokens on average; the target alone appends one token per 1-token decode. So

    ideal speedup = AL * T_target / (T_verify(k) + k * T_draft)

T_target: target forward of 1 new token + output head (a target-alone decode step).
T_verify(k): target forward of k+1 new tokens + output head on all of them (a verification step).
T_draft: draft forward of 1 new token + its (for TLI: pruned) output head (one drafted token).
All in seconds, medians over repeats after warm-up, at a realistic context length. The model leaves out
host work (bridge, re-sync, bookkeeping), so measured / ideal says how much of that work costs.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..model.runner import ModelRunner


def ideal_speedup(acceptance_length: float, target_seconds: float, verify_seconds: float, draft_seconds: float,
                  k: int) -> float:
    """AL * T_target / (T_verify + k * T_draft)."""
    return acceptance_length * target_seconds / (verify_seconds + k * draft_seconds)


@torch.inference_mode()
def forward_seconds(runner: ModelRunner, num_new_tokens: int, context_tokens: int = 128, warmup: int = 3,
                    repeats: int = 15, row: int = 0, seed: int = 0) -> float:
    """Median seconds of one forward of num_new_tokens after context_tokens cached, logits on all new tokens.

    The cache row is rewound after every repeat, so each one sees the same context length.
    """
    generator = torch.Generator().manual_seed(seed)
    # Which ids hardly matters for cost; embedding rows are valid inputs for every head layout.
    context_ids = torch.randint(0, runner.vocab_rows, (context_tokens,), generator=generator).tolist()
    new_ids = torch.randint(0, runner.vocab_rows, (1, num_new_tokens), generator=generator).to(runner.device)
    runner.cache.reset(row)
    runner.prefill(row, context_ids)
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        logits = runner.logits(runner.forward([row], new_ids))
        logits.argmax(-1).tolist()   # the step's host sync, as the engine does once per step
        elapsed = time.perf_counter() - start
        runner.cache.rewind([row], [num_new_tokens])
        if i >= warmup:
            times.append(elapsed)
    runner.cache.reset(row)
    return statistics.median(times)


def measure_costs(target: ModelRunner, draft: ModelRunner | None, ks: list[int], context_tokens: int = 128,
                  repeats: int = 15) -> dict:
    """{'target_seconds', 'verify_seconds': {k: s}, 'draft_seconds'} — the cost model's inputs."""
    out = {"context_tokens": context_tokens, "repeats": repeats,
           "target_seconds": forward_seconds(target, 1, context_tokens, repeats=repeats),
           "verify_seconds": {k: forward_seconds(target, k + 1, context_tokens, repeats=repeats) for k in ks}}
    if draft is not None:
        out["draft_seconds"] = forward_seconds(draft, 1, context_tokens, repeats=repeats)
        out["target_to_draft_cost_ratio"] = out["target_seconds"] / out["draft_seconds"]
    return out
