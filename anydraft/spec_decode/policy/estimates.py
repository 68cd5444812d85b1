"""Running estimates the adaptive policy prices steps with: acceptance by position, and costs by size."""
from __future__ import annotations

import bisect
import itertools
import random
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class MedianCost:
    """Seconds as a function of a size x (tokens a forward reads, rows, k): the median of the last `window`
    measurements at each measured x, made non-decreasing in x (non_decreasing: more work never costs less, so a size
    measured rarely and high is pulled to its well-measured larger neighbours), interpolated linearly between sizes,
    extrapolated along the last segment above them and held at the smallest below them. Medians, so a one-off stall
    (a page fault, a neighbour on the core) does not make a size look dear; each size keeps its own measurements."""
    window: int
    samples: dict[int, deque] = field(default_factory=dict)
    estimates: dict[int, float] = field(default_factory=dict)   # x -> the median at x
    _sizes: list[int] = field(default_factory=list, repr=False)   # sorted sizes, rebuilt when an estimate changes
    _values: list[float] = field(default_factory=list, repr=False)
    _least_rate_below: list[float] = field(default_factory=list, repr=False)

    def observe(self, x: int, seconds: float) -> None:
        recent = self.samples.get(x)
        if recent is None:
            recent = self.samples[x] = deque(maxlen=self.window)
        recent.append(seconds)
        estimate = statistics.median(recent)
        if self.estimates.get(x) != estimate:
            self.estimates[x] = estimate
            self._sizes = []

    def seconds(self, x: int) -> float:
        """0 before any measurement."""
        if not self.estimates:
            return 0.0
        if not self._sizes:
            self._sizes = sorted(self.estimates)
            self._values = non_decreasing([self.estimates[m] for m in self._sizes],
                                          [len(self.samples[m]) for m in self._sizes])
            self._least_rate_below = list(itertools.accumulate((v / m if m else v for m, v in
                                                                zip(self._sizes, self._values)),
                                                               min, initial=float("inf")))
        i = bisect.bisect_left(self._sizes, x)
        # Work over x splits into pieces of a smaller measured size m: never dearer than x/m of them. This bounds a
        # size measured rarely (and once badly) by the sizes measured on every step.
        return min(self._interpolated(x, i), x * self._least_rate_below[i])

    def _interpolated(self, x: int, i: int) -> float:
        sizes, values = self._sizes, self._values
        if i < len(sizes) and sizes[i] == x:
            return values[i]
        if i == 0:
            return values[0]
        lo, hi = (i - 1, i) if i < len(sizes) else (len(sizes) - 2, len(sizes) - 1)
        if lo < 0:   # one size measured, x above it: proportional
            return values[0] * x / sizes[0] if sizes[0] else values[0]
        slope = max((values[hi] - values[lo]) / (sizes[hi] - sizes[lo]), 0.0)
        return values[lo] + slope * (x - sizes[lo])


