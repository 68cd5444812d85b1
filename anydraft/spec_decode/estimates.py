"""Running estimates behind adaptive speculation: per-position acceptance, forward costs by size, the draft's
cost of reading text, and whole steps measured by batch size and k (each fed by observed steps)."""
from __future__ import annotations

import bisect
import itertools
import statistics
from collections import deque
from dataclasses import dataclass, field

# Prior acceptance of position 1 before it is tried: optimistic enough that a new draft gets tried at all. A later
# position's prior is the estimate of the one before it: conditional acceptance rarely falls with depth (measured
# on the grown qwen3 pair: 0.87, 0.90, 0.91), and a fixed prior of 0.7 for positions that steps drafting 1 token
# never try priced k = 3 at E = 2.9 where it gave 3.36, so adaptive kept drafting 1 (0.86x fixed k = 3).
PRIOR_ACCEPTANCE = 0.7
PRIOR_WEIGHT = 4.0      # pseudo-observations the prior is worth: a few early rejections must not stop drafting
DECAY = 0.98            # per observed step: old evidence fades, so the estimate follows the text being written
# A batch size's whole steps, once MEASURED_MIN of them ran at a k, price that k: their median seconds replace the sum
# of its parts' estimates, and the tokens they appended (a mean with little noise at large batches, much at batch 1)
# move its expected tokens from the acceptance estimate's, which counts as PRIOR_ROW_STEPS row-steps. The ks not run
# there are priced by their parts scaled as the measured ones were off. Each part's median carries its own noise and
# the parts miss work between them: at batch 16 on the shipped pair the parts priced k = 1 within a few % of k = 0
# where its steps cost 18% more per token, and a process whose parts put k = 1 ahead kept drafting (0.89x the target
# alone). A measurement prices its k for MEASURED_FOR steps: then the parts price it again.
MEASURED_MIN = 3
MEASURED_FOR = 256
PRIOR_ROW_STEPS = 64
# A batch size without its own measurement at k borrows the nearest one within NEAR_ROWS times it, as a ratio to the
# parts' price there: a batch that shrinks as requests finish (16, 15, ... 1) met a batch size no step had run at on
# nearly every step, where the parts alone priced drafting within the margin of a plain step at 13-15 rows while 16
# rows had measured k = 2 at 1.12x it (the grown qwen3 pair: 0.83-0.88x fixed k = 3 in two of three processes).
# Rival re-timing counts a re-timing at any batch size within the same bound, which the measurement then serves.
NEAR_ROWS = 2


def near_rows(rows: int, other: int) -> bool:
    """Whether two batch sizes are within NEAR_ROWS times each other."""
    return rows <= other * NEAR_ROWS and other <= rows * NEAR_ROWS


