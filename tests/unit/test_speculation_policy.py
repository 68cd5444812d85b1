"""Speculation policies on hand-made step records (no model): the adaptive policy drafts nothing when drafting costs
more than it returns, the best k when acceptance is high, follows shifts in acceptance and cost, prices greedy and
sampled rows apart, and reads nothing but its records."""
from __future__ import annotations

import ast
import math
import random
from pathlib import Path

import pytest

from anydraft.spec_decode.policy import AdaptiveK, AdaptiveParams, BatchView, FixedK, StepPlan, StepRecord
from anydraft.spec_decode.policy.estimates import AcceptanceEstimate, MedianCost, non_decreasing

POLICY_DIR = Path(__file__).resolve().parents[2] / "anydraft" / "spec_decode" / "policy"


class Machine:
    """A simulated step: known part costs and a per-position acceptance rate; rows accept geometrically."""

    def __init__(self, target=lambda tokens: 0.010, draft=lambda rows: 0.001, host=lambda k: 0.0002,
                 acceptance: float = 0.8, seed: int = 0):
        self.target, self.draft, self.host, self.acceptance = target, draft, host, acceptance
        self.random = random.Random(seed)

    def seconds(self, rows: int, k: int) -> float:
        return self.target(rows * (k + 1)) + k * self.draft(rows) + self.host(k)

    def rate(self, rows: int, k: int) -> float:
        """Expected tokens per second of a step drafting k."""
        return rows * sum(self.acceptance ** j for j in range(k + 1)) / self.seconds(rows, k)

    def best_k(self, rows: int, max_k: int) -> int:
        """The k with the most expected tokens per second on this machine (what a perfect policy picks)."""
        return max(range(max_k + 1), key=lambda k: self.rate(rows, k))

    def step(self, policy, batch: BatchView, sampled: list[bool] | None = None) -> int:
        k = policy.plan(batch).k
        accepted = []
        for _ in range(batch.rows):
            n = 0
            while n < k and self.random.random() < self.acceptance:
                n += 1
            accepted.append(n)
        policy.observe(StepRecord(batch, k, [k] * batch.rows, accepted, sampled,
                                  draft_seconds=k * self.draft(batch.rows),
                                  later_draft_seconds=(k - 1) * self.draft(batch.rows) if k else 0.0,
                                  target_seconds=self.target(batch.rows * (k + 1)), host_seconds=self.host(k)))
        return k


def run(policy, machine: Machine, batch: BatchView, steps: int, sampled=None) -> list[int]:
    return [machine.step(policy, batch, sampled) for _ in range(steps)]


def test_the_first_step_drafts_the_most_to_measure_the_draft():
    assert AdaptiveK(4).plan(BatchView(rows=1)) == StepPlan(4)


def test_bandwidth_bound_target_and_good_draft_draft_the_most():
    machine = Machine(target=lambda tokens: 0.050, draft=lambda rows: 0.001, acceptance=0.95)
    assert machine.best_k(1, 5) == 5
    ks = run(AdaptiveK(5), machine, BatchView(rows=1), 300)
    assert ks[100:].count(5) >= 0.9 * 200, ks[100:]


def test_drafting_that_costs_more_than_it_returns_is_not_chosen():
    """Compute-bound batch (the target's cost grows with every token) and a mediocre draft: plain decode, with a
    neighbouring k re-measured once per memory_steps steps."""
    machine = Machine(target=lambda tokens: 0.001 * tokens, draft=lambda rows: 0.0005 * rows, acceptance=0.5)
    assert machine.best_k(16, 5) == 0
    policy = AdaptiveK(5)
    ks = run(policy, machine, BatchView(rows=16), 400)
    late = ks[100:]
    assert late.count(0) >= len(late) * (1 - 1.5 / policy.params.memory_steps), late
    assert 1 in late   # the neighbour is still re-measured now and then


def test_an_optimum_in_between_is_found_too():
    """Draft forwards cost a fifth of a target forward, acceptance 0.6: neither plain nor the most is best, and the
    steps chosen deliver (in expectation) at least 95% of the best k's tokens per second (the policy's goal against
    the best fixed k), though posterior draws spread the choice over the near-equal ks."""
    machine = Machine(target=lambda tokens: 0.010 + 0.0005 * tokens, draft=lambda rows: 0.002, acceptance=0.6)
    best = machine.best_k(1, 6)
    assert 0 < best < 6 and machine.rate(1, 6) < 0.9 * machine.rate(1, best)
    ks = run(AdaptiveK(6), machine, BatchView(rows=1), 400)[100:]
    delivered = sum(machine.rate(1, k) * machine.seconds(1, k) for k in ks) / sum(machine.seconds(1, k) for k in ks)
    assert delivered >= 0.95 * machine.rate(1, best), (ks, best)


