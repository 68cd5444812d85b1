"""RequestStates: rows of vLLM's persistent batch find their draft state by token history alone."""
from __future__ import annotations

import numpy as np

from anydraft.integrations.vllm.request_states import Claim, RequestStates


def h(*ids):
    return np.array(ids, dtype=np.int32)


def step(states: RequestStates, rows_histories: dict[int, np.ndarray]):
    rows = list(rows_histories)
    claims, evicted = states.match(rows, [rows_histories[r] for r in rows])
    for claim in claims:
        if claim.slot is not None:
            states.record(claim.slot, rows_histories[claim.row], [])
    return {c.row: c for c in claims}, evicted


def test_new_rows_get_fresh_states_and_keep_them():
    states = RequestStates(4)
    claims, evicted = step(states, {0: h(1, 2, 3), 1: h(7, 8)})
    assert all(c.fresh for c in claims.values()) and evicted == []
    again, _ = step(states, {0: h(1, 2, 3, 4), 1: h(7, 8, 9, 10)})
    assert again[0] == Claim(0, claims[0].slot) and again[1] == Claim(1, claims[1].slot)


def test_moved_rows_follow_their_history():
    states = RequestStates(4)
    first, _ = step(states, {0: h(1, 2), 1: h(5, 6), 2: h(9, 9)})
    # row 0 finished; condense moves row 2 into row 0; row 1 swapped with nothing
    moved, _ = step(states, {0: h(9, 9, 4), 1: h(5, 6, 4)})
    assert moved[0].slot == first[2].slot and not moved[0].fresh
    assert moved[1].slot == first[1].slot


def test_rewritten_row_is_not_served_the_old_state():
    states = RequestStates(4)
    first, _ = step(states, {0: h(1, 2, 3)})
    rewritten, _ = step(states, {0: h(1, 2, 4, 5)})       # same row, same start, other tokens
    assert rewritten[0].fresh and rewritten[0].slot != first[0].slot


def test_same_history_in_two_rows_gets_two_states():
    states = RequestStates(4)
    claims, _ = step(states, {0: h(1, 2), 1: h(1, 2)})
    assert claims[0].slot != claims[1].slot


def test_preempted_request_resumes_with_its_state_and_lru_eviction():
    states = RequestStates(2)
    first, _ = step(states, {0: h(1, 2), 1: h(3, 4)})
    step(states, {0: h(1, 2, 5)})                      # row 1 preempted: its state idles
    resumed, evicted = step(states, {0: h(1, 2, 5, 6), 1: h(3, 4, 8)})
    assert resumed[1].slot == first[1].slot and not resumed[1].fresh and evicted == []
    step(states, {0: h(1, 2, 5, 6, 7)})                # the request in row 1 finished
    newcomer, evicted = step(states, {0: h(1, 2, 5, 6, 7, 8), 1: h(42, 43)})
    assert newcomer[1].fresh and evicted == [first[1].slot]


def test_more_rows_than_slots_leaves_rows_undrafted():
    states = RequestStates(1)
    claims, _ = step(states, {0: h(1), 1: h(2)})
    assert claims[0].slot is not None and claims[1].slot is None


def test_longest_extended_state_wins():
    states = RequestStates(4)
    first, _ = step(states, {0: h(1, 2), 1: h(1, 2, 3, 4)})   # two requests, one a prefix of the other
    claims, _ = step(states, {2: h(1, 2, 3, 4, 5)})           # a new chat turn extending the longer one
    assert not claims[2].fresh and claims[2].slot == first[1].slot