@dataclass
class MedianCost:
    """Seconds of a forward as a function of its size x (tokens it reads, or rows): the median of the last `window`
    measurements at each measured x, interpolated linearly between sizes and extrapolated along the last segment.
    Medians, so that every size is judged by the same statistic of its typical cost: a timed forward also holds
    one-off work now and then (a page fault, another process on the core), which must not make it look dear, and
    a running minimum (tried before) made the sizes measured on every step look cheaper than the ones measured
    rarely, so adaptive kept choosing whatever it had chosen. The window lets it follow a forward that really
    got slower (longer contexts). Each x keeps its own measurements: evidence at one size never fades another's."""
    window: int = 15
    samples: dict[int, deque] = field(default_factory=dict)
    estimates: dict[int, float] = field(default_factory=dict)   # x -> its current median (the estimate at x)
    # The estimates sorted by size, with the least seconds-per-unit below each: rebuilt when an estimate changes,
    # so that pricing every k of a step is a few bisections (this runs on every step, beside millisecond forwards).
    _sizes: list[int] = field(default_factory=list, repr=False)
    _values: list[float] = field(default_factory=list, repr=False)
    _least_rate_below: list[float] = field(default_factory=list, repr=False)

    def observe(self, x: int, seconds: float) -> None:
        recent = self.samples.setdefault(x, deque(maxlen=self.window))
        recent.append(seconds)
        estimate = statistics.median(recent)
        if self.estimates.get(x) != estimate:
            self.estimates[x] = estimate
            self._sizes = []

    def seconds(self, x: int) -> float:
        if not self.estimates:
            return 0.0
        if not self._sizes:
            self._sizes = sorted(self.estimates)
            self._values = [self.estimates[m] for m in self._sizes]
            self._least_rate_below = list(itertools.accumulate((v / m for m, v in zip(self._sizes, self._values)),
                                                               min, initial=float("inf")))
        i = bisect.bisect_left(self._sizes, x)
        # A forward over x never costs more than x/m forwards over m (the work splits); this bounds a size
        # measured once, badly, by the sizes below it, which every step re-measures.
        return min(self._interpolated(x, i), x * self._least_rate_below[i])

    def _interpolated(self, x: int, i: int) -> float:
        """i: the first measured size >= x."""
        sizes, values = self._sizes, self._values
        if i < len(sizes) and sizes[i] == x:
            return values[i]
        if i == 0:              # smaller than anything measured: no cheaper than the smallest measured
            return values[0]
        if i < len(sizes):
            lo, hi = i - 1, i
        elif len(sizes) > 1:    # beyond the largest: along the last segment
            lo, hi = len(sizes) - 2, len(sizes) - 1
        else:                   # one size measured: proportional
            return values[0] * x / sizes[0]
        slope = max((values[hi] - values[lo]) / (sizes[hi] - sizes[lo]), 0.0)
        return values[lo] + slope * (x - sizes[lo])


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance a_i, from decayed counts of (tried, accepted) at each position."""
    max_k: int
    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    # Steps that tried nothing since the counts were last decayed: their decay is applied when the counts are next
    # read or added to (a plain step then costs one increment, not two passes over the counts).
    pending_decays: int = 0

    def __post_init__(self):
        self.tried = self.tried or [0.0] * self.max_k
        self.accepted = self.accepted or [0.0] * self.max_k

    def observe(self, num_drafted: list[int], num_accepted: list[int]) -> None:
        """One step: in each row, positions 1..num_accepted were accepted, position num_accepted+1 (if that row
        drafted it) was rejected, later ones were never decided. A row that drafted fewer than the step's k (a
        capped request, a SLEM row) says nothing about the positions it did not draft. Older evidence decays
        once per step."""
        self.count_step()   # every step decays the counts once
        if not any(num_drafted):   # a plain step: nothing tried (no loop over its rows)
            return
        self._decay()
        # Rows by how many of their first positions were decided (accepted, or the rejected one) and accepted:
        # counted in one pass without a call per row, then added to every position they cover.
        max_k = self.max_k
        decided, passed = [0] * (max_k + 1), [0] * (max_k + 1)
        for drafted, accepted in zip(num_drafted, num_accepted):
            if drafted:   # accepted <= drafted; the rejected position is decided only where the row drafted it
                reach = accepted + 1 if accepted < drafted else drafted
                decided[reach if reach < max_k else max_k] += 1
                passed[accepted if accepted < max_k else max_k] += 1
        rows_decided = rows_passed = 0
        for i in range(max_k - 1, -1, -1):
            rows_decided += decided[i + 1]
            rows_passed += passed[i + 1]
            self.tried[i] += rows_decided
            self.accepted[i] += rows_passed

    def count_step(self) -> None:
        """One more step: the counts decay once more (applied when next read or added to); all a step that drafted
        nothing does here."""
        self.pending_decays += 1

    def _decay(self) -> None:
        if self.pending_decays:
            factor = DECAY ** self.pending_decays
            self.tried = [t * factor for t in self.tried]
            self.accepted = [a * factor for a in self.accepted]
            self.pending_decays = 0

    def rates(self) -> list[float]:
        self._decay()
        rates, prior = [], PRIOR_ACCEPTANCE
        for accepted, tried in zip(self.accepted, self.tried):
            prior = (accepted + prior * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT)
            rates.append(prior)
        return rates

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a row appends in a step that drafts k."""
        return self.expected_tokens_upto(k)[k]

    def expected_tokens_upto(self, max_k: int) -> list[float]:
        """[E(0), ..., E(max_k)]."""
        totals, survive = [1.0], 1.0
        for rate in self.rates()[:max_k]:
            survive *= rate
            totals.append(totals[-1] + survive)
        return totals


@dataclass
class ReadCost:
    """The draft's seconds per token of the new prompts it reads (the forward, and tokenizing them where the proposer
    does that at the first draft), counted in the proposer's unit (Proposer.unread_tokens): seconds over tokens of the
    last `window` reads together, so the large reads, timed best, weigh most."""
    window: int = 8
    reads: deque = field(default_factory=lambda: deque(maxlen=8))   # (tokens, seconds)

    def observe(self, tokens: int, seconds: float) -> None:
        self.reads.append((tokens, max(seconds, 0.0)))

    def seconds(self, tokens: int) -> float:
        """0 until a read is measured (drafting is then priced as if the text were read already)."""
        total_tokens = sum(t for t, _ in self.reads)
        return tokens * sum(s for _, s in self.reads) / total_tokens if total_tokens else 0.0


@dataclass
class MeasuredSteps:
    """Whole steps by (rows, k): seconds and tokens appended of the last `window` such steps that are at most
    MEASURED_FOR steps old, once there are MEASURED_MIN of them."""
    window: int = 15
    steps: dict[tuple[int, int], deque] = field(default_factory=dict)   # (rows, k) -> (step number, tokens, seconds)
    rows_by_k: dict[int, set[int]] = field(default_factory=dict)        # k -> the batch sizes with steps at k

    def observe(self, step: int, rows: int, k: int, tokens: int, seconds: float) -> None:
        self.steps.setdefault((rows, k), deque(maxlen=self.window)).append((step, tokens, seconds))
        self.rows_by_k.setdefault(k, set()).add(rows)

    def measured(self, step: int, rows: int, k: int) -> tuple[float, int, int] | None:
        """(median seconds, tokens appended, steps) of the recent steps, or None if too few."""
        recent = [(tokens, seconds) for n, tokens, seconds in self.steps.get((rows, k), ()) if step - n < MEASURED_FOR]
        if len(recent) < MEASURED_MIN:
            return None
        return statistics.median(s for _, s in recent), sum(t for t, _ in recent), len(recent)

    def nearest(self, step: int, rows: int, k: int) -> tuple[int, tuple[float, int, int]] | None:
        """(batch size, its measurement) at k: `rows`' own, else the nearest batch size within NEAR_ROWS times it
        (the larger on a tie: more rows, less noise) that has one; None if none has."""
        if (found := self.measured(step, rows, k)) is not None:
            return rows, found
        near = sorted((r for r in self.rows_by_k.get(k, ()) if r != rows and near_rows(rows, r)),
                      key=lambda r: (abs(r - rows), -r))
        for r in near:
            if (found := self.measured(step, r, k)) is not None:
                return r, found
        return None
