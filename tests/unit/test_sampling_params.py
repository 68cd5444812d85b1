"""SamplingParams: the batch-wide greedy test agrees with each request's own `greedy`; a seed is 64 bits; a
temperature is finite and at most float32's largest; a top_k fits 64 bits."""
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


@pytest.mark.parametrize("temperature", [-0.1, float("nan"), float("inf"), -float("inf"), 1e300, 3.5e38])
def test_a_temperature_is_finite_and_fits_float32(temperature):
    with pytest.raises(ValueError, match=r"temperature must be >= 0 \(0 = greedy\), finite and at most 3.403e\+38"):
        SamplingParams(temperature=temperature)
    for ok in (0, 0.0, 1e-300, 0.7, 3.4e38):
        assert SamplingParams(temperature=ok).temperature == ok


@pytest.mark.parametrize("top_k", [-2, 2 ** 63])
def test_a_top_k_is_minus_one_or_a_64_bit_count(top_k):
    with pytest.raises(ValueError, match=r"top_k must be in \[-1, 2\*\*63\)"):
        SamplingParams(top_k=top_k)
    for ok in (-1, 0, 1, 10 ** 7, 2 ** 63 - 1):
        assert SamplingParams(top_k=ok).top_k == ok