def test_a_fall_in_acceptance_stops_drafting_and_a_rise_brings_it_back():
    machine = Machine(target=lambda tokens: 0.010, draft=lambda rows: 0.003, acceptance=0.9)
    policy, batch = AdaptiveK(4), BatchView(rows=1)
    run(policy, machine, batch, 200)
    machine.acceptance = 0.02   # the text turned to something the draft cannot guess
    after_fall = run(policy, machine, batch, 150)
    assert after_fall[-50:].count(0) >= 40, after_fall   # the rest: re-measuring and posterior draws
    machine.acceptance = 0.9   # noticed through the re-measured neighbour (k = 1 once per memory span)
    after_rise = run(policy, machine, batch, 400)
    assert after_rise[-50:].count(0) <= 5, after_rise


def test_a_few_early_rejections_do_not_stop_drafting_for_long():
    """Batch 1, a good draft that happens to miss its first proposals: thin evidence leaves the posterior wide, so
    drafting is tried again within a few steps (no wait for a re-measurement) and the evidence then decides."""
    machine = Machine(target=lambda tokens: 0.010, draft=lambda rows: 0.002, acceptance=0.95)
    policy, batch = AdaptiveK(4), BatchView(rows=1)
    machine.acceptance = 0.0
    run(policy, machine, batch, 4)   # four misses in a row
    machine.acceptance = 0.95
    ks = run(policy, machine, batch, 30)
    assert ks[:10].count(0) <= 5 and ks[-10:].count(0) <= 1, ks


def test_posterior_draws_spread_where_evidence_is_thin_and_sit_on_the_estimate_where_it_is_plentiful():
    rng = random.Random(3)
    thin = AcceptanceEstimate(1, prior=0.7, prior_weight=4.0, decay=1.0)
    thin.observe([1, 1], [1, 0])
    plentiful = AcceptanceEstimate(1, prior=0.7, prior_weight=4.0, decay=1.0)
    plentiful.observe([1] * 2000, [1] * 1000 + [0] * 1000)
    for estimate, low, high in ((thin, 0.05, 0.2), (plentiful, 0.0, 0.02)):
        draws = [estimate.drawn_rates(rng)[0] for _ in range(400)]
        mean = sum(draws) / len(draws)
        spread = math.sqrt(sum((d - mean) ** 2 for d in draws) / len(draws))
        assert mean == pytest.approx(estimate.rates()[0], abs=0.03) and low < spread < high, (mean, spread)


def test_a_rise_in_draft_cost_stops_drafting():
    machine = Machine(target=lambda tokens: 0.010, draft=lambda rows: 0.001, acceptance=0.8)
    policy, batch = AdaptiveK(4), BatchView(rows=4)
    assert run(policy, machine, batch, 150)[-50:].count(0) <= 5
    machine.draft = lambda rows: 0.050   # another process took the draft's core
    assert run(policy, machine, batch, 150)[-50:].count(0) >= 45


def test_greedy_and_sampled_rows_are_priced_with_their_own_acceptance_and_costs():
    greedy = Machine(target=lambda tokens: 0.010, draft=lambda rows: 0.002, acceptance=0.9, seed=1)
    sampled = Machine(target=lambda tokens: 0.012, draft=lambda rows: 0.002, acceptance=0.05, seed=2)
    policy = AdaptiveK(4)
    for _ in range(200):
        greedy.step(policy, BatchView(rows=2))
        sampled.step(policy, BatchView(rows=2, sampled_rows=2), sampled=[True, True])
    greedy_rates = policy.rates(BatchView(rows=2))
    assert greedy_rates.index(max(greedy_rates)) > 0
    assert run(policy, sampled, BatchView(rows=2, sampled_rows=2), 20, sampled=[True, True]).count(0) >= 18
    assert policy.costs[True].target.seconds(2) > policy.costs[False].target.seconds(2)


def test_a_block_drafter_costs_one_forward_whatever_k():
    """DSpark drafts a block in one forward: a dear forward, then every k costs the same and the most wins."""
    policy = AdaptiveK(4, draft_forwards=lambda k: 1 if k else 0)
    for _ in range(200):
        k = policy.plan(BatchView(rows=1)).k
        policy.observe(StepRecord(BatchView(rows=1), k, [k], [min(k, 2)], None, draft_seconds=0.006 if k else 0.0,
                                  later_draft_seconds=0.0, target_seconds=0.010, host_seconds=0.0))
    rates = policy.rates(BatchView(rows=1))
    assert rates.index(max(rates)) == 4


