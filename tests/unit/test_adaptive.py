"""Adaptive speculation's choice of k from acceptance estimates and a step cost model (no model involved)."""
from __future__ import annotations

import random

import pytest

from anydraft.spec_decode.adaptive import (DRAFT_HOLD_STEPS, DRAFT_MARGIN, HOLD_BELOW, HOLD_CLOSE_STEPS, HOLD_STEPS,
                                          PLAIN_RIVAL_WITHIN, PROBE_AFTER, RIVAL_AFTER, RIVAL_WITHIN, AdaptiveSpeculation,
                                          one_forward_per_token)
from anydraft.spec_decode.estimates import (DECAY, MEASURED_FOR, MEASURED_MIN, NEAR_ROWS, PRIOR_ACCEPTANCE,
                                           PRIOR_ROW_STEPS, PRIOR_WEIGHT, AcceptanceEstimate, MedianCost)


def test_first_step_drafts_the_most_to_measure_the_draft():
    spec = AdaptiveSpeculation(4)
    spec.target_cost.observe(1, 0.001)
    assert spec.choose(rows=8) == 4
    spec.observe_step(rows=8, k=4, num_accepted=[0] * 8, draft_seconds=0.4, target_seconds=0.005, host_seconds=0.0)
    assert spec.choose(rows=8) == 0   # measured: a dear draft that nothing accepts


def test_cost_interpolates_between_measured_sizes_and_extrapolates_the_last_segment():
    cost = MedianCost()
    assert cost.seconds(10) == 0.0   # nothing measured yet
    for tokens in (1, 4, 16, 64):
        cost.observe(tokens, 0.002 + 0.0005 * tokens)
    for tokens in (1, 2, 4, 10, 16, 40, 64, 96, 200):   # measured, between, and beyond the largest
        assert cost.seconds(tokens) == pytest.approx(0.002 + 0.0005 * tokens, rel=1e-9), tokens
    cost.observe(64, 0.5)                # a noisy step among the measurements: the median keeps the typical cost
    cost.observe(64, 0.002 + 0.0005 * 64)
    assert cost.seconds(64) == pytest.approx(0.002 + 0.0005 * 64)
    assert cost.seconds(16) == pytest.approx(0.002 + 0.0005 * 16)


def test_a_size_measured_badly_once_is_bounded_by_the_smaller_sizes():
    cost = MedianCost()
    cost.observe(1, 0.006)
    cost.observe(6, 0.960)          # the calibration forward of 6 tokens ran while the machine was busy
    assert cost.seconds(6) == pytest.approx(0.036) and cost.seconds(4) == pytest.approx(0.024)


def test_sizes_keep_their_own_evidence():
    """Hundreds of steps at one size do not bend the cost of another (the calibration's k+1 tokens stay)."""
    cost = MedianCost()
    cost.observe(1, 0.010)
    cost.observe(6, 0.012)
    for _ in range(500):
        cost.observe(1, 0.010)
    assert cost.seconds(6) == pytest.approx(0.012) and cost.seconds(4) == pytest.approx(0.0112)


def test_cost_ignores_one_off_work_and_follows_a_real_slowdown():
    cost = MedianCost()
    for seconds in (0.002, 0.030, 0.002, 0.002, 0.100):   # two steps also did one-off work (a page fault, catch-up)
        cost.observe(4, seconds)
    assert cost.seconds(4) == pytest.approx(0.002)
    for _ in range(cost.window):      # the draft really is slower now (longer contexts)
        cost.observe(4, 0.004)
    assert cost.seconds(4) == pytest.approx(0.004)
    assert cost.seconds(8) == pytest.approx(0.008) and cost.seconds(1) == pytest.approx(0.004)


def test_every_size_is_judged_by_its_typical_cost():
    """A size measured on every step and one measured a few times, both typically 10 ms: equal estimates. A
    running minimum made the first look cheaper (its minimum over hundreds of noisy steps) and kept it chosen."""
    cost = MedianCost()
    noisy = [0.008, 0.010, 0.012, 0.010, 0.011, 0.009, 0.010]
    for seconds in noisy * 50:
        cost.observe(6, seconds)
    for seconds in noisy[:3]:
        cost.observe(4, seconds)
    assert cost.seconds(6) == pytest.approx(0.010) and cost.seconds(4) == pytest.approx(0.010)


def test_expected_tokens_multiplies_conditional_rates():
    estimate = AcceptanceEstimate(3)
    for _ in range(2000):            # position 1 always accepted, position 2 never
        estimate.observe([3], [1])
    rates = estimate.rates()
    assert rates[0] > 0.94 and rates[1] < 0.08   # ~50 steps of evidence (decay 0.98) against 4 of prior (~0.95)
    assert estimate.expected_tokens(0) == 1.0
    assert estimate.expected_tokens(1) == pytest.approx(1 + rates[0])
    assert estimate.expected_tokens(3) == pytest.approx(1 + rates[0] + rates[0] * rates[1]
                                                        + rates[0] * rates[1] * rates[2])


