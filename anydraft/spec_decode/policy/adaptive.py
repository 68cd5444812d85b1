"""The adaptive policy: each step drafts the k in 0..max_k with the most expected tokens per second.

Tokens. A row drafting k appends E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i, with a_i the running acceptance of position i
given 1..i-1 were accepted, kept for greedy rows and for sampled rows apart (evidence ages with the steps that draft);
a batch's E mixes them by rows.
Seconds. C(B, k) = T(B(k+1)) + D(B, k) + H(k) + reading, each part the median of its recent measurements at that
size (interpolated between measured sizes):
  T  the target's verification forward, by the tokens it reads;
  D  the proposal: its first draft forward over B rows, then F(k) - 1 further ones (F: forwards a proposal of k
     costs, from the proposer: k for a token per forward, 1 for a block drafter); 0 for k = 0;
  H  host work of a step drafting k (scheduling, planning, verification, the sync, re-sync, outputs);
  reading  text the draft has yet to read, at its measured seconds per token, spread over the tokens the rows may
     still write (a short output does not start a draft whose reading it cannot earn back).
Greedy and sampled steps keep separate costs (they run different heads). Everything is measured on real steps: the
first step drafts max_k (the draft's cost is unknown until it drafts), and nothing is timed at load.
Choice. k* = argmax B E(k) / C(B, k), with the a_i of E drawn from their posteriors (Thompson sampling): where
evidence is thin (batch 1, after a few early rejections) the draws spread and drafting is tried again; where it is
plentiful they sit on the estimate. Drafting must be priced `draft_margin` faster than the plain step. At each
batch size (by powers of two) the plain step and the ks next to the choice are re-measured once when not chosen
for `memory_steps` steps: by then the evidence behind their price has lost half its weight. A size first seen
takes over when each k was last chosen from the size the step before was at (a batch that shrinks as its requests
end does not re-measure everything on arriving at each smaller size).
Every row of a step verifies the same k, so the output is the target's whatever k is chosen.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .estimates import AcceptanceEstimate, MedianCost, ReadCost
from .records import BatchView, StepPlan, StepRecord


@dataclass(frozen=True)
class AdaptiveParams:
    """The policy's only tunable parameters."""
    prior_acceptance: float = 0.7   # acceptance assumed at a draft position before any step tried it
    prior_weight: float = 4.0       # rows of evidence that assumption is worth
    memory_steps: int = 32          # steps after which evidence weighs half; also a size's cost window, re-measure gap
    draft_margin: float = 1.05      # how much faster than a plain step a drafting step must be priced to be chosen

    def __post_init__(self):
        if not 0.0 < self.prior_acceptance < 1.0:
            raise ValueError(f"prior_acceptance must be in (0, 1), got {self.prior_acceptance}")
        if not self.prior_weight > 0.0:
            raise ValueError(f"prior_weight must be > 0 rows, got {self.prior_weight}")
        if not (isinstance(self.memory_steps, int) and self.memory_steps >= 1):
            raise ValueError(f"memory_steps must be an integer >= 1, got {self.memory_steps!r}")
        if not self.draft_margin >= 1.0:
            raise ValueError(f"draft_margin must be >= 1 (1 = no margin), got {self.draft_margin}")

    @property
    def decay(self) -> float:
        """The weight a step's evidence keeps at each later step."""
        return 0.5 ** (1.0 / self.memory_steps)


@dataclass
class StepCosts:
    """Measured costs of one kind of step (greedy or sampled)."""
    window: int
    target: MedianCost = None        # verification forward, by tokens read
    draft_first: MedianCost = None   # a proposal's first draft forward, by rows
    draft_next: MedianCost = None    # each further one, by rows
    host: dict[int, deque] = field(default_factory=dict)       # k -> recent host seconds
    host_median: dict[int, float] = field(default_factory=dict)   # k -> their median (kept as they come: plans read it)

    def __post_init__(self):
        self.target, self.draft_first, self.draft_next = (MedianCost(self.window) for _ in range(3))

    def observe_host(self, k: int, seconds: float) -> None:
        recent = self.host.get(k)
        if recent is None:
            recent = self.host[k] = deque(maxlen=self.window)
        recent.append(seconds)
        self.host_median[k] = statistics.median(recent)

    def host_seconds(self, k: int) -> float:
        """Measured at k, else at the nearest k of the same kind (drafting or not), else the nearest at all."""
        if k in self.host_median:
            return self.host_median[k]
        pool = [j for j in self.host_median if (j > 0) == (k > 0)] or list(self.host_median)
        return self.host_median[min(pool, key=lambda j: (abs(j - k), j))] if pool else 0.0


def one_forward_per_token(num_tokens: int) -> int:
    return num_tokens


