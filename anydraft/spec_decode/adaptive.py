"""Adaptive speculation: how many tokens to draft this step (0 = plain target decode), chosen to maximise
expected tokens per second from running acceptance estimates and a cost model of the step.

Expected tokens of a step that drafts k tokens per row: E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i, where a_i is
the running rate at which position i is accepted given that positions 1..i-1 were (an acceptance at i needs
all earlier ones). The step's seconds: T_verify(B, k) + k * T_draft(B) + T_host, where the target forward
over B rows of k+1 tokens and one draft forward over B rows are linear in the number of tokens they read
(c0 + c1 * tokens), fitted from forwards timed at load and refreshed from every step's measured times.
The choice is per step for the whole batch: every row verifies the same k, so the output stays lossless
whatever k is (greedy: identical to the target alone; sampling: the same distribution).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Prior acceptance for positions never tried yet: optimistic enough that a new draft gets tried at all.
PRIOR_ACCEPTANCE = 0.7
PRIOR_WEIGHT = 4.0      # pseudo-observations the prior is worth: a few early rejections must not stop drafting
DECAY = 0.98            # per observed step: old evidence fades, so the estimate follows the text being written


@dataclass
class LinearCost:
    """Seconds of a forward as c0 + c1 * tokens (tokens = rows x new tokens per row), kept as running sums of
    (tokens, seconds) so every timed forward refines the fit (a least-squares line, decayed)."""
    decay: float = 0.95
    _n: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self._n, self._sx, self._sy = d * self._n + 1, d * self._sx + tokens, d * self._sy + seconds
        self._sxx, self._sxy = d * self._sxx + tokens * tokens, d * self._sxy + tokens * seconds

    def seconds(self, tokens: int) -> float:
        if self._n == 0:
            return 0.0
        mean_x, mean_y = self._sx / self._n, self._sy / self._n
        var_x = self._sxx / self._n - mean_x * mean_x
        slope = max((self._sxy / self._n - mean_x * mean_y) / var_x, 0.0) if var_x > 1e-12 else 0.0
        intercept = max(mean_y - slope * mean_x, 0.0)
        return intercept + slope * tokens


@dataclass
class FloorCost:
    """Seconds of one draft forward by rows, as a running floor: a step's draft time also holds one-off work
    (the draft reading a new prompt, or catching up on text written by steps that did not draft), which must
    not make drafting look dear for good. A new measurement lowers the floor at once; the floor rises by
    `drift` per measurement, so it follows a draft that really got slower (longer contexts)."""
    drift: float = 0.02
    floors: dict[int, float] = field(default_factory=dict)

    def observe(self, rows: int, seconds: float) -> None:
        floor = self.floors.get(rows)
        self.floors[rows] = seconds if floor is None else min(seconds, floor * (1 + self.drift))

    def seconds(self, rows: int) -> float:
        """At the nearest measured row count, scaled by rows where only smaller counts were measured."""
        if not self.floors:
            return 0.0
        nearest = min(self.floors, key=lambda r: (abs(r - rows), r))
        return self.floors[nearest] * (rows / nearest if rows > nearest else 1.0)


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance a_i, from decayed counts of (tried, accepted) at each position."""
    max_k: int
    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.tried = self.tried or [0.0] * self.max_k
        self.accepted = self.accepted or [0.0] * self.max_k

    def observe(self, num_drafted: int, num_accepted: list[int]) -> None:
        """One step: in each row, positions 1..num_accepted were accepted, position num_accepted+1 (if drafted)
        was rejected, later ones were never decided. Older evidence decays once per step."""
        for i in range(self.max_k):
            self.tried[i] *= DECAY
            self.accepted[i] *= DECAY
        for accepted in num_accepted:
            for i in range(min(accepted + 1, num_drafted)):
                self.tried[i] += 1.0
                self.accepted[i] += 1.0 if i < accepted else 0.0

    def rates(self) -> list[float]:
        return [(a + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT) for a, t in zip(self.accepted, self.tried)]

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a row appends in a step that drafts k."""
        total, survive = 1.0, 1.0
        for rate in self.rates()[:k]:
            survive *= rate
            total += survive
        return total


@dataclass
class AdaptiveSpeculation:
    """Picks k in 0..max_k for each step; learns from what each step accepted and how long its parts took."""
    max_k: int
    acceptance: AcceptanceEstimate = None
    target_cost: LinearCost = field(default_factory=LinearCost)   # target forward + head, by tokens read
    draft_cost: FloorCost = field(default_factory=FloorCost)      # one draft forward + head, by rows
    host_seconds: float = 0.0                                      # per step, outside the model forwards
    history: dict[int, int] = field(default_factory=dict)         # k -> steps that used it

    def __post_init__(self):
        if self.acceptance is None:
            self.acceptance = AcceptanceEstimate(self.max_k)

    def expected_rate(self, rows: int, k: int) -> float:
        """Expected tokens per second of a step over `rows` rows drafting k each."""
        seconds = (self.target_cost.seconds(rows * (k + 1)) + k * self.draft_cost.seconds(rows)
                   + self.host_seconds)
        return rows * self.acceptance.expected_tokens(k) / seconds if seconds > 0 else float("inf")

    def choose(self, rows: int) -> int:
        if not self.draft_cost.floors:   # the draft's cost is unknown until a step drafts: measure it first
            best = self.max_k
            self.history[best] = self.history.get(best, 0) + 1
            return best
        rates = [self.expected_rate(rows, k) for k in range(self.max_k + 1)]
        best = max(range(self.max_k + 1), key=lambda k: (rates[k], k))
        self.history[best] = self.history.get(best, 0) + 1
        return best

    def observe_step(self, rows: int, k: int, num_accepted: list[int], draft_seconds: float | None,
                     target_seconds: float, host_seconds: float) -> None:
        """What a step of `rows` rows drafting k accepted, and the measured seconds of its parts (draft_seconds
        None: the draft also read new prompts this step, so its time says nothing of a draft step's cost)."""
        self.acceptance.observe(k, num_accepted)
        self.target_cost.observe(rows * (k + 1), target_seconds)
        if k and draft_seconds is not None:
            self.draft_cost.observe(rows, draft_seconds / k)
        self.host_seconds = 0.9 * self.host_seconds + 0.1 * host_seconds if self.host_seconds else host_seconds
