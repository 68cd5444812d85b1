"""SamplingParams: the batch-wide greedy test agrees with each request's own `greedy`; a seed is 64 bits."""
from __future__ import annotations

import pytest

from anydraft.config import SamplingParams


@pytest.mark.parametrize("temperatures, expected", [([], True), ([0], True), ([0, 0, 0], True), ([0.7], False),
                                                    ([0, 1e-6], False), ([1.0, 0, 0.5], False)])
def test_all_greedy_is_every_greedy(temperatures, expected):
    params = [SamplingParams(temperature=t) for t in temperatures]
    assert SamplingParams.all_greedy(params) is expected
    assert all(p.greedy for p in params) is expected


@pytest.mark.parametrize("seed", [2 ** 64, -2 ** 63 - 1, 1.5, "7"])
def test_a_seed_is_a_64_bit_integer(seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"):
        SamplingParams(seed=seed)
    for ok in (None, 0, -2 ** 63, 2 ** 64 - 1):
        assert SamplingParams(seed=ok).seed == ok