def test_reading_new_text_is_spread_over_the_tokens_left_to_write():
    """A prompt the draft has yet to read costs its reading once: worth it for a long output, not for two tokens."""
    machine = Machine(target=lambda tokens: 0.010, draft=lambda rows: 0.001, acceptance=0.9)
    policy = AdaptiveK(3)
    run(policy, machine, BatchView(rows=1), 50)
    policy.read.observe(1000, 1.0)   # 1 ms a token read
    long = policy.rates(BatchView(rows=1, unread_tokens=500, remaining_tokens=5000))
    short = policy.rates(BatchView(rows=1, unread_tokens=500, remaining_tokens=2))
    assert max(long) > long[0] and max(short[1:]) < short[0]


def test_a_neighbour_of_the_choice_is_re_measured_once_per_memory_span():
    machine = Machine(target=lambda tokens: 0.001 * tokens, draft=lambda rows: 0.0005 * rows, acceptance=0.5)
    policy = AdaptiveK(3, params=AdaptiveParams(memory_steps=20))
    ks = run(policy, machine, BatchView(rows=16), 300)[60:]
    gaps = [j - i for i, j in zip([i for i, k in enumerate(ks) if k == 1], [i for i, k in enumerate(ks) if k == 1][1:])]
    assert gaps and min(gaps) > 20 and max(gaps) <= 22, gaps


def test_a_batch_shrinking_through_sizes_does_not_re_measure_at_each_new_size():
    """Plain decode is best at every size; as requests end the batch passes four sizes it has never planned for in a
    few steps each. Their prices come from the measured sizes; no probe fires on arriving at each."""
    machine = Machine(target=lambda tokens: 0.001 * tokens, draft=lambda rows: 0.0005 * rows, acceptance=0.5)
    policy = AdaptiveK(3)
    run(policy, machine, BatchView(rows=16), 200)
    tail = [k for rows in (12, 6, 3, 1) for k in run(policy, machine, BatchView(rows=rows), 6)]
    assert tail.count(0) >= len(tail) - 1, tail   # at most the one re-measurement a memory span allows


def test_the_policy_reads_nothing_but_its_records():
    """Its modules import only the standard library and each other: no engine, proposer, model or torch."""
    allowed = {"__future__", "bisect", "collections", "dataclasses", "itertools", "math", "random", "statistics",
               "typing"}
    for path in POLICY_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module in allowed, (path.name, node.module)
                if node.level:
                    assert node.module in {None, "adaptive", "fixed", "records", "estimates"}, (path.name, node.module)
            elif isinstance(node, ast.Import):
                assert all(alias.name in allowed for alias in node.names), path.name


def test_fixed_k_plans_its_k_whatever_it_is_told():
    policy = FixedK(3)
    policy.observe(StepRecord(BatchView(rows=2), 3, [3, 3], [0, 0], None, 1.0, 0.5, 1.0, 1.0))
    assert {policy.plan(BatchView(rows=r, sampled_rows=r)).k for r in (1, 8, 64)} == {3}


@pytest.mark.parametrize("field, value, message", [
    ("prior_acceptance", 1.0, "prior_acceptance must be in"), ("prior_weight", 0.0, "prior_weight must be > 0"),
    ("memory_steps", 0, "memory_steps must be an integer >= 1"), ("draft_margin", 0.9, "draft_margin must be >= 1")])
