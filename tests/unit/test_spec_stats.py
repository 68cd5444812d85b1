"""Speculation statistics: a batch step's counts in one call equal its rows' counts one by one."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from anydraft.metrics import SpecStats

K = 5


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(st.tuples(st.integers(0, K), st.integers(0, K)), min_size=1, max_size=64),
                      min_size=1, max_size=6))
def test_a_batch_step_counts_as_its_rows_one_by_one(steps):
    """observe_steps (the engine's total, a few calls a step) against observe_step per row: forwards, drafted,
    accepted, acceptance by position, the k histogram."""
    batched, by_row = SpecStats(K), SpecStats(K)
    for rows in steps:
        drafted = [d for d, _ in rows]
        accepted = [min(a, d) for d, a in rows]          # a row accepts at most what it drafted
        batched.observe_steps(accepted, drafted)
        for a, d in zip(accepted, drafted):
            by_row.observe_step(a, d)
    assert batched.to_dict() == by_row.to_dict()
    assert batched.target_forwards == sum(map(len, steps))
