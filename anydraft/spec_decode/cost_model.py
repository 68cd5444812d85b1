"""Forward costs measured on the runners, and the speculative-decoding cost model built on them.

Cost model (one verification step over B rows, batch 1 included): k draft decodes, then one target forward over
k+1 tokens per row, appending AL tokens per row on average; the target alone appends one token per row per
1-token decode. So

    ideal speedup = AL * T_target / (T_verify(k) + F(k) * T_draft)

F(k): the draft forwards a step drafting k costs (the proposer's draft_forwards: k for a draft model, k + 1 for a
SLEM draft, which writes one token more than it proposes; 1 for a block drafter).

T_target: target forward of 1 new token per row + output head (a target-alone decode step).
T_verify(k): target forward of k+1 new tokens per row + output head on all of them (a verification step).
T_draft: draft forward of 1 new token per row + its (for TLI: pruned) output head (one drafted token).
All in seconds, medians over interleaved repeats after warm-up, at a realistic context length. The model leaves out
host work (bridge, re-sync, bookkeeping), so measured / ideal says how much of that work costs.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..model.runner import ModelRunner


def ideal_speedup(acceptance_length: float, target_seconds: float, verify_seconds: float, draft_seconds: float,
                  k: int, draft_forwards: int | None = None) -> float:
    """AL * T_target / (T_verify + F(k) * T_draft); draft_forwards F(k), None = k (one forward per drafted token)."""
    forwards = k if draft_forwards is None else draft_forwards
    return acceptance_length * target_seconds / (verify_seconds + forwards * draft_seconds)


@torch.inference_mode()
def _timed_forward(runner: ModelRunner, new_ids: torch.Tensor) -> float:
    """Seconds of one forward of new_ids [B, n] over rows 0..B-1 + greedy head on all of them + the step's host
    sync; then rewound, so every repeat sees the same context."""
    rows = list(range(new_ids.shape[0]))
    start = time.perf_counter()
    runner.greedy_ids(runner.forward(rows, new_ids)).tolist()   # head + the step's host sync, as greedy decoding
    elapsed = time.perf_counter() - start
    runner.cache.rewind(rows, [new_ids.shape[1]] * len(rows))
    return elapsed


def measure_costs(target: ModelRunner, drafts: dict[str, ModelRunner], ks: list[int], context_tokens: int = 128,
                  warmup: int = 3, repeats: int = 15, seed: int = 0, batch_size: int = 1) -> dict:
    """{'target_seconds', 'verify_seconds': {k: s}, '<name>_seconds' per draft} — the cost model's inputs, each a
    forward over batch_size rows of context_tokens each.

    Medians of `repeats` after `warmup`, the quantities interleaved (each repeat times every one of them once),
    so a machine whose speed drifts does not skew their ratios. drafts: e.g. {"draft": tli_runner}.
    """
    generator = torch.Generator().manual_seed(seed)
    probes = [("target", target, 1)] + [(f"verify{k}", target, k + 1) for k in ks] + [
        (name, runner, 1) for name, runner in drafts.items()]
    rows = list(range(batch_size))
    for runner in {id(r): r for _, r, _ in probes}.values():
        # Which ids hardly matters for cost; embedding rows are valid inputs for every head layout.
        for row in rows:
            runner.cache.reset(row)
        context = torch.randint(0, runner.vocab_rows, (batch_size, context_tokens), generator=generator).tolist()
        runner.prefill_rows(rows, context)
    new_ids = {key: torch.randint(0, runner.vocab_rows, (batch_size, n), generator=generator).to(runner.device)
               for key, runner, n in probes}
    times: dict[str, list[float]] = {key: [] for key, _, _ in probes}
    for repeat in range(warmup + repeats):
        for key, runner, _ in probes:
            elapsed = _timed_forward(runner, new_ids[key])
            if repeat >= warmup:
                times[key].append(elapsed)
    for _, runner, _ in probes:
        for row in rows:
            runner.cache.reset(row)
    out = {"context_tokens": context_tokens, "repeats": repeats, "rows": batch_size,
           "target_seconds": statistics.median(times["target"]),
           "verify_seconds": {k: statistics.median(times[f"verify{k}"]) for k in ks}}
    for name in drafts:
        out[f"{name}_seconds"] = statistics.median(times[name])
    if "draft" in drafts:
        out["target_to_draft_cost_ratio"] = out["target_seconds"] / out["draft_seconds"]
    return out