def _calibrated(target_c0, target_c1, draft_c0, draft_c1, accept_all: bool, max_k: int = 5) -> AdaptiveSpeculation:
    spec = AdaptiveSpeculation(max_k)
    for tokens in (1, 2, 4, 8, 16, 32, 64, 96):
        spec.target_cost.observe(tokens, target_c0 + target_c1 * tokens)
    for rows in (1, 4, 16):
        spec.draft_cost.observe(rows, draft_c0 + draft_c1 * rows)
    for _ in range(500):
        spec.acceptance.observe([max_k], [max_k if accept_all else 0])
    return spec


def test_bandwidth_bound_target_and_good_draft_drafts_the_most():
    # A target forward costs the same for 1 or 6 tokens (weights read once), a draft is 50x cheaper.
    spec = _calibrated(0.050, 0.0, 0.001, 0.0, accept_all=True)
    assert spec.choose(rows=1) == 5


def test_compute_bound_batch_does_not_speculate():
    # At 16 rows the target's cost grows with every token it reads: verifying drafts costs as much as decoding.
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)
    assert spec.choose(rows=16) == 0
    assert spec.history == {0: 1}


def test_a_draft_that_is_never_accepted_is_not_used():
    spec = _calibrated(0.050, 0.0, 0.005, 0.0, accept_all=False)
    assert spec.choose(rows=1) == 0


def test_evidence_fades_so_a_draft_is_tried_again():
    """Steps without drafting still decay the old rejections toward the prior: the draft is eventually retried
    (the text may have changed), rather than never again."""
    spec = _calibrated(0.050, 0.0, 0.005, 0.0, accept_all=False)
    chosen = []
    for _ in range(400):
        k = spec.choose(rows=1)
        chosen.append(k)
        spec.observe_step(1, k, [0], draft_seconds=0.005 * k, target_seconds=0.050, host_seconds=0.0)
    assert chosen[0] == 0 and any(k > 0 for k in chosen)


def test_observe_step_refreshes_costs():
    spec = AdaptiveSpeculation(3)
    spec.observe_step(rows=2, k=3, num_accepted=[3, 1], draft_seconds=0.006, target_seconds=0.04, host_seconds=0.001)
    assert spec.draft_cost.seconds(2) == pytest.approx(0.002)
    assert spec.target_cost.seconds(8) == pytest.approx(0.04)
    assert spec.acceptance.tried[:3] == [2.0, 2.0, 1.0] and spec.acceptance.accepted[:3] == [2.0, 1.0, 1.0]


def test_a_draft_measured_dear_once_is_probed_again():
    """One noisy draft measurement (28 ms for a 2 ms draft) makes k = 0 best; probes draft anyway now and then,
    measure the real cost, and speculation resumes once the median says it is cheap (after two probes: the median
    of 28 and 2 ms is still dear). Without probes nothing would measure the draft again."""
    spec = _calibrated(0.010, 0.0, 0.028, 0.0, accept_all=True)
    chosen = []
    for _ in range(6 * PROBE_AFTER):
        k = spec.choose(rows=1)
        chosen.append(k)
        accepted = [k]
        spec.observe_step(1, k, accepted, draft_seconds=0.002 * k, target_seconds=0.010, host_seconds=0.0)
    first, second = PROBE_AFTER - 1, PROBE_AFTER - 1 + 2 * PROBE_AFTER   # the interval doubles after the first
    assert [i for i, k in enumerate(chosen[:second + 1]) if k] == [first, second]   # the probes
    drafting = chosen[second + 1:]   # measured cheap: drafts from then on (k = 5, a close rival now and then)
    assert all(k > 0 for k in drafting) and drafting.count(5) >= 0.9 * len(drafting)


def test_probes_back_off_when_drafting_keeps_losing():
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)   # compute-bound at 16 rows
    chosen = [spec.choose(rows=16) for _ in range(PROBE_AFTER * 7)]
    probes = [i for i, k in enumerate(chosen) if k]
    gaps = [b - a for a, b in zip([-1] + probes, probes)]
    assert gaps == [PROBE_AFTER, 2 * PROBE_AFTER, 4 * PROBE_AFTER]   # each probe that changes nothing waits longer


def test_a_row_that_drafted_fewer_says_nothing_of_the_positions_it_did_not_draft():
    """A request capped at 2 (or a SLEM row proposing 2) in a k = 4 step, all accepted: positions 1-2 accepted,
    position 3 not tried. Counting it as a rejection dragged the estimate down and stopped drafting for good."""
    spec = AdaptiveSpeculation(4)
    spec.observe_step(rows=2, k=4, num_accepted=[2, 1], draft_seconds=0.004, target_seconds=0.01,
                      host_seconds=0.0, num_drafted=[2, 4], target_tokens=3 + 5)
    assert spec.acceptance.tried[:4] == [2.0, 2.0, 0.0, 0.0] and spec.acceptance.accepted[:4] == [2.0, 1.0, 0.0, 0.0]
    assert spec.target_cost.estimates == {8: 0.01}   # each row's forward read its own drafts and the token before
    spec.observe_step(rows=2, k=4, num_accepted=[1, 1], draft_seconds=0.004, target_seconds=0.006,
                      host_seconds=0.0, num_drafted=[1, 2], target_tokens=2 + 3)   # SLEM: rows proposed 1 and 2
    assert spec.target_cost.estimates[5] == 0.006

def _block_drafter_forwards(num_tokens: int) -> int:
    return 1 if num_tokens else 0


