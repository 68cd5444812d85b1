"""Sampling with speculation draws from the target's distribution: chi-square tests on thousands of samples.

The target is peaked (scaled head), so a handful of tokens carry most of the mass; rarer tokens are binned
together. Its vocabulary is GPT-2 cut to 1024 merges (1281 tokens, 1296 rows) so that drawing noise over the
vocabulary stays cheap. Drafts: a noisy copy (identity) and a copy on another tokenizer (GPT-2 cut to 768
merges, ids shuffled: TLI with 256 target tokens outside the intersection), that TLI draft with its head
cut to 200 frequency-ranked rows (tli_fr), and a reduced head (d2t: 640 of 1296 rows, the tokens most
frequent in GSM8K questions). All disagree with the target
often (total variation ~0.5), so recovered tokens come from the residual max(p - q, 0) in many steps.
"""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from anydraft.config import SamplingParams
from anydraft.spec_decode.policy import StepPlan

from reference_model import reference_first_token_probs
from tiny_models import tokenizer_of

P_VALUE_MIN = 1e-3
NUM_SAMPLES = 3072
K = 3
PROMPT = "The answer is"
SEED_BASE = {"target_alone": 0, "identity": 1_000_000, "tli": 2_000_000, "d2t": 3_000_000, "tli_fr": 4_000_000,
             "target_alone_2": 5_000_000, "noisy_draft_alone": 6_000_000, "tli_ragged": 7_000_000}
# tli_ragged: the TLI draft with a random k in 0..K per step and every third request capped at 1 draft token
# (adaptive speculation's and per-request caps' paths through verification).
# Controls: target_alone_2 is an independent second run of the target alone; noisy_draft_alone decodes with
# the noisy draft as the model (a wrong law at every position, total variation ~0.5 from the target's).
MIN_CONDITIONAL_SAMPLES = 1000   # second tokens after the most common first one (the verified-token tests)
MAX_TOKENS = 5   # the prompt's token + one whole verification step (k+1 = 4 positions: accepted drafts, bonus)
FR_HEAD_ROWS = 200   # tli_fr: the TLI draft's head cut to the 200 rows GSM8K train uses most


