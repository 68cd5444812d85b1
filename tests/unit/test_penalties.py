"""Penalties and logit bias on hand-made logits: vLLM's formulas, and inside a step each position counts the drafts
before it (checked against a position-by-position reference that rebuilds the counts from scratch)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.spec_decode.penalties import penalize, penalty_batch

VOCAB = 12


def request(output: list[int], prompt: list[int], **params) -> SimpleNamespace:
    return SimpleNamespace(output_target_ids=output, prompt_target_ids=prompt, params=SamplingParams(**params))


def reference(logits: torch.Tensor, output: list[int], prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """One position's penalized logits [V], written out token by token as vLLM's docs define them."""
    out = logits.clone().double()
    for target_id, bias in (params.logit_bias or {}).items():
        out[target_id] += bias
    for t in range(len(out)):
        count = output.count(t)
        if count or t in prompt:
            out[t] = out[t] / params.repetition_penalty if out[t] > 0 else out[t] * params.repetition_penalty
        out[t] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


PARAMS = [dict(presence_penalty=0.7), dict(frequency_penalty=1.3), dict(repetition_penalty=1.8),
          dict(logit_bias={3: 5.0, 7: -100.0}),
          dict(presence_penalty=-0.4, frequency_penalty=0.9, repetition_penalty=0.6, logit_bias={2: 1.5})]


@pytest.mark.parametrize("params", PARAMS, ids=[",".join(p) for p in PARAMS])
def test_each_position_counts_the_drafts_before_it(params):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, VOCAB, generator=generator, dtype=torch.float64) * 3   # [B, k+1, V]
    drafts = torch.tensor([[4, 4, 9, 4], [1, 2, 1, 3]])                               # repeats within the step
    requests = [request([4, 9, 9], [2, 5, 4], **params), request([], [1], **params)]
    batch = penalty_batch(requests, VOCAB, torch.device("cpu"))
    got = penalize(logits, batch, drafts)
    for b, r in enumerate(requests):
        for i in range(5):
            expected = reference(logits[b, i], r.output_target_ids + drafts[b, :i].tolist(), r.prompt_target_ids,
                                 r.params)
            torch.testing.assert_close(got[b, i], expected, rtol=0, atol=1e-12)


def test_stale_counts_differ_from_the_reference():
    """Negative control for the test above: penalizing every position with the counts before the step (the drafts
    left out) gives other values wherever a draft repeats."""
    logits = torch.randn(1, 4, VOCAB, dtype=torch.float64)
    drafts = torch.tensor([[6, 6, 6]])
    r = request([], [1], frequency_penalty=1.0)
    batch = penalty_batch([r], VOCAB, torch.device("cpu"))
    expected = reference(logits[0, 3], drafts[0].tolist(), [1], r.params)
    assert not torch.allclose(penalize(logits, batch)[0, 3], expected)   # stale: drafts left out
    torch.testing.assert_close(penalize(logits, batch, drafts)[0, 3], expected, rtol=0, atol=1e-12)


def test_unpenalized_rows_and_padding_stay_as_they_are():
    logits = torch.randn(3, 2, VOCAB)
    logits[..., VOCAB - 2:] = float("-inf")   # padding rows
    requests = [request([0], [0]), request([0, 0], [5], presence_penalty=2.0, logit_bias={VOCAB - 1: 100.0}),
                request([1], [1])]
    batch = penalty_batch(requests, VOCAB, torch.device("cpu"))
    got = penalize(logits, batch, torch.tensor([[0], [0], [0]]))
    assert torch.equal(got[[0, 2]], logits[[0, 2]])
    assert torch.isinf(got[1, :, VOCAB - 2:]).all() and (got[1, :, VOCAB - 2:] < 0).all()   # a bias never revives one
    assert got.dtype == torch.float32 and torch.equal(logits, logits)   # the input is left as it was
    assert penalty_batch([request([0], [0])], VOCAB, torch.device("cpu")) is None


def test_bf16_logits_are_penalized_in_float32():
    logits = torch.randn(1, 1, VOCAB).bfloat16()
    r = request([3], [3], repetition_penalty=1.3)
    got = penalize(logits, penalty_batch([r], VOCAB, torch.device("cpu")))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[0, 0].double(), reference(logits[0, 0].float(), [3], [3], r.params))


@pytest.mark.parametrize("bad, words", [(dict(presence_penalty=2.5), "presence_penalty must be a number in [-2, 2]"),
                                        (dict(frequency_penalty=float("inf")), "frequency_penalty"),
                                        (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
                                        (dict(logit_bias={-1: 1.0}), "logit_bias keys must be target token ids"),
                                        (dict(logit_bias={1: 101.0}), "logit_bias values must be numbers in")])
def test_out_of_range_settings_say_what_is_allowed(bad, words):
    with pytest.raises(ValueError) as error:
        SamplingParams(**bad)
    assert words in str(error.value)
