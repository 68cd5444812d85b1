"""The native logprob kernel (csrc/row_logprobs.cpp) against spec_decode/logprobs.py's PyTorch rules on hand-made bf16
logits: the same top ids (ties to the lowest id, rows with more ties than candidates), the same ranks, values
closer to float64's log_softmax than float32's own; a row's answer does not depend on its batch."""
from __future__ import annotations

import pytest
import torch

from anydraft.model.native_extension import load_extension
from anydraft.spec_decode.logprobs import token_logprobs

from test_native_decoder import HARDWARE

pytestmark = pytest.mark.skipif(HARDWARE is not None, reason=f"hardware: {HARDWARE}")
VALUE_TOLERANCE = 1e-5   # vs float64; PyTorch's float32 log_softmax of a 151,936 row errs up to ~2e-5


@pytest.fixture(scope="module")
def kernel():
    return load_extension()


def logits_of(kind: str, rows: int, width: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, generator=generator) * 3
    if kind == "coarse":     # many equal values among the largest
        x = (x * 2).round() / 2
    elif kind == "uniform":  # every entry tied: more ties than candidates
        x[:] = 1.5
    elif kind == "few finite":
        x[:, 5:] = float("-inf")
    x = x.to(torch.bfloat16)
    x[:, vocab:] = float("-inf")   # padding rows, as the runner masks them
    return x


@pytest.mark.parametrize("width,vocab", [(151936, 151669), (64, 60), (37, 30)])
@pytest.mark.parametrize("kind", ["randn", "coarse", "uniform", "few finite"])
def test_the_kernel_follows_the_pytorch_rules(kernel, width, vocab, kind):
    generator = torch.Generator().manual_seed(width + len(kind))
    logits = logits_of(kind, 12, width, vocab, generator)
    chosen = torch.randint(0, vocab, (12,), generator=generator)
    chosen[::3] = logits[::3, :vocab].float().argmax(-1)   # greedy rows next to sampled ones
    reference = torch.log_softmax(logits[:, :vocab].double(), dim=-1)
    for n in (0, 1, 5, 20):
        mine = token_logprobs(logits.view(3, 4, width), chosen.view(3, 4), n, vocab, kernel)
        rules = token_logprobs(logits.view(3, 4, width), chosen.view(3, 4), n, vocab)
        assert torch.equal(mine.top_ids, rules.top_ids) and torch.equal(mine.rank, rules.rank), (kind, n)
        assert mine.top_ids.shape == (3, 4, n) and mine.logprob.dtype == torch.float32
        wanted = reference.gather(-1, chosen[:, None])[:, 0]
        got = mine.logprob.view(-1).double()
        assert torch.equal(got.isfinite(), wanted.isfinite())
        ok = wanted.isfinite()
        assert (got[ok] - wanted[ok]).abs().max() <= VALUE_TOLERANCE
        tops, got_tops = reference.gather(-1, mine.top_ids.view(12, n)), mine.top_logprobs.view(12, n).double()
        assert torch.equal(got_tops.isfinite(), tops.isfinite())
        ok = tops.isfinite()
        assert ((got_tops[ok] - tops[ok]).abs() <= VALUE_TOLERANCE).all()
        assert torch.equal(got_tops[~ok], tops[~ok])   # -inf where the row has fewer finite entries than n


def test_rows_without_a_token_are_skipped_and_others_unchanged(kernel):
    generator = torch.Generator().manual_seed(1)
    logits = logits_of("randn", 6, 4096, 4000, generator)
    chosen = torch.randint(0, 4000, (6,), generator=generator)
    full = token_logprobs(logits, chosen, 3, 4000, kernel)
    chosen[[1, 4]] = -1   # past a row's emitted tokens
    part = token_logprobs(logits, chosen, 3, 4000, kernel)
    kept = chosen >= 0
    assert torch.equal(part.logprob[kept], full.logprob[kept]) and torch.equal(part.top_ids[kept], full.top_ids[kept])
    assert (part.logprob[~kept] == 0).all() and (part.top_ids[~kept] == 0).all()


def test_a_row_alone_equals_the_same_row_in_a_batch(kernel):
    generator = torch.Generator().manual_seed(2)
    logits = logits_of("randn", 16, 151936, 151669, generator)
    chosen = logits[:, :151669].float().argmax(-1)
    batch = token_logprobs(logits, chosen, 5, 151669, kernel)
    for r in (0, 7, 15):
        alone = token_logprobs(logits[r:r + 1], chosen[r:r + 1], 5, 151669, kernel)
        assert torch.equal(alone.logprob, batch.logprob[r:r + 1])
        assert torch.equal(alone.top_logprobs, batch.top_logprobs[r:r + 1])
        assert torch.equal(alone.top_ids, batch.top_ids[r:r + 1])