@pytest.mark.parametrize("measured_k", [1, 2, 4])
def test_a_block_drafter_costs_one_forward_whatever_k(measured_k):
    """A block drafter (DSpark) writes all k drafts in one forward: 12 ms at any k, against a 10 ms target
    forward for 1 or 5 tokens, and 80-87% acceptance at each position. Drafting 4 then pays (E(4) = 3.7 tokens in
    22 ms, against 1 token in 10 ms), whichever k its cost was measured at. Modelled as one forward per token,
    the same measurement at k = 1 prices k = 4 at 48 ms of drafting and stops drafting altogether."""
    def spec_measured(draft_forwards):
        spec = AdaptiveSpeculation(4, draft_forwards=draft_forwards)
        for tokens in (1, 5, 1, 5):
            spec.target_cost.observe(tokens, 0.010)
        for _ in range(500):
            spec.acceptance.observe([4] * 8, [4] * 4 + [3, 2, 1, 0])   # a_i = 0.87, 0.86, 0.83, 0.80
        spec.observe_step(rows=1, k=measured_k, num_accepted=[measured_k], draft_seconds=0.012,
                          target_seconds=0.010, host_seconds=0.0)
        return spec

    block = spec_measured(_block_drafter_forwards)
    assert block.draft_cost.seconds(1) == pytest.approx(0.012)   # the whole proposal is one forward
    assert block.choose(rows=1) == 4
    per_token = spec_measured(one_forward_per_token)
    assert per_token.draft_cost.seconds(1) == pytest.approx(0.012 / measured_k)
    if measured_k == 1:
        assert per_token.choose(rows=1) == 0


def test_a_proposal_is_priced_as_its_first_forward_and_the_further_ones():
    """A draft's first forward in a proposal feeds the text verified since the last one (2-6 tokens a row) and does
    a proposal's once-only work: 0.45 ms at 4 rows on the shipped pair, each further forward 0.23 ms. With the
    further forwards timed apart, a proposal of 5 is priced at what it costs (0.45 + 4 x 0.23 ms) however many
    proposals of 1 came since; timed as a whole, each forward costs the proposal's seconds / F(k), and a mix of the
    two kinds prices the further forwards at a first one's cost (the control)."""
    target = {tokens: 0.002 + 0.00005 * tokens for tokens in range(1, 25)}

    def measured(timed_apart: bool) -> AdaptiveSpeculation:
        spec = AdaptiveSpeculation(5)
        for tokens, seconds in target.items():
            spec.target_cost.observe(tokens, seconds)
        spec.observe_step(4, 5, [5] * 4, draft_seconds=0.00045 + 4 * 0.00023, target_seconds=target[24],
                          host_seconds=0.0, later_draft_seconds=4 * 0.00023 if timed_apart else None)
        for _ in range(20):
            spec.observe_step(4, 1, [1] * 4, draft_seconds=0.00045, target_seconds=target[8], host_seconds=0.0,
                              later_draft_seconds=0.0 if timed_apart else None)
        return spec

    def priced_step_seconds(spec: AdaptiveSpeculation, k: int) -> float:
        return spec._parts(4)[k]   # from its parts: k = 1's steps were measured whole too

    timed = measured(timed_apart=True)
    for k in range(1, 6):
        assert priced_step_seconds(timed, k) == pytest.approx(target[4 * (k + 1)] + 0.00045 + (k - 1) * 0.00023)
    untimed = measured(timed_apart=False)   # the proposal of 5: 0.274 ms a forward; of 1: 0.45
    assert untimed.draft_cost.seconds(4) == pytest.approx(0.00045)
    assert untimed.draft_next_cost.seconds(4) == pytest.approx((0.00045 + 4 * 0.00023) / 5)
    assert priced_step_seconds(untimed, 5) > priced_step_seconds(timed, 5) + 0.00015


def test_a_drafting_step_pays_its_own_host_work():
    """Plain steps cost 0.2 ms of host work, drafting ones 12 ms (every row's re-sync at a large batch): priced
    by k, drafting loses; one mean over both (mostly plain steps) priced drafting at ~1 ms and kept drafting."""
    spec = _calibrated(0.010, 0.0001, 0.0005, 0.00001, accept_all=False)
    for _ in range(200):
        spec.acceptance.observe([3] * 64, [1] * 64)      # a_1 = 0.5: each draft buys half a token per row
    for _ in range(50):
        spec.observe_step(64, 0, [0] * 64, None, target_seconds=0.0164, host_seconds=0.0002)
    spec.observe_step(64, 3, [1] * 64, draft_seconds=0.0021, target_seconds=0.0356, host_seconds=0.012)
    assert spec._host(0) == pytest.approx(0.0002) and spec._host(2) == pytest.approx(0.012)
    rates = spec.expected_rates(64)
    assert max(range(6), key=rates.__getitem__) == 0


