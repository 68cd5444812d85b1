"""The shipped distilled drafts under sampling: what speculation emits follows the target's distribution.

Each shipped draft was fitted to its target's T 0.7 distribution (docs/distillation.md); a draft closer to the
target must change how often drafts are accepted, never what is emitted. For each pair, many seeded requests
sample two tokens at T 0.7 with k = 3 (float64): the first comes from the prompt's forward, the second from the
first verification step (an accepted draft or a recovered token). Both are tested against the target's exact
softmax (chi-square), and, as the negative control, the second against the same context's softmax at T 1.0: the
kind of law a verifier that mishandles temperature produces, which the test must reject.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from anydraft import LLM
from anydraft.config import SamplingParams
from anydraft.model.loader import load_model, resolve_model_path

PAIRS = [("qwen3-target", "smollm2-draft"), ("smollm2-target", "qwen3-draft"), ("qwen3-target", "mistral-draft")]
PROMPT = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May?\nAnswer:")
TEMPERATURE = 0.7
NUM_SAMPLES = 1024
P_VALUE_MIN = 1e-3


def goodness_of_fit(target_ids: list[int], probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of observed tokens against exact probabilities; tokens expected < 5 times are binned together."""
    n, counts = len(target_ids), Counter(target_ids)
    expected = probs.double() * n
    kept = torch.nonzero(expected >= min_expected).flatten().tolist()
    observed, expected_kept = [counts[t] for t in kept], [float(expected[t]) for t in kept]
    if n - sum(expected_kept) > 0:
        observed.append(n - sum(observed))
        expected_kept.append(n - sum(expected_kept))
    return float(chisquare(observed, expected_kept).pvalue)


@torch.inference_mode()
def target_probs(target: str, target_ids: list[int], temperature: float) -> torch.Tensor:   # [V_rows] float64
    """The target alone's next-token law after target_ids: the whole sequence through the model, no cache."""
    model = load_model(str(resolve_model_path(target)), torch.float64, torch.device("cpu"))[0]
    logits = model.logits(model(torch.tensor([target_ids]))[:, -1])[0]
    return (logits / temperature).softmax(-1)


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
    prompt_ids = list(outputs[0].prompt_token_ids)

    first = [p[0] for p in pairs]
    assert goodness_of_fit(first, target_probs(target, prompt_ids, TEMPERATURE)) > P_VALUE_MIN

    common_first = Counter(first).most_common(1)[0][0]
    second = [p[1] for p in pairs if p[0] == common_first]
    assert len(second) >= 300, f"only {len(second)} samples after the most common first token"
    context = prompt_ids + [common_first]
    assert goodness_of_fit(second, target_probs(target, context, TEMPERATURE)) > P_VALUE_MIN
    # negative control: the same samples against the law at another temperature must be rejected
    assert goodness_of_fit(second, target_probs(target, context, 1.0)) < P_VALUE_MIN