def goodness_of_fit(target_ids: list[int], probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of the observed first tokens against exact probabilities; tokens expected < 5 times are binned."""
    n = len(target_ids)
    counts = Counter(target_ids)
    expected = probs.double() * n
    big = torch.nonzero(expected >= min_expected).flatten().tolist()
    observed = [counts[t] for t in big]
    expected_big = [float(expected[t]) for t in big]
    rest_observed, rest_expected = n - sum(observed), n - sum(expected_big)
    if rest_expected > 0:
        observed.append(rest_observed)
        expected_big.append(rest_expected)
    return float(chisquare(observed, expected_big).pvalue)


def two_sample(a: list, b: list, min_count: int = 10) -> float:
    """p-value that two samples come from one distribution (contingency table; rare outcomes binned)."""
    count_a, count_b = Counter(a), Counter(b)
    keys = [key for key in count_a.keys() | count_b.keys() if count_a[key] + count_b[key] >= min_count]
    row_a = [count_a[key] for key in keys]
    row_b = [count_b[key] for key in keys]
    rest_a, rest_b = len(a) - sum(row_a), len(b) - sum(row_b)
    if rest_a + rest_b > 0:
        row_a.append(rest_a)
        row_b.append(rest_b)
    return float(chi2_contingency([row_a, row_b]).pvalue)


@pytest.fixture(scope="module")
def samples(ckpts, llms, draft_vocab_corpus):
    """The first MAX_TOKENS target ids (None-padded after EOS) of NUM_SAMPLES requests per setting, each request
    seeded differently."""
    cache = {}

    def get(kind: str, temperature: float = 1.0, top_k: int = 0):
        key = (kind, temperature, top_k)
        if key not in cache:
            draft = {"target_alone": None, "target_alone_2": None, "noisy_draft_alone": None, "identity": ckpts.small_noisy_draft, "tli": ckpts.small_tli_draft,
                     "d2t": ckpts.small_d2t_draft, "tli_fr": ckpts.small_tli_draft,
                     "tli_ragged": ckpts.small_tli_draft}[kind]
            head = ({"draft_vocab_size": FR_HEAD_ROWS, "draft_vocab_corpus": str(draft_vocab_corpus)}
                    if kind == "tli_fr" else {})
            model = ckpts.small_noisy_draft if kind == "noisy_draft_alone" else ckpts.small_target
            if kind == "tli_ragged":
                head = {"adaptive": True}
            llm = llms.get(model, draft, k=K, max_num_seqs=64, dtype="float32", **head)
            if kind == "tli_ragged":
                chooser = random.Random(0)
                llm.engine.policy.plan = lambda batch: StepPlan(chooser.randint(0, K))
            if kind == "tli_fr":
                assert llm.proposer.runner.head_rows == FR_HEAD_ROWS
            seed = SEED_BASE[kind] + int(temperature * 1000) + top_k
            caps = [1 if kind == "tli_ragged" and i % 3 == 0 else None for i in range(NUM_SAMPLES)]
            params = [SamplingParams(temperature=temperature, top_k=top_k, max_tokens=MAX_TOKENS, seed=seed + i,
                                     num_speculative_tokens=cap) for i, cap in enumerate(caps)]
            outputs = llm.generate([PROMPT] * NUM_SAMPLES, params)
            assert all(len(o.outputs[0].token_ids) == MAX_TOKENS or o.outputs[0].finish_reason == "stop"
                       for o in outputs)
            forwards = sum(o.metrics["target_forwards"] for o in outputs)
            accepted = sum(o.metrics["num_accepted"] for o in outputs)
            print(f"\n[{kind} T={temperature} top_k={top_k}] mean accepted per step {accepted / forwards:.2f} "
                  f"(k={K if draft else 0})")
            if draft is not None:
                # Drafts agree partly: the accept test and the residual draw both run.
                assert 0 < accepted / forwards < K
            cache[key] = [tuple(o.outputs[0].token_ids) + (None,) * (MAX_TOKENS - len(o.outputs[0].token_ids))
                          for o in outputs]
        return cache[key]

    return get


def verified_tokens(pairs: list[tuple]) -> tuple[int, list[int]]:
    """(t, second tokens of the samples whose first token is t) for the most common first token t.

    The first token comes from the prompt's forward; the second is the first one verification decides
    (an accepted draft, or a recovered or bonus token), so its conditional law is where a verifier bug shows."""
    first = Counter(pair[0] for pair in pairs).most_common(1)[0][0]
    return first, [pair[1] for pair in pairs if pair[0] == first and pair[1] is not None]


@pytest.mark.parametrize("kind", ["target_alone", "identity", "tli", "d2t", "tli_fr"])
def test_first_token_follows_exact_target_softmax(ckpts, samples, kind):
    first_target_ids = [pair[0] for pair in samples(kind)]
    probs = reference_first_token_probs(ckpts.small_target, PROMPT)
    assert all(probs[t] > 0 for t in first_target_ids), "a token of probability 0 (padding row?) was sampled"
    assert max(first_target_ids) < tokenizer_of(ckpts.small_target).vocab_size
    p_value = goodness_of_fit(first_target_ids, probs)
    print(f"\n[{kind}] first token vs exact softmax: p = {p_value:.3g}")
    assert p_value > P_VALUE_MIN


@pytest.mark.parametrize("kind", ["target_alone", "identity", "tli", "d2t", "tli_fr", "tli_ragged"])
def test_verified_token_follows_exact_target_softmax(ckpts, samples, kind):
    first, second_target_ids = verified_tokens(samples(kind))
    assert len(second_target_ids) >= MIN_CONDITIONAL_SAMPLES
    probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    assert all(probs[t] > 0 for t in second_target_ids), "a token of probability 0 (padding row?) was sampled"
    p_value = goodness_of_fit(second_target_ids, probs)
    print(f"\n[{kind}] verified token after {first} ({len(second_target_ids)} samples) vs exact softmax: "
          f"p = {p_value:.3g}")
    assert p_value > P_VALUE_MIN


@pytest.mark.parametrize("kind", ["identity", "tli", "tli_fr"])
def test_first_two_tokens_match_target_alone(samples, kind):
    """Joint (first, second) distribution: the second token is an accepted draft or a recovered/bonus one."""
    p_value = two_sample([pair[:2] for pair in samples(kind)], [pair[:2] for pair in samples("target_alone")])
    print(f"\n[{kind}] first two tokens vs target alone: p = {p_value:.3g}")
    assert p_value > P_VALUE_MIN


def later_position_p_values(sequences: list[tuple], reference: list[tuple]) -> list[float]:
    """Two-sample p-values of the token at each position 2..MAX_TOKENS-1 (the later positions of a verification
    step: drafts accepted in a row, the recovered token after a rejection, the bonus token)."""
    return [two_sample([s[j] for s in sequences], [s[j] for s in reference]) for j in range(2, MAX_TOKENS)]


@pytest.mark.parametrize("kind", ["identity", "tli", "d2t", "tli_fr", "tli_ragged"])
def test_later_positions_match_target_alone(samples, kind):
    p_values = later_position_p_values(samples(kind), samples("target_alone"))
    print(f"\n[{kind}] positions 3..{MAX_TOKENS} vs target alone: p = {', '.join(f'{p:.3g}' for p in p_values)}")
    assert min(p_values) > P_VALUE_MIN


def test_later_position_statistic_detects_a_wrong_law(samples):
    """Negative controls at the same sample size. A wrong law at every position (the noisy draft decoding
    alone) is told apart at every later position; a subtle one (the target at temperature 1.2 instead of 1)
    fails the test as a whole; two independent runs of the target alone pass it."""
    reference = samples("target_alone")
    wrong = later_position_p_values(samples("noisy_draft_alone"), reference)
    print(f"\n[control] noisy draft alone, positions 3..{MAX_TOKENS}: p = {', '.join(f'{p:.3g}' for p in wrong)}")
    assert max(wrong) < P_VALUE_MIN
    warm = later_position_p_values(samples("target_alone", temperature=1.2), reference)
    print(f"\n[control] T=1.2, positions 3..{MAX_TOKENS}: p = {', '.join(f'{p:.3g}' for p in warm)}")
    assert min(warm) < P_VALUE_MIN
    same = later_position_p_values(samples("target_alone_2"), reference)
    assert min(same) > P_VALUE_MIN


def test_truncated_sampling_follows_truncated_target(ckpts, samples):
    """temperature 0.7 and top_k 5 on both sides (TLI): p is the target's truncated, renormalized softmax,
    for the first token (prompt forward) and the verified one after it."""
    pairs = samples("tli", temperature=0.7, top_k=5)
    first, second_target_ids = verified_tokens(pairs)
    assert len(second_target_ids) >= MIN_CONDITIONAL_SAMPLES
    for name, target_ids, after in (("first", [pair[0] for pair in pairs], ()),
                                    ("verified", second_target_ids, (first,))):
        probs = reference_first_token_probs(ckpts.small_target, PROMPT, temperature=0.7, after=after)
        top = probs.topk(5).indices
        truncated = torch.zeros_like(probs)
        truncated[top] = probs[top] / probs[top].sum()
        assert set(target_ids) <= set(top.tolist())
        p_value = goodness_of_fit(target_ids, truncated)
        print(f"\n[tli T=0.7 top_k=5] {name} token vs truncated softmax: p = {p_value:.3g}")
        assert p_value > P_VALUE_MIN


def test_statistic_detects_a_wrong_distribution(ckpts, samples):
    """Negative controls at the same sample size: the tests above could fail."""
    generator = torch.Generator().manual_seed(7)
    target_probs = reference_first_token_probs(ckpts.small_target, PROMPT)
    # What verification accepting every draft token would emit: the draft's own distribution.
    draft_probs = reference_first_token_probs(ckpts.small_noisy_draft, PROMPT)
    draft_first_ids = torch.multinomial(draft_probs, NUM_SAMPLES, replacement=True, generator=generator).tolist()
    assert goodness_of_fit(draft_first_ids, target_probs) < P_VALUE_MIN
    assert two_sample(draft_first_ids, [pair[0] for pair in samples("target_alone")]) < P_VALUE_MIN
    # A subtler bug: the target's distribution at temperature 1.2 instead of 1.
    warm_probs = reference_first_token_probs(ckpts.small_target, PROMPT, temperature=1.2)
    warm_first_ids = torch.multinomial(warm_probs, NUM_SAMPLES, replacement=True, generator=generator).tolist()
    p_value = goodness_of_fit(warm_first_ids, target_probs)
    print(f"\n[control] temperature 1.2 samples vs target softmax: p = {p_value:.3g}")
    assert p_value < P_VALUE_MIN
    # ...while exact target samples pass the same test.
    exact_first_ids = torch.multinomial(target_probs, NUM_SAMPLES, replacement=True, generator=generator).tolist()
    assert goodness_of_fit(exact_first_ids, target_probs) > P_VALUE_MIN
    # The same controls at the verified-token tests' sample size (second tokens after the commonest first).
    first, second_target_ids = verified_tokens(samples("target_alone"))
    n = len(second_target_ids)
    target_probs = reference_first_token_probs(ckpts.small_target, PROMPT, after=(first,))
    for wrong_probs in (reference_first_token_probs(ckpts.small_noisy_draft, PROMPT, after=(first,)),
                        reference_first_token_probs(ckpts.small_target, PROMPT, temperature=1.2, after=(first,))):
        wrong_ids = torch.multinomial(wrong_probs, n, replacement=True, generator=generator).tolist()
        p_value = goodness_of_fit(wrong_ids, target_probs)
        print(f"\n[control, {n} samples] wrong second-token law vs target softmax: p = {p_value:.3g}")
        assert p_value < P_VALUE_MIN
