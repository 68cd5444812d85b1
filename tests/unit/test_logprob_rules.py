"""The logprob rules on hand-made logits (spec_decode/logprobs.py): raw log_softmax over the tokenizer's rows,
rank, top-n largest first with the lowest id on ties (inside the top-n and at its boundary), padding rows never in
the top-n, and the packed host layout."""
from __future__ import annotations

import math

import pytest
import torch

from anydraft.spec_decode import logprobs as logprobs_module
from anydraft.spec_decode.logprobs import pack, raw_logprobs, token_logprobs, top_n, unpack


@pytest.fixture(params=["host picks rows", "every row"])
def full_passes(request, monkeypatch):
    """Both ways of taking the full passes: rows picked on the host (CPU), or all rows (an accelerator)."""
    if request.param == "every row":
        monkeypatch.setattr(logprobs_module, "_host_reads_free", lambda t: False)
    return request.param


def brute_top(values: list[float], n: int) -> list[tuple[int, float]]:
    return sorted(enumerate(values), key=lambda p: (-p[1], p[0]))[:n]


def test_raw_logprobs_ignore_padding_rows_and_keep_float64():
    logits = torch.tensor([[1.0, 2.0, 3.0, 50.0, 60.0]], dtype=torch.float64)   # rows 3, 4: padding
    out = raw_logprobs(logits, 3)
    assert out.dtype == torch.float64 and out.shape == (1, 3)
    expected = [x - math.log(math.exp(1) + math.exp(2) + math.exp(3)) for x in (1.0, 2.0, 3.0)]
    assert torch.allclose(out[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)
    assert raw_logprobs(logits.to(torch.bfloat16), 3).dtype == torch.float32


def test_top_n_breaks_ties_by_the_lowest_id(full_passes):
    # Ties inside the top-n (ids 2 and 5 at 4.0) and at its boundary (ids 1, 3, 6, 7 at 2.0; two of them fit).
    values = [0.0, 2.0, 4.0, 2.0, 5.0, 4.0, 2.0, 2.0, -1.0]
    logits = torch.tensor(values)
    for n in range(0, len(values) + 1):
        got_values, got_ids = top_n(logits, n)
        assert list(zip(got_ids.tolist(), got_values.tolist())) == brute_top(values, n), n


@pytest.mark.parametrize("levels", [6, 1000])   # ties everywhere (more than the candidates), or few
def test_top_n_and_ranks_on_many_random_rows_match_the_rule(full_passes, levels):
    generator = torch.Generator().manual_seed(levels)
    logits = torch.randint(0, levels, (50, 3, 60), generator=generator).float()
    chosen = torch.randint(0, 60, (50, 3), generator=generator)   # often outside the candidates
    out = token_logprobs(logits, chosen, 7, vocab_size=60)
    lp = torch.log_softmax(logits, -1)
    values, ids = top_n(lp, 7)
    assert torch.equal(values, out.top_logprobs) and torch.equal(ids, out.top_ids)
    for row, token, rank, got_v, got_i in zip(lp.reshape(-1, 60).tolist(), chosen.reshape(-1).tolist(),
                                              out.rank.reshape(-1).tolist(), values.reshape(-1, 7).tolist(),
                                              ids.reshape(-1, 7).tolist()):
        assert list(zip(got_i, got_v)) == brute_top(row, 7)
        assert rank == 1 + sum(v > row[token] for v in row)


def test_padding_rows_never_appear_even_where_their_logits_are_largest():
    logits = torch.tensor([[0.5, 0.1, 0.3, 9.0, 9.0]])
    out = token_logprobs(logits, torch.tensor([1]), 3, vocab_size=3)
    assert out.top_ids.tolist() == [[0, 2, 1]]
    assert out.rank.tolist() == [3]


def test_token_logprobs_rank_and_chosen_value(full_passes):
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    out = token_logprobs(logits, torch.tensor([2, -1]), 2, vocab_size=4)   # -1: no token there
    lp = torch.log_softmax(logits, -1)
    assert out.logprob[0].item() == lp[0, 2].item()
    assert out.rank.tolist()[0] == 1   # a tie with id 0 is not a larger value
    assert out.top_ids.tolist()[0] == [0, 2]
    out = token_logprobs(logits, torch.tensor([3, 0]), 0, vocab_size=4)
    assert out.rank.tolist() == [3, 1] and out.top_ids.shape == (2, 0)


def test_pack_and_unpack_round_trip_each_rows_own_top_n():
    logits = torch.randn(2, 3, 30, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[4, 7, 29], [0, 1, 2]])
    out = token_logprobs(logits, ids, 5, vocab_size=30)
    host = pack(out).tolist()
    for b in range(2):
        for s in range(3):
            logprob, rank, top = unpack(host[b][s], 2)
            assert logprob == out.logprob[b, s].item() and rank == out.rank[b, s].item()
            assert top == list(zip(out.top_ids[b, s, :2].tolist(), out.top_logprobs[b, s, :2].tolist()))