def test_reading_new_prompts_is_spread_over_the_tokens_left_to_write():
    """A draft that earns ~40% per step: worth starting when the rows have hundreds of tokens left to write, not
    when they have a few, since the draft must first read their 1600 prompt tokens (1 ms each, 1.6 s)."""
    spec = _calibrated(0.100, 0.0, 0.002, 0.0, accept_all=True, max_k=3)
    spec.observe_step(16, 3, [3] * 16, draft_seconds=3 * 0.002 + 1.6, target_seconds=0.1, host_seconds=0.0,
                      read_tokens=1600)
    assert spec.read_cost.seconds(1600) == pytest.approx(1.6)
    assert spec.draft_cost.seconds(16) == pytest.approx(0.002)   # the reading step did not price a draft forward
    assert spec.choose(rows=16, unread_tokens=1600, remaining_tokens=500) == 3
    assert spec.choose(rows=16, unread_tokens=1600, remaining_tokens=8) == 0
    assert spec.choose(rows=16, unread_tokens=0, remaining_tokens=8) == 3       # read already: drafting pays
    # the rule: over R tokens left, reading costs read / R per token a row writes
    rates = spec.expected_rates(16, 1600, 8)
    tokens = spec.acceptance.expected_tokens(3)
    assert rates[3] == pytest.approx(16 * tokens / (0.1 + 3 * 0.002 + 1.6 / 8 * tokens))


def test_a_read_before_the_draft_cost_is_known_prices_nothing():
    """The first drafting step reads prompts before any draft forward was timed: its time is neither a draft
    forward's cost nor (without one to subtract) a reading cost."""
    spec = AdaptiveSpeculation(3)
    spec.target_cost.observe(1, 0.01)
    spec.observe_step(4, 3, [3] * 4, draft_seconds=0.9, target_seconds=0.01, host_seconds=0.0, read_tokens=400)
    assert not spec.draft_cost.estimates and spec.read_cost.seconds(400) == 0.0


def test_a_position_rarely_tried_borrows_the_estimate_of_the_one_before():
    """Steps drafting 1 token never try positions 2 and 3: their rates follow position 1's (0.9 here), not a fixed
    prior (0.7), which undervalued drafting 3 and kept adaptive drafting 1."""
    estimate = AcceptanceEstimate(3)
    for _ in range(300):
        estimate.observe([1] * 10, [1] * 9 + [0])
    rates = estimate.rates()
    assert rates[0] == pytest.approx(0.9, abs=0.01) and rates[1] == rates[2] == rates[0]
    for _ in range(300):                 # once tried, a position's own evidence decides
        estimate.observe([3] * 10, [3] * 5 + [1] * 5)
    rates = estimate.rates()
    assert rates[1] == pytest.approx(0.5, abs=0.02) and rates[2] == pytest.approx(1.0, abs=0.02)


def test_drafting_for_a_batch_tail_does_not_restart_probing_at_full_batch():
    """Compute-bound at 16 rows, worth drafting at 1 (a batch's last row): the back-off of probes at 16 rows
    survives the tail's drafting, so the next full batch does not probe every PROBE_AFTER steps again."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)   # as in the back-off test above
    full = [spec.choose(rows=16) for _ in range(PROBE_AFTER * 7)]
    assert [spec.choose(rows=1) > 0 for _ in range(2)] == [False, True]   # a plain step re-timed, then drafting
    after_tail = [spec.choose(rows=16) for _ in range(4 * PROBE_AFTER)]
    assert sum(1 for k in full if k) == 3 and not any(after_tail[:2 * PROBE_AFTER])


def test_a_rival_k_priced_close_to_the_best_is_retimed_now_and_then():
    """Two drafting choices priced within 10%: the best is chosen, and the rival once every RIVAL_AFTER steps, so
    that the sizes only it verifies are timed again (priced from load-time forwards, they stayed stale). A rival
    far behind is never chosen, nor is anything while the best is k = 0 (probes handle that)."""
    spec = _calibrated(0.050, 0.0, 0.001, 0.0, accept_all=True, max_k=3)   # bandwidth-bound target
    spec.acceptance = AcceptanceEstimate(3)
    for _ in range(500):
        spec.acceptance.observe([3] * 4, [3, 2, 1, 0])    # a_i = 3/4, 2/3, 1/2: k = 3 best, k = 2 within 10%
    rates = spec.expected_rates(1)
    assert rates[2] >= RIVAL_WITHIN * rates[3] and rates[1] < RIVAL_WITHIN * rates[3]
    chosen = [spec.choose(rows=1) for _ in range(4 * RIVAL_AFTER)]
    rival = [i for i, k in enumerate(chosen) if k == 2]
    assert set(chosen) == {2, 3} and 4 <= len(rival) <= 5
    assert all(b - a >= RIVAL_AFTER for a, b in zip(rival, rival[1:]))
    plain = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)   # compute-bound: the best is k = 0
    assert [plain.choose(rows=16) for _ in range(PROBE_AFTER - 1)] == [0] * (PROBE_AFTER - 1)


def test_drafting_must_beat_the_plain_step_by_a_margin():
    """A drafting k priced within DRAFT_MARGIN of the plain step is not chosen (its estimate is the noisier one);
    priced clearly ahead, it is (the two cases differ by 2 tok/s on either side of the margin)."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True, max_k=2)
    spec.expected_rates = lambda rows, *reading: [100.0, 100.0 * DRAFT_MARGIN - 1.0, 50.0]
    assert [spec.choose(rows=16) for _ in range(HOLD_CLOSE_STEPS + 1)] == [0] * (HOLD_CLOSE_STEPS + 1)  # priced, held
    spec.expected_rates = lambda rows, *reading: [100.0, 100.0 * DRAFT_MARGIN + 1.0, 50.0]
    assert spec.choose(rows=16) == 1


