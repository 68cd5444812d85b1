"""What a speculation policy sees and says: the batch before a step, the plan for it, the record after it.

A policy reads nothing else: not the engine, not the proposer, not the models. Everything it learns comes through
`StepRecord`s, so a policy can be tested on hand-made records.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BatchView:
    """The decoding batch before a step."""
    rows: int                             # rows that decode this step
    sampled_rows: int = 0                 # of them, rows that sample (the others are greedy)
    unread_tokens: int = 0                # text the draft must read before it can draft for these rows (its units)
    remaining_tokens: float = math.inf    # mean tokens a row may still write (given where unread_tokens > 0)


@dataclass(frozen=True)
class StepPlan:
    k: int   # draft tokens per row this step; 0 = a plain target decode, no draft forward


@dataclass(frozen=True)
class StepRecord:
    """What one step did and what its parts cost, timed by the engine."""
    batch: BatchView
    k: int                          # the plan's k
    num_drafted: list[int]          # [B] tokens each row verified (k, or fewer where its request caps it)
    num_accepted: list[int]         # [B]
    sampled: list[bool] | None      # [B] whether each row samples; None = every row is greedy
    draft_seconds: float            # the proposal, with any text the draft read first
    later_draft_seconds: float      # of draft_seconds: the proposal's forwards after its first
    target_seconds: float           # the verification forward
    host_seconds: float             # scheduling and planning, verification, the host sync, re-sync, bookkeeping
    read_tokens: int = 0            # new text the draft read in this step (its units)

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.target_seconds + self.host_seconds


class SpeculationPolicy(Protocol):
    max_k: int   # the most tokens a plan may draft

    def plan(self, batch: BatchView) -> StepPlan:
        """k for the next step over `batch`."""
        ...

    def observe(self, record: StepRecord) -> None:
        """What the planned step did and cost."""
        ...
