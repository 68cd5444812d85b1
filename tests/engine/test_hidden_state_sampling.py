"""Sampling with hidden-state drafters whose head is reduced (d2t): EAGLE-3 and DSpark (anchor-first block).
Chi-square tests against the target's exact distribution and against the target alone, with a negative control
on the scatter into the target vocabulary, at the same sample size.

The target is the peaked small one of test_sampling_distribution (1296 rows); each drafter has 640 head rows
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
from reference_model import reference_first_token_probs

K = 3
DRAFTERS = {"eagle3": "small_eagle3_sampling", "dspark": "small_dspark_sampling"}   # kind -> checkpoint
SEEDS = {"eagle3": 7_000_000, "dspark": 10_000_000, "target_alone": 8_000_000, "broken_scatter eagle3": 9_000_000,
         "broken_scatter dspark": 11_000_000}


def _sample(llm, name: str) -> list[tuple]:
    params = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=SEEDS[name] + i) for i in range(NUM_SAMPLES)]
    outputs = llm.generate([PROMPT] * NUM_SAMPLES, params)
    forwards = sum(o.metrics["target_forwards"] for o in outputs)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    print(f"\n[{name}] mean accepted per step {accepted / max(forwards, 1):.2f}")
    if name != "target_alone":
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

    def get(name):
        if name not in cache:
            kind = name.split()[-1]
            draft = None if name == "target_alone" else getattr(drafts, DRAFTERS[kind])
            if name.startswith("broken_scatter"):   # its own LLM: the shared one must stay correct
                llm = LLM(model=str(ckpts.small_target), dtype="float32", device="cpu", max_num_seqs=64,
                          max_model_len=256, speculative_config={"model": str(draft), "num_speculative_tokens": K,
                                                                 "adaptive": False})
                _broken_scatter(llm.proposer.vocab)
            else:
                llm = llms.get(ckpts.small_target, draft, k=K, max_num_seqs=64, dtype="float32")
            if draft is not None:
                assert llm.draft_info["vocab_mode"] == kind
                assert llm.proposer.vocab.head_to_target is not None and llm.proposer.vocab.size == 640
            cache[name] = _sample(llm, name)
        return cache[name]

    return get


@pytest.mark.parametrize("kind", DRAFTERS)
def test_verified_token_follows_exact_target_softmax(ckpts, samples, kind):
    first, second_target_ids = verified_tokens(samples(kind))
    probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    assert all(probs[t] > 0 for t in second_target_ids)
    p_value = goodness_of_fit(second_target_ids, probs)
    print(f"\n[{kind}] verified token after {first} ({len(second_target_ids)} samples): p = {p_value:.3g}")
    assert p_value > P_VALUE_MIN


@pytest.mark.parametrize("kind", DRAFTERS)
def test_later_positions_match_target_alone(samples, kind):
    p_values = later_position_p_values(samples(kind), samples("target_alone"))
    print(f"\n[{kind}] positions 3..{MAX_TOKENS} vs target alone: p = {', '.join(f'{p:.3g}' for p in p_values)}")
    assert min(p_values) > P_VALUE_MIN


@pytest.mark.parametrize("kind", DRAFTERS)
def test_broken_scatter_is_detected(ckpts, samples, kind):
    """Negative control: the same statistics, same sample size, reject the drafter whose q went through a wrong
    scatter index."""
    broken = samples(f"broken_scatter {kind}")
    first, second_target_ids = verified_tokens(broken)
    probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    verified_p = goodness_of_fit(second_target_ids, probs)
    later = later_position_p_values(broken, samples("target_alone"))
    print(f"\n[broken scatter {kind}] verified token p = {verified_p:.3g}; later positions p = "
          f"{', '.join(f'{p:.3g}' for p in later)}")
    assert min([verified_p] + later) < P_VALUE_MIN
