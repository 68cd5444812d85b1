"""Adaptive speculation: how many tokens to draft this step (0 = plain target decode), chosen to maximise
expected tokens per second from running acceptance estimates and a cost model of the step.

Expected tokens of a step that drafts k tokens per row: E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i, where a_i is
the running rate at which position i is accepted given that positions 1..i-1 were (an acceptance at i needs
all earlier ones). The step's seconds: T_verify(B * (k+1) tokens) + T_first(B rows) + (F(k) - 1) * T_next(B rows)
+ T_host, where F(k) is the number of draft forwards a proposal of k costs (the proposer says: k for a draft that
writes a token per forward, 1 for a block drafter), T_first the proposal's first forward with the work a proposal
does once (feeding the text verified since the last one), T_next each further forward; each cost the median of its
recent measured times at each size, interpolated between sizes (target forwards timed at load, then every step
refines them). Where a batch size (or
one near it) has run whole steps at a k, their seconds and appended tokens price it instead (see
estimates.MeasuredSteps). A step that stops drafting still probes now and then, so a cost or rate measured wrongly
once is measured again; where the proposer can, a greedy probe drafts for one row only (the draft then reads one prompt
and one row's text, not the batch's).
The prompts of requests that joined are read by the draft once, by the first step that drafts for those rows:
their seconds, at the draft's measured seconds per token read, are spread over the steps left to write the rows'
remaining tokens (R / E(k) of them), so that short outputs do not start a draft whose prompt reading they cannot
earn back.
The choice is per step for the whole batch: every row verifies the same k, so the output stays lossless
whatever k is (greedy: identical to the target alone; sampling: the same distribution).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from .estimates import PRIOR_ROW_STEPS, AcceptanceEstimate, MeasuredSteps, MedianCost, ReadCost, near_rows

# Steps in a row without drafting before a probe step drafts anyway: a draft cost or acceptance measured badly
# once (a noisy step) would otherwise never be measured again. The interval doubles after every probe that
# changes nothing (probing costs at most about 1/interval of throughput), back to the start once drafting wins.
PROBE_AFTER = 16
PROBE_AFTER_MAX = 512
# While drafting, a rival k priced within RIVAL_WITHIN of the best and not chosen for RIVAL_AFTER steps is chosen
# once: the sizes a step never verifies are priced from forwards timed at load, and an estimate that stays stale
# kept the grown qwen3 pair at k = 1 (0.86-0.92x fixed k = 3). At most one step in RIVAL_AFTER, within 10%. So are
# measured drafting ks priced within 10% behind a chosen plain step, per batch size: nothing else re-measures them
# (probes draft one row), and one run of the grown pair stayed plain on 98% of batch-16 row-steps (0.95x fixed k = 3)
# where a traced process drafted k = 2 at 0.96-1.0x.
RIVAL_WITHIN = 0.9
RIVAL_AFTER = 32
# The plain step is re-timed the same way at a batch size where drafting is chosen, within a wider bound: a plain step
# is the safe choice, and its price from one slow calibration (5.8 ms for a 4.3 ms step at batch 16 on the shipped
# pair) kept a process drafting k = 1 there, never timing a plain step again.
PLAIN_RIVAL_WITHIN = 0.75
# Drafting is chosen over a plain step only when priced at least this much faster: its estimate carries the noise of
# more measured parts, and a plain step is the safe side. On the shipped pair at batch 16 the model priced k = 1
# 5% below k = 0 and the steps measured 0.95x; a process whose estimates put k = 1 ahead drafted on most steps at
# 0.89x the target alone.
DRAFT_MARGIN = 1.05
# A plain step chosen while every drafting k is priced at most HOLD_BELOW of it is chosen again, unpriced, for the
# next HOLD_STEPS steps at that batch size (probes still come on time): pricing six ks touches enough Python state to
# cost ~0.1 ms of a plain step in place (2% at batch 16 on the shipped pair, against 14 us timed warm), and evidence
# that far apart does not flip within a few plain steps. Nor is a held step measured (the plain steps priced around
# it are): in four process pairs step-interleaved with the target alone at batch 16, not measuring them moved
# adaptive from 0.92-0.96x to 0.95-0.98x of it. The prompts waiting to be read must be the ones priced (as
# rows write, their reading only gets dearer per token left to write). Priced closer (within the drafting margin), a
# plain step is held for HOLD_CLOSE_STEPS, then twice as long after each plain step chosen on pricing in a row at that
# batch size (far or close), up to HOLD_STEPS: at batch 16 on the shipped pair (k = 1 priced within 3% of plain)
# pricing every step cost 0.1-0.18 ms of each 5 ms plain step, every third step still 63 us a step on average (timed
# in place); a switch to drafting a few steps late costs less.
HOLD_BELOW = 0.9
HOLD_STEPS = 8
HOLD_CLOSE_STEPS = 2
# A drafting k chosen on pricing (not a rival's re-timing) with the plain step priced at most HOLD_BELOW of it is
# chosen again, unpriced, for the next DRAFT_HOLD_STEPS steps at that batch size: priced on every step, the choice
# cost ~0.1 ms of each 2.5-3.5 ms drafting step at batch 1-4 on the shipped pair (3% of the run, timed in place), and
# the ks that win there lie within a few % of each other, so a few steps on the runner-up cost less. Priced closer to
# a plain step (batch 16 on the shipped pair), drafting is not held: a wrong choice there costs a dear step, held it
# cost five. A held drafting step is measured like a priced one (the engine times a step's parts after the choice).
# Not where prompts wait to be read: the step that drafts reads them, and the next is priced without them.
DRAFT_HOLD_STEPS = 4


def one_forward_per_token(num_tokens: int) -> int:
    return num_tokens


@dataclass
class AdaptiveSpeculation:
    """Picks k in 0..max_k for each step; learns from what each step accepted and how long its parts took."""
    max_k: int
    acceptance: AcceptanceEstimate = None
    target_cost: MedianCost = field(default_factory=MedianCost)     # target forward + head, by tokens read
    # The draft's proposal, by rows: its first forward (with what a proposal does once), and each further forward.
    # One cost per forward (the proposal's seconds / F(k)) priced k = 5 at 1.6x its measured seconds where steps
    # drafting 1 set it (their first forward, feeding 2-6 verified tokens a row, is the dear one: 0.45 ms against
    # 0.23 ms for each further one at 4 rows on the shipped pair), and k = 1 too cheap where steps drafting 5 did.
    draft_cost: MedianCost = field(default_factory=MedianCost)
    draft_next_cost: MedianCost = field(default_factory=MedianCost)
    read_cost: ReadCost = field(default_factory=ReadCost)           # the draft reading new prompts, by tokens
    # whole steps (drafting k for every row, reading no new prompt), by rows and k
    measured_steps: MeasuredSteps = field(default_factory=MeasuredSteps)
    # k -> seconds per step outside the model forwards (running mean): a drafting step's host work (verifying
    # k + 1 positions, every row's re-sync) is not a plain step's (a backlog append), and one mean for both made
    # drafting look cheap at large batches.
    host_seconds: dict[int, float] = field(default_factory=dict)
    history: dict[int, int] = field(default_factory=dict)         # k -> steps that used it
    draft_forwards: Callable[[int], int] = one_forward_per_token   # F(k): the proposer's Proposer.draft_forwards
    probing: bool = False   # whether the last choice is a probe (the engine may then draft for one row only)
    # Per batch-size class (rows.bit_length()): [steps without drafting, steps before the next probe]. A batch's
    # last few rows draft (it pays there); one back-off for every size then sent the next full batch back to probing
    # every 16 steps, each probe a dear step at 16 rows (measured: 0.91x the target alone where it never drafted).
    _probes: dict[int, list[int]] = field(default_factory=dict)
    _last_at: dict[int, dict[int, int]] = field(default_factory=dict)   # k -> rows -> the step that last chose it
    # rows -> (the k held, steps it is still chosen unpriced, the unread prompt tokens it was priced with, the hold a
    # plain step priced close gets now: doubled at each plain step chosen on pricing in a row, far or close)
    _held: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    _unpriced: bool = False   # the last choice was held: a held plain step is not measured (see observe_step)
    _steps: int = 0

    def __post_init__(self):
        if self.acceptance is None:
            self.acceptance = AcceptanceEstimate(self.max_k)

    def expected_rates(self, rows: int, unread_tokens: int = 0, remaining_tokens: float = float("inf")
                       ) -> list[float]:
        """Expected tokens per second of a step over `rows` rows drafting k each, for k = 0..max_k (every step).
        unread_tokens: text the draft must read before it drafts for these rows; remaining_tokens: the tokens a row
        is still expected to write (the read is spread over the steps that take)."""
        read_seconds = self.read_cost.seconds(unread_tokens) / max(remaining_tokens, 1.0)   # per token written
        expected = self.acceptance.expected_tokens_upto(self.max_k)
        tokens, seconds = self._measured(rows, expected, self._parts(rows))
        # Reading adds read_seconds for each token a row writes.
        return [rows * e / step if (step := s + (read_seconds * e if k else 0.0)) > 0 else float("inf")
                for k, (e, s) in enumerate(zip(tokens, seconds))]

    def _measured(self, rows: int, expected: list[float], parts_seconds: list[float]
                  ) -> tuple[list[float], list[float]]:
        """Tokens a row appends and step seconds for k = 0..max_k at `rows`: where whole steps were measured here or
        at a batch size near it, their tokens a row pooled with the estimate's and their seconds as a ratio to the
        parts' price there (at `rows` itself: the median seconds); elsewhere the estimate's tokens and the parts'
        seconds scaled by the median ratio of measured to parts' seconds over the measured drafting ks."""
        tokens, seconds, ratios = list(expected), list(parts_seconds), {}
        parts_at = {rows: parts_seconds}   # batch size -> its parts' seconds, each priced once
        for k in range(self.max_k + 1):
            if (near := self.measured_steps.nearest(self._steps, rows, k)) is None:
                continue
            measured_at, (median_seconds, appended, steps) = near
            if measured_at not in parts_at:
                parts_at[measured_at] = self._parts(measured_at)
            parts_there = parts_at[measured_at][k]
            if parts_there <= 0:
                continue
            ratios[k] = median_seconds / parts_there
            seconds[k] = median_seconds if measured_at == rows else parts_seconds[k] * ratios[k]
            tokens[k] = (appended + PRIOR_ROW_STEPS * expected[k]) / (steps * measured_at + PRIOR_ROW_STEPS)
        # Drafting steps' parts miss work a plain step does not have: their error scales the drafting ks only (from
        # the plain step's where no drafting k was measured); an unmeasured plain step keeps its parts' price.
        drafting = [ratios[k] for k in ratios if k] or list(ratios.values())
        if drafting:
            scale = statistics.median(drafting)
            seconds = [s if k in ratios or not k else s * scale for k, s in enumerate(seconds)]
        return tokens, seconds

    def _parts(self, rows: int) -> list[float]:
        """Seconds of a step over `rows` rows drafting k, for k = 0..max_k, as the sum of its parts' estimates."""
        first, later = self._forward_seconds(rows)
        return [self.target_cost.seconds(rows * (k + 1)) + self._proposal_seconds(k, first, later) + self._host(k)
                for k in range(self.max_k + 1)]

    def _forward_seconds(self, rows: int) -> tuple[float, float]:
        """A proposal's first draft forward over `rows` rows, and each further one (as dear as a first one until a
        proposal of two or more is timed)."""
        first = self.draft_cost.seconds(rows)
        return first, self.draft_next_cost.seconds(rows) if self.draft_next_cost.estimates else first

    def _proposal_seconds(self, k: int, first: float, later: float) -> float:
        """A proposal of k: its first forward and draft_forwards(k) - 1 further ones (nothing for k = 0)."""
        return first + (self.draft_forwards(k) - 1) * later if k else 0.0

    def _host(self, k: int) -> float:
        """Host seconds of a step drafting k: measured at k, else at the nearest k of the same kind (drafting or
        not), else at the nearest k at all; 0 before any step."""
        if k in self.host_seconds:
            return self.host_seconds[k]
        pool = [j for j in self.host_seconds if (j > 0) == (k > 0)] or list(self.host_seconds)
        return self.host_seconds[min(pool, key=lambda j: (abs(j - k), j))] if pool else 0.0

    def choose(self, rows: int, unread_tokens: int = 0,
               remaining_tokens: float | Callable[[], float] = float("inf")) -> int:
        """k for a step over `rows` rows (see expected_rates; remaining_tokens may be a function, called only when
        the step is priced: a held step needs neither it nor the pricing)."""
        if not self.draft_cost.estimates:   # the draft's cost is unknown until a step drafts: measure it first
            return self._chose(self.max_k)
        rates = None
        best, held, held_unread, close_hold = self._held.get(rows, (0, 0, 0, 0))
        self._unpriced = bool(held) and held_unread == unread_tokens
        if self._unpriced:
            self._held[rows] = (best, held - 1, unread_tokens, close_hold)
            if best:
                return self._chose_at(rows, best)
        else:
            rates = self._priced(rows, unread_tokens, remaining_tokens)
            best = max(range(self.max_k + 1), key=lambda k: (rates[k], k))
            if best and rates[best] < DRAFT_MARGIN * rates[0]:
                best = 0
            if best:   # held where plain is far behind and no prompt waits; a plain step priced close: briefly
                far = rates[0] <= HOLD_BELOW * rates[best] and not unread_tokens
                self._held[rows] = (best, DRAFT_HOLD_STEPS if far else 0, unread_tokens, 0)
            else:
                close_hold = min(2 * close_hold, HOLD_STEPS) if close_hold else HOLD_CLOSE_STEPS
                far = max(rates[1:]) <= HOLD_BELOW * rates[0]
                self._held[rows] = (0, HOLD_STEPS if far else close_hold, unread_tokens, close_hold)
        probes = self._probes.get(rows.bit_length()) or self._probes.setdefault(rows.bit_length(), [0, PROBE_AFTER])
        if best:
            probes[:] = [0, PROBE_AFTER]
            if rates[0] >= PLAIN_RIVAL_WITHIN * rates[best] and self._due(rows, 0):
                return self._chose_at(rows, 0)
            rivals = [k for k in range(1, self.max_k + 1)
                      if k != best and rates[k] >= RIVAL_WITHIN * rates[best] and self._due(rows, k)]
            return self._chose_at(rows, max(rivals, key=lambda k: rates[k]) if rivals else best)
        # A drafting k measured at this batch size (or near it) and priced close behind the plain step is re-timed
        # as a whole step now and then: its measurement may come from a few slow steps, and one-row probes do not
        # measure whole steps.
        rivals = [] if rates is None else [k for k in range(1, self.max_k + 1)
                                           if rates[k] >= RIVAL_WITHIN * rates[0] and self._due(rows, k)
                                           and self.measured_steps.nearest(self._steps, rows, k) is not None]
        if rivals:
            return self._chose_at(rows, max(rivals, key=lambda k: rates[k]))
        probes[0] += 1
        if probes[0] < probes[1]:
            return self._chose_at(rows, 0)
        probes[:] = [0, min(2 * probes[1], PROBE_AFTER_MAX)]
        self._held.pop(rows, None)   # the probe brings evidence: price the next step
        self._unpriced = False
        rates = rates or self._priced(rows, unread_tokens, remaining_tokens)
        return self._chose(max(range(1, self.max_k + 1), key=lambda k: (rates[k], k)), probe=True)

    def _priced(self, rows: int, unread_tokens: int, remaining_tokens: float | Callable[[], float]) -> list[float]:
        remaining = remaining_tokens() if callable(remaining_tokens) else remaining_tokens
        return self.expected_rates(rows, unread_tokens, remaining)

    def _due(self, rows: int, k: int) -> bool:
        """Whether k has not been chosen for RIVAL_AFTER steps at this batch size or one near it (NEAR_ROWS)."""
        return all(self._steps - step >= RIVAL_AFTER for r, step in self._last_at.get(k, {}).items()
                   if near_rows(rows, r))

    def _chose_at(self, rows: int, k: int) -> int:
        (self._last_at.get(k) or self._last_at.setdefault(k, {}))[rows] = self._steps
        return self._chose(k)

    def _chose(self, k: int, probe: bool = False) -> int:
        self.history[k] = self.history.get(k, 0) + 1
        self._steps += 1
        self.probing = probe
        return k

    def observe_step(self, rows: int, k: int, num_accepted: list[int], draft_seconds: float | None,
                     target_seconds: float, host_seconds: float, num_drafted: list[int] | None = None,
                     target_tokens: int | None = None, draft_rows: int | None = None, read_tokens: int = 0,
                     later_draft_seconds: float | None = None) -> None:
        """What a step of `rows` rows drafting k accepted, and the measured seconds of its parts (draft_seconds
        None: not timed; a step that read new prompts prices reading with it, not a draft forward;
        later_draft_seconds: the part of draft_seconds after the proposal's first forward, None: not timed apart).
        num_drafted: each row's own count where it differs from k; target_tokens: the tokens the verification
        forward read (default rows * (k + 1); fewer where rows drafted fewer); draft_rows: the rows the draft ran
        for (default all);
        read_tokens: the new prompts' tokens the draft read in this step (its time, beyond the step's draft forwards
        at their known cost, prices reading)."""
        if not k and self._unpriced:   # a held plain step: measured on the plain steps priced around it
            self.acceptance.count_step()
            return
        drafting_rows = rows if draft_rows is None else draft_rows
        if k and read_tokens >= drafting_rows and draft_seconds is not None:   # a token a row or more: a read
            if self.draft_cost.estimates:
                self.read_cost.observe(read_tokens, draft_seconds
                                       - self._proposal_seconds(k, *self._forward_seconds(drafting_rows)))
            draft_seconds = None   # a step that read text says nothing of a draft step's own cost
        self.acceptance.observe([k] * rows if num_drafted is None else num_drafted, num_accepted)
        self.target_cost.observe(rows * (k + 1) if target_tokens is None else target_tokens, target_seconds)
        if k and draft_seconds is not None:
            forwards = self.draft_forwards(k)
            if later_draft_seconds is None:   # not timed apart: every forward alike
                later_draft_seconds = draft_seconds * (forwards - 1) / forwards
            later_draft_seconds = min(later_draft_seconds, draft_seconds)
            self.draft_cost.observe(drafting_rows, draft_seconds - later_draft_seconds)
            if forwards > 1:
                self.draft_next_cost.observe(drafting_rows, later_draft_seconds / (forwards - 1))
        if (draft_seconds is not None and drafting_rows == rows
                and (target_tokens is None or target_tokens == rows * (k + 1))):   # a whole step, as priced
            self.measured_steps.observe(self._steps, rows, k, sum(num_accepted) + rows,
                                        draft_seconds + target_seconds + host_seconds)
        previous = self.host_seconds.get(k)
        self.host_seconds[k] = host_seconds if previous is None else 0.9 * previous + 0.1 * host_seconds
