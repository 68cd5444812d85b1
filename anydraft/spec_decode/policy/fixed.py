"""The fixed policy: every step drafts max_k tokens a row."""
from __future__ import annotations

from dataclasses import dataclass

from .records import BatchView, StepPlan, StepRecord


@dataclass
class FixedK:
    max_k: int

    def __post_init__(self):
        if self.max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {self.max_k}")
        self._plan = StepPlan(self.max_k)

    def plan(self, batch: BatchView) -> StepPlan:
        return self._plan

    def observe(self, record: StepRecord) -> None:
        pass
