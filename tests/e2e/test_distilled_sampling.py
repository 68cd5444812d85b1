"""The shipped distilled drafts under sampling: what speculation emits follows the target's distribution.

Each shipped draft was fitted to its target's T 0.7 distribution (docs/distillation.md); a draft closer to the
target must change how often drafts are accepted, never what is emitted. For each pair, many seeded requests
sample two tokens at T 0.7 with k = 3 (float64): the first comes from the prompt's forward, the second from the
first verification step (an accepted draft or a recovered token). The pairs are tested against the target's exact
joint law (chi-square over (first, second) pairs), and, as the negative control, against the joint law with the
second token at T 1.0: the kind of law a verifier that mishandles temperature produces, which must be rejected.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from anydraft import LLM
from anydraft.config import SamplingParams
from anydraft.model.loader import resolve_model_path
from reference_model import reference_first_token_probs   # tests/engine: the target alone, float64, no cache

PAIRS = [("qwen3-target", "smollm2-draft"), ("smollm2-target", "qwen3-draft"), ("qwen3-target", "mistral-draft")]
PROMPT = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May?\nAnswer:")
TEMPERATURE = 0.7
NUM_SAMPLES = 1024
P_VALUE_MIN = 1e-3


def joint_p_value(target: str, pairs: list[tuple[int, int]],
                  second_temperature: float, min_expected: float = 5.0) -> float:
    """Chi-square p-value of the observed (first, second) token pairs against the target's exact joint law: first
    token at TEMPERATURE, second at second_temperature given the first. Bins: every pair expected >= 5 times
    after a first token seen at least 20 times; the rest together."""
    n, counts = len(pairs), Counter(pairs)
    target_dir = resolve_model_path(target)
    first_law = reference_first_token_probs(target_dir, PROMPT, TEMPERATURE)
    observed, expected = [], []
    for first, seen in Counter(p[0] for p in pairs).items():
        if seen < 20:
            continue
        second_law = reference_first_token_probs(target_dir, PROMPT, second_temperature, after=(first,))
        joint = n * first_law[first] * second_law
        for second in torch.nonzero(joint >= min_expected).flatten().tolist():
            observed.append(counts[(first, second)])
            expected.append(float(joint[second]))
    observed.append(n - sum(observed))
    expected.append(n - sum(expected))
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("target,draft", PAIRS)
def test_sampled_tokens_with_a_distilled_draft_follow_the_target(target, draft):
    llm = LLM(target, {"model": draft, "num_speculative_tokens": 3, "adaptive": False}, dtype="float64",
              max_num_seqs=64, max_model_len=256)
    params = [SamplingParams(temperature=TEMPERATURE, max_tokens=2, seed=i, ignore_eos=True)
              for i in range(NUM_SAMPLES)]
    outputs = llm.generate([PROMPT] * NUM_SAMPLES, params)
    pairs = [tuple(o.outputs[0].token_ids) for o in outputs]
    assert all(len(p) == 2 for p in pairs)
    assert llm.stats.num_drafted > 0   # the second tokens went through verification of drafts
    assert joint_p_value(target, pairs, TEMPERATURE) > P_VALUE_MIN
    # negative control: the second tokens against the law at another temperature must be rejected
    assert joint_p_value(target, pairs, 1.0) < P_VALUE_MIN
