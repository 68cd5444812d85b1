"""Sampling with an EAGLE-3 drafter whose head is reduced (d2t): chi-square tests against the target's exact
distribution and against the target alone, with a negative control on the scatter into the target vocabulary.

The target is the peaked small one of test_sampling_distribution (1296 rows); the drafter has 640 head rows
(the most frequent tokens) and agrees with the target part of the time, so accepted drafts, recovered tokens
(the residual max(p - q, 0)) and bonus tokens all occur.
"""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.llm import LLM

from hidden_state_models import HiddenStateCheckpoints
from test_sampling_distribution import (MAX_TOKENS, NUM_SAMPLES, P_VALUE_MIN, PROMPT, goodness_of_fit,
                                        later_position_p_values, verified_tokens)
from tiny_models import reference_first_token_probs

K = 3
SEEDS = {"eagle3": 7_000_000, "target_alone": 8_000_000, "broken_scatter": 9_000_000}


def _sample(llm, kind: str) -> list[tuple]:
    params = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=SEEDS[kind] + i) for i in range(NUM_SAMPLES)]
    outputs = llm.generate([PROMPT] * NUM_SAMPLES, params)
    forwards = sum(o.metrics["target_forwards"] for o in outputs)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    print(f"\n[{kind}] mean accepted per step {accepted / max(forwards, 1):.2f}")
    if kind != "target_alone":
        assert 0 < accepted / forwards < K   # acceptance and the residual draw both run
    return [tuple(o.outputs[0].token_ids) + (None,) * (MAX_TOKENS - len(o.outputs[0].token_ids)) for o in outputs]


def _broken_scatter(vocab):
    """The bug class this file must catch: the draft samples its token correctly in its own head rows, but q
    is scattered into the target vocabulary without the d2t offsets (row i put at target id i), so the q the
    verifier sees is not the distribution the token came from."""
    wrong_index = torch.arange(vocab.size)

    def target_logits(head_logits):
        out = torch.full((*head_logits.shape[:-1], vocab.target_vocab_rows), float("-inf"), dtype=head_logits.dtype)
        return out.index_copy_(-1, wrong_index, head_logits)

    def head_probs(target_probs):   # reads the head rows back where they were put: the draw itself is right
        return target_probs.index_select(-1, wrong_index)
    vocab.target_logits, vocab.head_probs = target_logits, head_probs


@pytest.fixture(scope="module")
def samples(ckpts, llms):
    drafts = HiddenStateCheckpoints(ckpts)
    cache = {}

    def get(kind):
        if kind not in cache:
            if kind == "broken_scatter":   # its own LLM: the shared one must stay correct
                llm = LLM(model=str(ckpts.small_target), dtype="float32", device="cpu", max_num_seqs=64,
                          max_model_len=256, speculative_config={"model": str(drafts.small_eagle3_sampling),
                                                                 "num_speculative_tokens": K})
                _broken_scatter(llm.proposer.vocab)
            else:
                llm = llms.get(ckpts.small_target, None if kind == "target_alone" else drafts.small_eagle3_sampling,
                               k=K, max_num_seqs=64, dtype="float32")
            if kind != "target_alone":
                assert llm.proposer.vocab.head_to_target is not None and llm.proposer.vocab.size == 640
            cache[kind] = _sample(llm, kind)
        return cache[kind]

    return get


def test_eagle3_verified_token_follows_exact_target_softmax(ckpts, samples):
    first, second_target_ids = verified_tokens(samples("eagle3"))
    probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    assert all(probs[t] > 0 for t in second_target_ids)
    p_value = goodness_of_fit(second_target_ids, probs)
    print(f"\n[eagle3] verified token after {first} ({len(second_target_ids)} samples): p = {p_value:.3g}")
    assert p_value > P_VALUE_MIN


def test_eagle3_later_positions_match_target_alone(samples):
    p_values = later_position_p_values(samples("eagle3"), samples("target_alone"))
    print(f"\n[eagle3] positions 3..{MAX_TOKENS} vs target alone: p = {', '.join(f'{p:.3g}' for p in p_values)}")
    assert min(p_values) > P_VALUE_MIN


def test_broken_scatter_is_detected(ckpts, samples):
    """Negative control: the same statistics, same sample size, reject the drafter whose q went through a wrong
    scatter index."""
    broken = samples("broken_scatter")
    first, second_target_ids = verified_tokens(broken)
    probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    verified_p = goodness_of_fit(second_target_ids, probs)
    later = later_position_p_values(broken, samples("target_alone"))
    print(f"\n[broken scatter] verified token p = {verified_p:.3g}; later positions p = "
          f"{', '.join(f'{p:.3g}' for p in later)}")
    assert min([verified_p] + later) < P_VALUE_MIN