def _parts_favour_k1() -> AdaptiveSpeculation:
    """16 rows: a plain step priced at 4 ms (4000 tok/s), k = 1 at 4.5 + 0.5 ms for 1.9 tokens a row (6080 tok/s)."""
    spec = AdaptiveSpeculation(1)
    spec.target_cost.observe(16, 0.004)
    spec.target_cost.observe(32, 0.0045)
    spec.draft_cost.observe(16, 0.0005)
    for _ in range(500):
        spec.acceptance.observe([1] * 10, [1] * 9 + [0])
    rates = spec.expected_rates(16)
    assert rates[1] > DRAFT_MARGIN * rates[0]
    return spec


def _measure(spec: AdaptiveSpeculation, k: int, rows: int, tokens: int, seconds: float,
             times: int = MEASURED_MIN) -> None:
    for _ in range(times):
        spec.measured_steps.observe(spec._steps, rows, k, tokens, seconds)


def _pooled(tokens_per_row: float, steps: int, rows: int, estimate: float) -> float:
    return (tokens_per_row * steps * rows + PRIOR_ROW_STEPS * estimate) / (steps * rows + PRIOR_ROW_STEPS)


def test_whole_steps_measured_at_a_batch_size_overrule_the_parts():
    """Plain steps measure as priced (4 ms), k = 1 steps 9.5 ms (not the parts' 5 ms): k = 0 from then on; one
    measurement fewer than MEASURED_MIN leaves the parts' price."""
    spec = _parts_favour_k1()
    _measure(spec, 0, 16, 16, 0.004)
    _measure(spec, 1, 16, 30, 0.0095, times=MEASURED_MIN - 1)
    assert spec.choose(rows=16) == 1
    _measure(spec, 1, 16, 30, 0.0095, times=1)
    tokens = _pooled(30 / 16, MEASURED_MIN, 16, spec.acceptance.expected_tokens(1))
    assert spec.expected_rates(16) == pytest.approx([4000.0, 16 * tokens / 0.0095])
    # The choice of k = 1 is held for DRAFT_HOLD_STEPS (unpriced), then priced: plain.
    assert [spec.choose(rows=16) for _ in range(DRAFT_HOLD_STEPS + 1)] == [1] * DRAFT_HOLD_STEPS + [0]
    assert spec.choose(rows=4) == 1    # a batch size beyond NEAR_ROWS of any measured one: the parts' price


