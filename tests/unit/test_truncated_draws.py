"""The top-p cut from the largest logits and a bound on the rest's mass (truncated_draws), on hand-made logits: where
it decides, it is the cut over every logit (sampling.cutoff_of); where it cannot, it says so."""
from __future__ import annotations

import math

import pytest
import torch

from anydraft.spec_decode.sampling import cutoff_from_top, cutoff_of
from anydraft.spec_decode.truncated_draws import cutoff_within_mass_bound

VOCAB = 20_000
SELECTED = 288


def _scaled_logits(rows: int, lead: float, seed: int, temperature: float = 0.7) -> torch.Tensor:   # [rows, 1, V]
    """LM-like rows: a bulk of small logits and a few candidates `lead` above it, in bf16 (ties as the head's)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, 1, VOCAB, generator=generator, dtype=torch.float64) * 2
    logits[..., :6] += lead * torch.rand(rows, 1, 6, generator=generator, dtype=torch.float64)
    return logits.to(torch.bfloat16).double() / temperature


def _rest_log_mass(scaled: torch.Tensor, kind: str) -> torch.Tensor:   # [rows, 1, 2]
    """Bounds (lower, upper) on the log-mass past the SELECTED largest: nothing known below, every other row at the
    smallest selected above ("coarse"); the exact mass on both sides ("exact", as tight as bounds get); the exact
    mass above only ("upper"); or none at all ("none": not a bound, the control)."""
    ranked = scaled.sort(dim=-1, descending=True).values
    nothing = torch.full_like(ranked[..., :1], float("-inf"))
    exact = torch.logsumexp(ranked[..., SELECTED:], dim=-1, keepdim=True)
    coarse = ranked[..., SELECTED - 1:SELECTED] + math.log(VOCAB - SELECTED)
    lower, upper = {"coarse": (nothing, coarse), "exact": (exact, exact), "upper": (nothing, exact),
                    "none": (nothing, nothing)}[kind]
    return torch.cat([lower, upper], dim=-1)


def _bounded(scaled: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor, kind: str) -> list:
    """Each row's cut from its SELECTED largest logits and the rest's bound, None where it is not decided."""
    cutoff, decided = cutoff_within_mass_bound(scaled.topk(SELECTED, dim=-1).values, top_k, top_p, VOCAB,
                                               _rest_log_mass(scaled, kind))
    return [cutoff[i:i + 1] if decided[i] else None for i in range(len(cutoff))]


def _agree(bounded: list, exact: torch.Tensor) -> list[bool]:
    return [cut is not None and torch.equal(cut, exact[i:i + 1]) for i, cut in enumerate(bounded)]


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.9, 0.95])
def test_a_cut_the_bound_decides_is_the_cut_over_every_logit(top_p):
    scaled = _scaled_logits(200, lead=20.0, seed=int(top_p * 100))
    top_ps = torch.full((200,), top_p, dtype=torch.float64)
    exact = cutoff_of(scaled, None, top_ps)                                                   # [200, 1, 1]
    bounded = _bounded(scaled, None, top_ps, "coarse")
    decided = [i for i, cut in enumerate(bounded) if cut is not None]
    assert len(decided) >= 170, len(decided)   # a clear lead: even a coarse bound rarely matters
    assert sum(_agree(bounded, exact)) == len(decided)


def test_a_flat_row_under_a_coarse_bound_is_left_undecided_never_cut_wrongly():
    scaled = _scaled_logits(100, lead=10.0, seed=7)
    top_ps = torch.full((100,), 0.9, dtype=torch.float64)
    exact = cutoff_of(scaled, None, top_ps)
    coarse = _bounded(scaled, None, top_ps, "coarse")
    assert sum(cut is None for cut in coarse) >= 50   # the tail's mass could move the cut: every logit is needed
    assert sum(_agree(coarse, exact)) == sum(cut is not None for cut in coarse)
    # The tightest upper bound (the rest's exact mass) decides more rows, rightly, though not those whose cut the
    # rest's own mass could move (nothing known below it); exact on both sides, every row whose nucleus lies within
    # the selection.
    upper = _bounded(scaled, None, top_ps, "upper")
    assert sum(_agree(upper, exact)) == sum(cut is not None for cut in upper) > sum(cut is not None for cut in coarse)
    tight = _bounded(scaled, None, top_ps, "exact")
    smallest_selected = scaled.topk(SELECTED, dim=-1).values[..., -1]
    within = [bool(exact[i, 0, 0] > smallest_selected[i, 0]) for i in range(100)]
    assert _agree(tight, exact) == within and sum(within) > sum(cut is not None for cut in upper)
    # Control: the selection's own mass taken as the vocabulary's (no bound) cuts some of these rows wrongly.
    unbounded = _bounded(scaled, None, top_ps, "none")
    assert sum(cut is not None and not torch.equal(cut, exact[i:i + 1]) for i, cut in enumerate(unbounded)) >= 10


def test_rows_with_and_without_top_k_in_one_batch():
    """A top-k row's top-p divides by its kept tokens' mass (known exactly); a top-p-alone row by the bound."""
    scaled = _scaled_logits(64, lead=20.0, seed=11)
    top_k = torch.tensor([0, 5, 20, 0] * 16)
    top_p = torch.tensor([0.9, 0.8, 0.95, 1.0] * 16, dtype=torch.float64)
    exact = cutoff_of(scaled, top_k, top_p)
    bounded = _bounded(scaled, top_k, top_p, "coarse")
    decided = [i for i, cut in enumerate(bounded) if cut is not None]
    assert {i % 4 for i in decided} == {0, 1, 2, 3}
    assert sum(_agree(bounded, exact)) == len(decided)
    assert all(bounded[i] is not None for i in range(64) if i % 4 in (1, 2, 3))   # exact masses: always decided
    # Rows with a top-k cut alone: the batch's cut, decided everywhere, without any mass.
    top = scaled.topk(SELECTED, dim=-1).values
    assert torch.equal(cutoff_from_top(top[1::4], top_k[1::4], top_p[1::4], VOCAB), exact[1::4])


def test_a_selection_of_every_row_is_decided_by_its_own_mass():
    """Where the selection is the whole vocabulary (a small head, or the wider retry on one), the rest is empty: the
    cut is the cut over every logit, with nothing to decide."""
    scaled = _scaled_logits(8, lead=10.0, seed=3)[..., :SELECTED]
    top_p = torch.full((8,), 0.9, dtype=torch.float64)
    top = scaled.sort(dim=-1, descending=True).values
    nothing = torch.full((8, 1, 2), float("-inf"), dtype=torch.float64)
    cutoff, decided = cutoff_within_mass_bound(top, None, top_p, SELECTED, nothing)
    assert decided is None and torch.equal(cutoff, cutoff_of(scaled, None, top_p))
