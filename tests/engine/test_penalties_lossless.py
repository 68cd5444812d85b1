"""Penalties and logit bias stay lossless under speculation: greedy output equals the slow obvious decoder with the
same penalties (float64, every vocabulary mode), and sampled output follows the target alone's penalized law
(chi-square tests, with a negative control that counts only the tokens before the step and is told apart)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.spec_decode import target_step

from test_sampling_distribution import P_VALUE_MIN, goodness_of_fit, later_position_p_values, two_sample
from reference_model import _reference_logits
from tiny_models import tokenizer_of

# Negative presence and frequency penalties reward repeats: the sampled tests' target then repeats a token in ~10%
# of its 5-token outputs (under 1% without), most of them inside one step, where the per-position counts matter.
PENALTIES = dict(presence_penalty=-2.0, frequency_penalty=-2.0, repetition_penalty=0.9)
GREEDY_CASES = [("identity_partial", "smollm2_target", "smollm2_noisy_draft", 3),
                ("d2t_partial", "smollm2_target", "smollm2_d2t_draft", 3),
                ("tli_shuffled_partial", "gpt2_target", "gpt2_shuffled_noisy_draft", 4)]
NUM_SAMPLES = 3072
MAX_TOKENS = 5   # the prompt's token + one whole step of k + 1 = 4 positions
K = 3
PROMPT = "The answer is"


def penalized_logits(logits: torch.Tensor, output: list[int], prompt: list[int], params: SamplingParams
                     ) -> torch.Tensor:
    """One position's penalized logits [V], written out per seen token (vLLM's definitions)."""
    out = logits.clone()
    for target_id, bias in (params.logit_bias or {}).items():
        out[target_id] += bias
    for t in set(output) | set(prompt):
        count = output.count(t)
        out[t] = out[t] / params.repetition_penalty if out[t] > 0 else out[t] * params.repetition_penalty
        out[t] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


def repeats(samples: list[tuple]) -> list[bool]:
    """Whether each sample writes some token twice (the outcome penalties change most)."""
    tokens = [[t for t in s if t is not None] for s in samples]
    return [len(set(t)) < len(t) for t in tokens]


def reference_penalized_greedy(model_dir: Path, prompt: str, params: SamplingParams) -> list[int]:
    """Target-alone greedy with penalties the slow obvious way (no cache, float64), stopping at EOS."""
    tokenizer = tokenizer_of(model_dir)
    prompt_ids, out = tokenizer.encode(prompt), []
    for _ in range(params.max_tokens):
        logits = _reference_logits(model_dir, prompt_ids + out)
        out.append(int(penalized_logits(logits, out, prompt_ids, params).argmax()))
        if out[-1] in tokenizer.eos_token_ids:
            break
    return out


@pytest.mark.parametrize("case, target, draft, k", GREEDY_CASES, ids=[c[0] for c in GREEDY_CASES])
def test_greedy_with_penalties_matches_the_target_alone(ckpts, llms, prompts, case, target, draft, k):
    """A batch mixing penalized, biased and plain rows; the drafts agree partly, so steps accept some and reject."""
    target_dir = getattr(ckpts, target)
    llm = llms.get(target_dir, getattr(ckpts, draft), k=k)
    eos = tokenizer_of(target_dir).eos_token_ids[0]
    # Row 1: three tokens biased up; frequency and presence penalties make them take turns where the bias dominates.
    cycle = [13, 20, 33]
    settings = [dict(PENALTIES), dict(logit_bias={t: 50.0 for t in cycle}, frequency_penalty=2.0, presence_penalty=0.5),
                dict(logit_bias={eos: -100.0}), dict(frequency_penalty=-0.5)]
    params = [SamplingParams(temperature=0, max_tokens=24, **s) for s in settings]
    outputs = llm.generate(prompts[:4], params)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    forwards = sum(o.metrics["target_forwards"] for o in outputs)
    assert 0 < accepted < k * forwards   # the step accepted some drafts and rejected others
    for prompt, p, out in zip(prompts, params, outputs):
        assert out.outputs[0].token_ids == reference_penalized_greedy(target_dir, prompt, p), p
    plain = llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=24))
    changed = [i for i, (a, b) in enumerate(zip(outputs, plain)) if a.outputs[0].token_ids != b.outputs[0].token_ids]
    assert changed   # the penalties bite (on these random models logits span 25 to 225: which rows differs)


@pytest.fixture(scope="module")
def penalized_samples(ckpts, llms):
    """The first MAX_TOKENS target ids of NUM_SAMPLES penalized requests per setting, each seeded differently."""
    cache = {}

    def get(kind: str, stale_counts: bool = False, penalties: dict | None = None):
        key = (kind, stale_counts, str(penalties))
        if key not in cache:
            draft = {"target_alone": None, "target_alone_2": None, "identity": ckpts.small_noisy_draft,
                     "tli": ckpts.small_tli_draft}[kind]
            llm = llms.get(ckpts.small_target, draft, k=K, max_num_seqs=64, dtype="float32")
            seed = {"target_alone": 0, "target_alone_2": 10 ** 6, "identity": 2 * 10 ** 6, "tli": 3 * 10 ** 6}[kind]
            params = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=seed + i,
                                     **(PENALTIES if penalties is None else penalties)) for i in range(NUM_SAMPLES)]
            real = target_step.penalize
            if stale_counts:   # the control: every position sees only the counts from before the step
                target_step.penalize = lambda logits, batch, drafts=None: real(logits, batch)
            try:
                outputs = llm.generate([PROMPT] * NUM_SAMPLES, params)
            finally:
                target_step.penalize = real
            if draft is not None:
                accepted = sum(o.metrics["num_accepted"] for o in outputs)
                assert 0 < accepted < K * sum(o.metrics["target_forwards"] for o in outputs)
            cache[key] = [tuple(o.outputs[0].token_ids) + (None,) * (MAX_TOKENS - len(o.outputs[0].token_ids))
                          for o in outputs]
        return cache[key]

    return get


@pytest.mark.parametrize("kind", ["identity", "tli"])
def test_sampled_penalized_output_follows_the_target_alone(ckpts, penalized_samples, kind):
    samples, alone = penalized_samples(kind), penalized_samples("target_alone")
    p_values = ([two_sample(repeats(samples), repeats(alone)), two_sample([s[:2] for s in samples], [s[:2] for s in alone])]
                + later_position_p_values(samples, alone))
    print(f"\n[{kind}] penalized, {sum(repeats(samples))} vs {sum(repeats(alone))} repeats; repeats, joint first two "
          f"and positions 3..{MAX_TOKENS} vs target alone: "
          f"{', '.join(f'{p:.3g}' for p in p_values)}")
    assert min(p_values) > P_VALUE_MIN
    # The first verified token against the exact penalized softmax after the commonest first token.
    prompt_ids = tokenizer_of(ckpts.small_target).encode(PROMPT)
    first = max(set(s[0] for s in samples), key=[s[0] for s in samples].count)
    seconds = [s[1] for s in samples if s[0] == first and s[1] is not None]
    params = SamplingParams(**PENALTIES)
    probs = penalized_logits(_reference_logits(ckpts.small_target, prompt_ids + [first]), [first], prompt_ids,
                             params).softmax(-1)
    assert goodness_of_fit(seconds, probs) > P_VALUE_MIN


def test_the_statistic_tells_stale_counts_and_no_penalties_apart(penalized_samples):
    """Negative controls at the same sample size: counting only the tokens before the step (the bug the per-position
    counts prevent) and sampling without penalties both fail; two runs of the target alone pass."""
    alone = penalized_samples("target_alone")
    for control, passes in ((penalized_samples("identity", stale_counts=True), False),
                            (penalized_samples("target_alone_2", penalties={}), False),
                            (penalized_samples("target_alone_2"), True)):
        p_value = two_sample(repeats(control), repeats(alone))
        print(f"\n[control] {sum(repeats(control))} vs {sum(repeats(alone))} repeats: p = {p_value:.3g}")
        assert (p_value > P_VALUE_MIN) == passes