def non_decreasing(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent violators): a run
    of sizes that costs less than a smaller size takes their weighted mean."""
    pools: list[list[float]] = []   # [mean, weight, sizes pooled]
    for value, weight in zip(values, weights):
        pools.append([value, weight, 1])
        while len(pools) > 1 and pools[-2][0] > pools[-1][0]:
            value_b, weight_b, count_b = pools.pop()
            value_a, weight_a, count_a = pools[-1]
            pools[-1] = [(value_a * weight_a + value_b * weight_b) / (weight_a + weight_b), weight_a + weight_b,
                         count_a + count_b]
    return [mean for mean, _, count in pools for _ in range(count)]


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance a_i (accepted at i given 1..i-1 were), from counts that decay by
    `decay` at each step that drafted (a plain step says nothing new, and must not erase what is known: at batch 1
    that made the posterior widen until drafting was tried again and again where it loses). Position 1's prior is `prior`; a later position's is the estimate of the one before it
    (conditional acceptance rarely falls with depth). The prior is worth `prior_weight` rows of evidence at the start
    and ages like evidence: it decides the first steps, and the steps' evidence decides after."""
    max_k: int
    prior: float
    prior_weight: float
    decay: float
    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    pending_decays: int = 0   # drafting steps not yet applied to the counts
    weight: float = None      # the prior's weight now

    def __post_init__(self):
        self.tried = self.tried or [0.0] * self.max_k
        self.accepted = self.accepted or [0.0] * self.max_k
        self.weight = self.prior_weight if self.weight is None else self.weight

    def observe(self, num_drafted: list[int], num_accepted: list[int]) -> None:
        """One step's rows: positions 1..accepted were accepted, position accepted+1 (where the row drafted it)
        rejected, later ones undecided. A row says nothing of positions it did not draft; a step where no row
        drafted changes nothing."""
        if not any(num_drafted):
            return
        self.pending_decays += 1
        self._decay()
        max_k = self.max_k
        decided, passed = [0] * (max_k + 1), [0] * (max_k + 1)
        for drafted, accepted in zip(num_drafted, num_accepted):
            if drafted:
                reach = accepted + 1 if accepted < drafted else drafted
                decided[reach if reach < max_k else max_k] += 1   # no call per row (tests/engine/test_host_calls.py)
                passed[accepted if accepted < max_k else max_k] += 1
        rows_decided = rows_passed = 0
        for i in range(max_k - 1, -1, -1):   # a row that reached position j decided every position up to j
            rows_decided += decided[i + 1]
            rows_passed += passed[i + 1]
            self.tried[i] += rows_decided
            self.accepted[i] += rows_passed

    def _decay(self) -> None:
        if self.pending_decays:
            factor = self.decay ** self.pending_decays
            self.tried = [t * factor for t in self.tried]
            self.accepted = [a * factor for a in self.accepted]
            self.weight *= factor
            self.pending_decays = 0

    def rates(self) -> list[float]:
        self._decay()
        rates, prior = [], self.prior
        for accepted, tried in zip(self.accepted, self.tried):
            prior = (accepted + prior * self.weight) / (tried + self.weight)
            rates.append(prior)
        return rates

    def drawn_rates(self, rng: random.Random) -> list[float]:
        """Rates drawn from each position's Beta posterior (its counts plus the prior's pseudo-rows): close to
        `rates()` where evidence is plentiful, spread where it is thin, so a policy pricing with them tries again
        what a few early rejections made look bad, and stops trying once the evidence is in (Thompson sampling)."""
        self._decay()
        rates, prior = [], self.prior
        for accepted, tried in zip(self.accepted, self.tried):
            alpha = accepted + prior * self.weight
            beta = tried - accepted + (1.0 - prior) * self.weight
            prior = rng.betavariate(max(alpha, 1e-9), max(beta, 1e-9))
            rates.append(prior)
        return rates

    def expected_tokens(self, rates: list[float] | None = None) -> list[float]:
        """[E(0), ..., E(max_k)]: E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i, the tokens a row appends drafting k
        (a_i: `rates()` unless given)."""
        totals, survive = [1.0], 1.0
        for rate in self.rates() if rates is None else rates:
            survive *= rate
            totals.append(totals[-1] + survive)
        return totals


@dataclass
class ReadCost:
    """The draft's seconds per token of new text it reads (prompts of joining rows, text of plain steps): seconds
    over tokens of the last `window` reads together, so the large reads, timed best, weigh most."""
    window: int
    reads: deque = None

    def __post_init__(self):
        self.reads = deque(maxlen=self.window)

    def observe(self, tokens: int, seconds: float) -> None:
        self.reads.append((tokens, max(seconds, 0.0)))

    def seconds(self, tokens: int) -> float:
        """0 until a read is measured."""
        total_tokens = sum(t for t, _ in self.reads)
        return tokens * sum(s for _, s in self.reads) / total_tokens if total_tokens else 0.0