class AdaptiveK:
    """Plans k per step from its records alone (see the module docstring)."""

    def __init__(self, max_k: int, draft_forwards: Callable[[int], int] = one_forward_per_token,
                 params: AdaptiveParams | None = None, seed: int = 0):
        if max_k < 1:
            raise ValueError(f"adaptive speculation needs max_k >= 1, got {max_k}")
        self.max_k, self.draft_forwards = max_k, draft_forwards
        self.params = params or AdaptiveParams()
        p = self.params
        self.acceptance = {sampled: AcceptanceEstimate(max_k, p.prior_acceptance, p.prior_weight, p.decay)
                           for sampled in (False, True)}
        self.costs = {sampled: StepCosts(p.memory_steps) for sampled in (False, True)}
        self.read = ReadCost(p.memory_steps)
        self.rng = random.Random(seed)   # the posterior draws (its own stream: runs repeat)
        self._plans = [StepPlan(k) for k in range(max_k + 1)]
        self._clock = 0                                           # steps planned
        self._last: dict[tuple[bool, int], dict[int, int]] = {}   # (sampled, size class) -> k -> step last chosen
        self._latest: dict[bool, tuple[bool, int]] = {}           # sampled -> the size class it last planned for

    # -- pricing ---------------------------------------------------------------------------------------------
    def expected_tokens(self, batch: BatchView, drawn: bool = False) -> list[float]:
        """[E(0), ..., E(max_k)] for a row of this batch, greedy and sampled rows mixed by count (drawn: from
        acceptance rates drawn from their posteriors, else from their estimates)."""
        share = batch.sampled_rows / batch.rows
        greedy, sampled = ([estimate.expected_tokens(estimate.drawn_rates(self.rng) if drawn and weight else None)
                            for estimate, weight in ((self.acceptance[False], 1 - share),
                                                     (self.acceptance[True], share))])
        return [(1 - share) * g + share * s for g, s in zip(greedy, sampled)]

    def rates(self, batch: BatchView, drawn: bool = False) -> list[float]:
        """Expected tokens per second of a step over `batch` drafting k, for k = 0..max_k (drawn: see
        expected_tokens)."""
        rows, costs = batch.rows, self.costs[batch.sampled_rows > 0]
        expected = self.expected_tokens(batch, drawn)
        reading = (self.read.seconds(batch.unread_tokens) / max(batch.remaining_tokens, 1.0)
                   if batch.unread_tokens else 0.0)   # seconds per token written
        rates = []
        for k in range(self.max_k + 1):
            seconds = self._parts(costs, rows, k) + (reading * expected[k] if k else 0.0)
            rates.append(rows * expected[k] / seconds if seconds > 0 else math.inf)
        return rates

    def _parts(self, costs: StepCosts, rows: int, k: int) -> float:
        return costs.target.seconds(rows * (k + 1)) + self._proposal(costs, rows, k) + costs.host_seconds(k)

    def _proposal(self, costs: StepCosts, rows: int, k: int) -> float:
        if not k:
            return 0.0
        first = costs.draft_first.seconds(rows)
        later = costs.draft_next.seconds(rows) if costs.draft_next.estimates else first
        return first + (self.draft_forwards(k) - 1) * later

    def beliefs(self) -> dict:
        """What the policy has learnt, for reports: per kind of step (greedy, sampled) the acceptance by position
        and the measured costs in ms by size (target: by tokens read; draft: by rows)."""
        out = {}
        for sampled, name in ((False, "greedy"), (True, "sampled")):
            costs = self.costs[sampled]
            if not costs.target.estimates:
                continue
            parts = {part: getattr(costs, part).estimates for part in ("target", "draft_first", "draft_next")}
            out[name] = {"acceptance_by_position": [round(r, 3) for r in self.acceptance[sampled].rates()],
                         **{f"{part}_ms": {x: round(v * 1e3, 2) for x, v in sorted(estimates.items())}
                            for part, estimates in parts.items()},
                         "host_ms": {k: round(v * 1e3, 2) for k, v in sorted(costs.host_median.items())}}
        return out

    # -- the protocol ----------------------------------------------------------------------------------------
    def plan(self, batch: BatchView) -> StepPlan:
        sampled = batch.sampled_rows > 0
        key = (sampled, batch.rows.bit_length())
        self._clock += 1
        clock = self._clock
        last = self._last.get(key)
        if last is None:   # a size class's first step: priced from the size it came from, as fresh as that was
            previous = self._latest.get(sampled)
            last = self._last[key] = dict(self._last[previous]) if previous else {}
        self._latest[sampled] = key
        if not self.costs[key[0]].draft_first.estimates:   # unknown until a step drafts: draft the most, measure it
            k = self.max_k
        else:
            rates = self.rates(batch, drawn=True)
            best = max(range(self.max_k + 1), key=lambda j: (rates[j], j))
            if best and rates[best] < self.params.draft_margin * rates[0]:
                best = 0
            stale = [j for j in {0, best - 1, best + 1} - {best}
                     if 0 <= j <= self.max_k and clock - last.get(j, -math.inf) > self.params.memory_steps]
            k = max(stale, key=lambda j: (rates[j], j)) if stale else best
        last[k] = clock
        return self._plans[k]

    def observe(self, record: StepRecord) -> None:
        batch, k = record.batch, record.k
        rows, sampled = batch.rows, batch.sampled_rows > 0
        costs = self.costs[sampled]
        self._observe_acceptance(record)
        reading = bool(k) and record.read_tokens >= rows   # a token a row or more: the draft read text first
        target_tokens = rows + sum(record.num_drafted)
        if k and reading:
            if costs.draft_first.estimates:
                self.read.observe(record.read_tokens, record.draft_seconds - self._proposal(costs, rows, k))
        elif k:
            later = min(record.later_draft_seconds, record.draft_seconds)
            costs.draft_first.observe(rows, record.draft_seconds - later)
            forwards = self.draft_forwards(k)
            if forwards > 1:
                costs.draft_next.observe(rows, later / (forwards - 1))
        costs.target.observe(target_tokens, record.target_seconds)
        costs.observe_host(k, record.host_seconds)

    def _observe_acceptance(self, record: StepRecord) -> None:
        if not record.k:
            return
        if record.sampled is None:
            self.acceptance[False].observe(record.num_drafted, record.num_accepted)
            return
        for mode in (False, True):
            rows = [i for i, s in enumerate(record.sampled) if s == mode]
            if rows:
                self.acceptance[mode].observe([record.num_drafted[i] for i in rows],
                                              [record.num_accepted[i] for i in rows])