def test_parameters_are_validated_with_what_to_change(field, value, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveParams(**{field: value})


def test_memory_steps_is_the_evidence_half_life():
    assert AdaptiveParams(memory_steps=32).decay ** 32 == pytest.approx(0.5)


# -- estimates ------------------------------------------------------------------------------------------------
def test_cost_interpolates_between_sizes_and_holds_the_smallest_below_them():
    cost = MedianCost(window=5)
    cost.observe(4, 0.004)
    cost.observe(12, 0.008)
    assert cost.seconds(8) == pytest.approx(0.006)
    assert cost.seconds(16) == pytest.approx(0.010)   # along the last segment
    assert cost.seconds(1) == pytest.approx(0.004)    # no cheaper than the smallest measured


def test_cost_is_a_median_a_stall_does_not_move():
    cost = MedianCost(window=5)
    for seconds in (0.010, 0.011, 0.500, 0.010, 0.012):
        cost.observe(4, seconds)
    assert cost.seconds(4) == pytest.approx(0.011)


def test_a_size_measured_badly_is_bounded_by_the_smaller_sizes():
    cost = MedianCost(window=5)
    cost.observe(2, 0.002)
    cost.observe(6, 0.900)
    assert cost.seconds(6) == pytest.approx(0.006)   # three forwards of 2 tokens would do it


def test_a_size_measured_rarely_and_dearer_than_a_larger_one_is_pooled_with_it():
    """More tokens never cost less: 5 tokens measured twice at 0.39 s and 6 tokens 30 times at 0.32 s pool to their
    sample-weighted mean, and the sizes between 1 and 5 are priced from it."""
    cost = MedianCost(window=32)
    for _ in range(30):
        cost.observe(1, 0.17)
        cost.observe(6, 0.32)
    for _ in range(2):
        cost.observe(5, 0.39)
    pooled = (2 * 0.39 + 30 * 0.32) / 32
    assert cost.seconds(5) == pytest.approx(pooled) and cost.seconds(6) == pytest.approx(pooled)
    assert cost.seconds(3) == pytest.approx(0.17 + (pooled - 0.17) / 2)
    assert non_decreasing([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([2.0, 1.0], [3, 1]) == [1.75, 1.75]


def test_expected_tokens_multiply_the_conditional_rates():
    estimate = AcceptanceEstimate(3, prior=0.5, prior_weight=1e-9, decay=1.0)
    estimate.observe([3] * 4, [3, 2, 1, 0])   # position 1: 3 of 4, position 2: 2 of 3, position 3: 1 of 2
    assert estimate.rates() == pytest.approx([0.75, 2 / 3, 0.5])
    assert estimate.expected_tokens() == pytest.approx([1, 1.75, 2.25, 2.5])


def test_a_row_that_drafted_fewer_says_nothing_of_the_positions_it_did_not_draft():
    estimate = AcceptanceEstimate(3, prior=0.5, prior_weight=1e-9, decay=1.0)
    estimate.observe([1, 3], [1, 3])
    assert estimate.tried == [2, 1, 1] and estimate.accepted == [2, 1, 1]


def test_an_untried_position_borrows_the_estimate_of_the_one_before():
    estimate = AcceptanceEstimate(3, prior=0.7, prior_weight=4.0, decay=1.0)
    estimate.observe([1] * 40, [1] * 36 + [0] * 4)
    first, second, third = estimate.rates()
    assert first == pytest.approx((36 + 2.8) / 44) and second == pytest.approx(first) and third == pytest.approx(first)


def test_evidence_and_the_prior_age_with_each_step_that_drafted_and_only_those():
    estimate = AcceptanceEstimate(1, prior=0.5, prior_weight=1.0, decay=0.5)
    assert estimate.rates() == [0.5]
    estimate.observe([1], [0])   # the prior now worth half a row, the rejection a row
    estimate.observe([0], [0])   # a plain step: nothing new, nothing forgotten
    assert estimate.rates()[0] == pytest.approx((0 + 0.5 * 0.5) / (1 + 0.5))
    estimate.observe([1], [1])   # both aged once more, then the acceptance counted
    assert math.isclose(estimate.tried[0], 1.5) and math.isclose(estimate.weight, 0.25)
    assert estimate.rates()[0] == pytest.approx((1 + 0.5 * 0.25) / (1.5 + 0.25))


def test_a_dear_first_measurement_of_a_size_does_not_lock_the_policy_below_the_best_k():
    """A verification that costs little more than a plain step (a memory-bound CPU forward: 0.17 s for 1 token,
    +0.03 s a token), whose first two measurements at each size are slow (a cold cache): over its last 200 steps
    the policy still gets at least 0.97x the machine's best k's expected rate."""
    def verification(tokens: int) -> float:
        return 0.17 + 0.03 * (tokens - 1)

    calls: dict[int, int] = {}

    def cold_first(tokens: int) -> float:
        calls[tokens] = calls.get(tokens, 0) + 1
        return verification(tokens) * (1.5 if calls[tokens] <= 2 else 1.0)

    machine = Machine(target=cold_first, draft=lambda rows: 0.016, acceptance=0.85)
    ks = run(AdaptiveK(5), machine, BatchView(rows=1), 400)
    warm = Machine(target=verification, draft=lambda rows: 0.016, acceptance=0.85)
    last = ks[-200:]
    achieved = sum(warm.rate(1, k) for k in last) / len(last)
    assert achieved >= 0.97 * warm.rate(1, warm.best_k(1, 5)), {k: last.count(k) for k in sorted(set(last))}