def test_a_batch_size_without_steps_borrows_the_nearest_measurement_as_a_ratio_to_its_parts():
    """k = 1 measured at 16 rows at 1.9x its parts' price: at 12 rows (no steps there) k = 1 is priced at 1.9x its
    parts at 12, with the tokens a row measured at 16; the nearest measured batch size lends, the larger on a tie."""
    spec = _parts_favour_k1()
    _measure(spec, 0, 16, 16, 0.004)
    _measure(spec, 1, 16, 30, 0.0095)
    parts_at = {rows: [spec.target_cost.seconds(rows),
                       spec.target_cost.seconds(2 * rows) + spec.draft_cost.seconds(rows)] for rows in (12, 16)}
    ratios = [0.004 / parts_at[16][0], 0.0095 / parts_at[16][1]]
    tokens = _pooled(30 / 16, MEASURED_MIN, 16, spec.acceptance.expected_tokens(1))
    assert spec.expected_rates(12) == pytest.approx([12 / (parts_at[12][0] * ratios[0]),
                                                     12 * tokens / (parts_at[12][1] * ratios[1])])
    assert spec.choose(rows=12) == 0
    _measure(spec, 1, 8, 8, 0.005)
    assert spec.measured_steps.nearest(spec._steps, 12, 1)[0] == 16     # a tie: the larger
    assert spec.measured_steps.nearest(spec._steps, 11, 1)[0] == 8
    assert spec.measured_steps.nearest(spec._steps, 12, 1)[1] == spec.measured_steps.measured(spec._steps, 16, 1)
    for too_far in (16 * NEAR_ROWS + 1, 16 // NEAR_ROWS - 1):     # plain steps were measured at 16 rows only
        assert spec.measured_steps.nearest(spec._steps, too_far, 0) is None


def test_unmeasured_drafting_ks_are_scaled_like_the_measured_ones():
    """k = 1 steps take twice their parts' price: k = 2, not run yet, is priced at twice its parts too (they miss the
    same drafting work); the plain step keeps its parts' price (the target forward and a plain step's host work)."""
    spec = AdaptiveSpeculation(2)
    for tokens, seconds in ((16, 0.004), (32, 0.0045), (48, 0.005)):
        spec.target_cost.observe(tokens, seconds)
    spec.draft_cost.observe(16, 0.0005)
    for _ in range(500):
        spec.acceptance.observe([2] * 10, [2] * 9 + [0])
    expected = spec.acceptance.expected_tokens_upto(2)
    _measure(spec, 1, 16, 30, 2 * 0.005)
    tokens = _pooled(30 / 16, MEASURED_MIN, 16, expected[1])
    assert spec.expected_rates(16) == pytest.approx([16 / 0.004, 16 * tokens / 0.010, 16 * expected[2] / 0.012])


def test_measured_tokens_weigh_by_the_row_steps_behind_them():
    """Steps that appended a token a row (nothing accepted) move k = 1's expected tokens little at batch 1 (three
    row-steps against the estimate's PRIOR_ROW_STEPS) and most of the way at batch 64 (45 steps' worth: the window)."""
    spec = _parts_favour_k1()
    estimate = spec.acceptance.expected_tokens(1)
    for rows in (1, 64):
        _measure(spec, 1, rows, rows, 0.005, times=15)
        _measure(spec, 0, rows, rows, 0.004)
        assert spec.expected_rates(rows)[1] == pytest.approx(rows * _pooled(1.0, 15, rows, estimate) / 0.005)
    assert _pooled(1.0, 15, 1, estimate) > 1.7 and _pooled(1.0, 15, 64, estimate) < 1.1


def test_a_measurement_expires_so_the_parts_price_its_k_again():
    """k = 1 measured poor prices it for MEASURED_FOR steps; after them the parts' price (which the acceptance
    estimate moves) chooses it again, to be measured again."""
    spec = _parts_favour_k1()
    _measure(spec, 0, 16, 16, 0.004)
    _measure(spec, 1, 16, 30, 0.0095)
    choices = [(spec.choose(rows=16), spec.probing) for _ in range(MEASURED_FOR)]
    assert all(k == 0 or probe for k, probe in choices)   # drafting only in probes while the measurement holds
    # Priced again at the latest after a hold of plain steps (HOLD_STEPS): k = 1, not as a probe.
    assert (1, False) in [(spec.choose(rows=16), spec.probing) for _ in range(HOLD_STEPS + 1)]


def test_only_whole_steps_as_priced_are_measured():
    """A step that drafted for every row, read no new prompt and verified k + 1 tokens a row is recorded, as its
    tokens and seconds; a one-row probe, a step that read prompts and a ragged step are not."""
    spec = AdaptiveSpeculation(3)
    spec.draft_cost.observe(16, 0.001)
    spec.observe_step(16, 3, [1] * 16, draft_seconds=0.003, target_seconds=0.010, host_seconds=0.001)
    spec.observe_step(16, 3, [1] * 16, 0.003, 0.010, 0.001, draft_rows=1)
    spec.observe_step(16, 3, [1] * 16, 0.300, 0.010, 0.001, read_tokens=1600)
    spec.observe_step(16, 3, [1] * 16, 0.003, 0.010, 0.001, num_drafted=[3] * 8 + [0] * 8, target_tokens=40)
    spec.observe_step(16, 0, [0] * 16, 0.0001, 0.005, 0.0002)
    assert [entry[1:] for entry in spec.measured_steps.steps[(16, 3)]] == [(32, pytest.approx(0.014))]
    assert [entry[1:] for entry in spec.measured_steps.steps[(16, 0)]] == [(16, pytest.approx(0.0053))]
    assert set(spec.measured_steps.steps) == {(16, 3), (16, 0)}


def test_a_plain_step_far_ahead_is_held_unpriced_for_a_few_steps():
    """Drafting priced at most HOLD_BELOW of a plain step: the next HOLD_STEPS choices are plain without pricing, then
    it prices again; probes still come every PROBE_AFTER steps. Drafting priced closer (yet within the drafting margin):
    held for HOLD_CLOSE_STEPS, then twice as long after each plain step priced in a row, up to HOLD_STEPS."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=False)   # nothing accepted: k = 0 far ahead
    priced = []
    real = spec.expected_rates
    spec.expected_rates = lambda *args: priced.append(len(priced)) or real(*args)
    rates = real(16)
    assert max(rates[1:]) <= HOLD_BELOW * rates[0]
    choices = [(spec.choose(rows=16), spec.probing) for _ in range(3 * PROBE_AFTER)]
    assert [k for k, probe in choices if not probe] == [0] * (3 * PROBE_AFTER - 2)
    assert [i for i, (_, probe) in enumerate(choices) if probe] == [PROBE_AFTER - 1, 3 * PROBE_AFTER - 1]
    # Priced on the first step, then every HOLD_STEPS + 1 steps, plus once at each probe for its k.
    assert len(priced) == -(-3 * PROBE_AFTER // (HOLD_STEPS + 1)) + 2
    close = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)
    close.expected_rates = lambda rows, *reading: [100.0, 100.0 * HOLD_BELOW + 1.0, 50.0, 50.0, 50.0, 50.0]
    calls = []
    real_close = close.expected_rates
    close.expected_rates = lambda *args: calls.append(step) or real_close(*args)
    for step in range(PROBE_AFTER - 1):
        assert close.choose(rows=16) == 0
    holds = [HOLD_CLOSE_STEPS, 2 * HOLD_CLOSE_STEPS]   # then HOLD_STEPS
    assert 2 * holds[-1] >= HOLD_STEPS and PROBE_AFTER - 1 > sum(holds) + 2
    assert calls == [0, holds[0] + 1, sum(holds) + 2]


def test_a_drafting_choice_is_held_unpriced_for_a_few_steps_and_still_measured():
    """Drafting 5 chosen on pricing, the plain step far behind, is chosen again for DRAFT_HOLD_STEPS steps without
    pricing; those steps are measured like priced ones (the engine times a step's parts after the choice), and the step
    after them is priced. Not where prompts wait to be read (the step that drafts reads them, and the next is priced
    without them), nor where the plain step is priced within HOLD_BELOW of drafting."""
    spec = _calibrated(0.050, 0.0, 0.001, 0.0, accept_all=True)
    priced = []
    price = spec.expected_rates
    spec.expected_rates = lambda *args: priced.append(args) or price(*args)
    assert [spec.choose(rows=1) for _ in range(1 + DRAFT_HOLD_STEPS)] == [5] * (1 + DRAFT_HOLD_STEPS)
    assert len(priced) == 1 and spec._unpriced
    spec.observe_step(1, 5, [5], draft_seconds=0.005, target_seconds=0.050, host_seconds=0.0)
    assert len(spec.measured_steps.steps[(1, 5)]) == 1   # a held drafting step is measured
    assert spec.choose(rows=1) == 5 and len(priced) == 2
    for _ in range(3):
        assert spec.choose(rows=1, unread_tokens=100, remaining_tokens=1000) == 5
    assert len(priced) == 5
    close = _calibrated(0.050, 0.0, 0.001, 0.0, accept_all=True)   # drafting priced within 10% of plain: not held
    close.expected_rates = lambda *args: priced.append(args) or [100.0, 50.0, 50.0, 50.0, 50.0, 100.0 / HOLD_BELOW - 1]
    # (the first step re-times the plain step: a rival within PLAIN_RIVAL_WITHIN, never timed yet)
    assert [close.choose(rows=1) for _ in range(4)] == [0, 5, 5, 5] and len(priced) == 9


def test_a_drafting_step_ends_the_growth_of_close_holds():
    """Plain steps priced close in a row are held longer each time; a drafting step chosen between them starts the
    holds again from HOLD_CLOSE_STEPS."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)
    close = [100.0, 100.0 * HOLD_BELOW + 1.0, 50.0, 50.0, 50.0, 50.0]
    priced = []
    spec.expected_rates = lambda rows, *reading: priced.append(len(priced)) or list(rates)
    rates = close
    choices = [spec.choose(rows=16) for _ in range(1 + HOLD_CLOSE_STEPS + 1 + 2 * HOLD_CLOSE_STEPS)]
    assert choices == [0] * len(choices) and len(priced) == 2   # priced, held 2, priced, held 4
    rates = [100.0, 100.0 * DRAFT_MARGIN + 1.0, 50.0, 50.0, 50.0, 50.0]
    before = len(priced)
    assert spec.choose(rows=16) == 1 and len(priced) - before == 1   # priced close to plain: not held
    rates = close
    before = len(priced)
    assert [spec.choose(rows=16) for _ in range(HOLD_CLOSE_STEPS + 2)] == [0] * (HOLD_CLOSE_STEPS + 2)
    assert len(priced) - before == 2   # priced, held HOLD_CLOSE_STEPS (not 8), priced


def test_a_held_plain_step_is_not_measured_but_still_decays_the_acceptance():
    """A plain step chosen unpriced (held) leaves the cost estimates as they are (the plain steps priced around it
    measure plain steps) yet counts as a step for the acceptance decay; a priced plain step is measured."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=False)   # k = 0 far ahead: held after one pricing
    assert spec.choose(rows=16) == 0 and not spec._unpriced   # priced
    spec.observe_step(16, 0, [0] * 16, draft_seconds=0.0, target_seconds=0.5, host_seconds=0.0)
    assert spec.target_cost.samples[16][-1] == 0.5
    decays = spec.acceptance.pending_decays
    assert spec.choose(rows=16) == 0 and spec._unpriced      # held
    spec.observe_step(16, 0, [0] * 16, draft_seconds=0.0, target_seconds=9.0, host_seconds=9.0)
    assert spec.target_cost.samples[16][-1] == 0.5 and spec.host_seconds[0] == 0.0
    assert spec.acceptance.pending_decays == decays + 1


def test_a_plain_step_priced_close_behind_drafting_is_retimed_now_and_then():
    """Drafting chosen, the plain step priced within PLAIN_RIVAL_WITHIN of it: one plain step every RIVAL_AFTER steps
    at that batch size (its price may come from one slow timing); priced further behind, never."""
    close = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True, max_k=1)
    close.expected_rates = lambda rows, *reading: [80.0, 100.0]

    def retimed_plain(chosen: list[int], late: int) -> bool:   # on the steps that price: up to `late` steps late
        plain = [i for i, k in enumerate(chosen) if k == 0]
        return (len(plain) == 3 and plain[0] == 0
                and all(RIVAL_AFTER <= b - a <= RIVAL_AFTER + late for a, b in zip(plain, plain[1:])))
    assert retimed_plain([close.choose(rows=16) for _ in range(3 * RIVAL_AFTER + DRAFT_HOLD_STEPS)], DRAFT_HOLD_STEPS)
    # A shrinking batch (16, 15, 16, ...): a re-timing at a batch size within NEAR_ROWS serves the others (each batch
    # size holds its own choice: the steps between them price at most every 2 * DRAFT_HOLD_STEPS).
    close = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True, max_k=1)
    close.expected_rates = lambda rows, *reading: [80.0, 100.0]
    assert retimed_plain([close.choose(rows=16 - i % 2) for i in range(3 * RIVAL_AFTER + 2 * DRAFT_HOLD_STEPS)],
                         2 * DRAFT_HOLD_STEPS)
    assert close.choose(rows=4) == 0      # none near 4 rows yet
    far = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True, max_k=1)
    far.expected_rates = lambda rows, *reading: [100.0 * PLAIN_RIVAL_WITHIN - 1.0, 100.0]
    assert [far.choose(rows=16) for _ in range(3 * RIVAL_AFTER)] == [1] * (3 * RIVAL_AFTER)


def test_a_measured_drafting_k_close_behind_a_plain_step_is_retimed_now_and_then():
    """The plain step chosen, k = 1 priced within RIVAL_WITHIN behind it: where k = 1 was measured at this batch size,
    one whole k = 1 step every RIVAL_AFTER steps (a measurement from a few slow steps must not lock it out); where it
    was not, only the one-row probes draft."""
    spec = _parts_favour_k1()
    _measure(spec, 1, 16, 30, 0.008)
    spec.expected_rates = lambda rows, *reading: [100.0, 95.0]
    chosen = [(spec.choose(rows=16), spec.probing) for _ in range(3 * RIVAL_AFTER)]
    retimed = [i for i, (k, probe) in enumerate(chosen) if k and not probe]
    # Checked on the steps that price (a plain step held between them is not), so at most HOLD_STEPS late.
    assert len(retimed) >= 2 and all(RIVAL_AFTER <= b - a <= RIVAL_AFTER + HOLD_STEPS
                                     for a, b in zip(retimed, retimed[1:]))
    assert not [i for i, (k, probe) in enumerate((spec.choose(rows=4), spec.probing) for _ in range(3 * RIVAL_AFTER))
                if k and not probe]


def _counts_row_by_row(steps, max_k):
    """The acceptance counting rule, a row at a time: positions 1..accepted accepted, the next one (if the row
    drafted it) rejected; every step decays the counts first."""
    tried, accepted = [0.0] * max_k, [0.0] * max_k
    for num_drafted, num_accepted in steps:
        tried, accepted = [t * DECAY for t in tried], [a * DECAY for a in accepted]
        for drafted, n in zip(num_drafted, num_accepted):
            for i in range(min(n + 1, drafted, max_k)):
                tried[i] += 1.0
                accepted[i] += 1.0 if i < n else 0.0
    return tried, accepted


def test_acceptance_counts_of_ragged_batches_equal_the_row_by_row_rule():
    """The batch counting (rows binned by how far they reached) against the rule row by row, on random steps with
    rows that drafted fewer than k, none, or all accepted."""
    rng = random.Random(5)
    for max_k in (1, 3, 5):
        estimate, steps = AcceptanceEstimate(max_k), []
        for _ in range(60):
            num_drafted = [rng.randint(0, max_k) for _ in range(rng.randint(1, 20))]
            steps.append((num_drafted, [rng.randint(0, d) for d in num_drafted]))
            estimate.observe(*steps[-1])
        tried, accepted = _counts_row_by_row(steps, max_k)
        estimate.rates()   # applies the pending decays
        assert estimate.tried == pytest.approx(tried, rel=1e-12)
        assert estimate.accepted == pytest.approx(accepted, rel=1e-12)


def test_plain_steps_decay_the_acceptance_counts_when_next_read():
    """Steps that try nothing decay the counts once per step, as every step does, applied when next read or added
    to: the rates equal those of decaying on every step."""
    estimate = AcceptanceEstimate(2)
    steps = [([2, 2], [2, 1]), ([0, 0], [0, 0]), ([0, 0], [0, 0]), ([2, 1], [0, 1]), ([0, 0], [0, 0])]
    for num_drafted, num_accepted in steps:
        estimate.observe(num_drafted, num_accepted)
    tried, accepted = _counts_row_by_row(steps, 2)
    first = (accepted[0] + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (tried[0] + PRIOR_WEIGHT)
    second = (accepted[1] + first * PRIOR_WEIGHT) / (tried[1] + PRIOR_WEIGHT)
    assert estimate.rates() == pytest.approx([first, second], rel=1e-12)
    assert estimate.tried == pytest.approx(tried, rel=1e-12) and estimate.accepted == pytest.approx(accepted, rel=1e-12)


def test_the_tokens_left_to_write_are_asked_for_only_when_a_step_is_priced():
    """remaining_tokens as a function: called once on a priced step, not on a held plain step, and its value prices
    the step as a number would."""
    spec = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=False)   # nothing accepted: plain, held
    asked = []
    choices = [spec.choose(16, 0, lambda: asked.append(1) or 50.0) for _ in range(HOLD_STEPS + 2)]
    assert choices == [0] * (HOLD_STEPS + 2) and len(asked) == 2   # priced, HOLD_STEPS held, priced again
    reading = _calibrated(0.001, 0.001, 0.0005, 0.0002, accept_all=True)
    reading.read_cost.observe(1000, 0.5)
    assert reading._priced(16, 800, lambda: 40.0) == reading.expected_rates(16, 800, 40.0)
