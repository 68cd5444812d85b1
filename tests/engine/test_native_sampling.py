"""Sampled decoding through the native sampling head (a bf16 target on AVX-512 + VNNI): the engine draws the first
token and the token of every step that drafts nothing (the target alone) with ModelRunner.sample_ids, never computing
the logits; those tokens follow the exact softmax of the target's bf16 logits (chi-square, negative control: a wrong
temperature is rejected); seeded requests reproduce whatever their batch. A top-k cut on every row draws from the
head's k largest logits, top-p alone from its largest logits where a bound on the rest's mass decides the cut, else
from all of them (truncated_draws: the cut softmax, a control rejects the uncut one).
With a TLI draft on native kernels too, draws are coupled (TargetStep.couple): the draft draws with the target's noise
per target id, a draft is accepted iff it equals the target's draw; the verified tokens still follow the exact law."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from anydraft.config import SamplingParams
from anydraft.llm import LLM
from anydraft.model.runner import ModelRunner
from anydraft.spec_decode.sampling import logits_to_probs
from anydraft.spec_decode.policy import StepPlan

from test_native_decoder import SCREENED
from tiny_models import TOKENIZERS, draft_on_tokenizer, make_checkpoint, write_tokenizer_variant

pytestmark = pytest.mark.skipif(SCREENED is not None, reason=f"hardware: {SCREENED}")

P_VALUE_MIN = 1e-3
NUM_SAMPLES = 3072
PROMPT = "The answer is"
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A bf16-eligible target (hidden 64) on GPT-2 cut to 1024 merges (1281 tokens, 1296 rows: padding rows)."""
    root = tmp_path_factory.mktemp("native_sampling")
    tokenizer = write_tokenizer_variant(TOKENIZERS / "gpt2", root / "tokenizer", num_merges=1024)
    return make_checkpoint(root / "target", "LlamaForCausalLM", tokenizer, 1296, hidden=64, layers=2, heads=4,
                           kv_heads=2, seed=51, head_scale=6.0)


@pytest.fixture(scope="module")
def tli_draft(target, tmp_path_factory):
    """The target on GPT-2 cut to 768 merges and shuffled (256 target tokens outside the intersection), noised."""
    root = tmp_path_factory.mktemp("native_sampling_tli")
    tokenizer = write_tokenizer_variant(TOKENIZERS / "gpt2", root / "tokenizer", shuffle_seed=43, num_merges=768)
    return draft_on_tokenizer(target, root / "draft", tokenizer, noise=0.2, seed=44)


@pytest.fixture(scope="module")
def llm(target):
    llm = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64)
    assert llm.target.samples_natively, llm.target.kernels
    return llm


def _exact_probs(target, token_ids: list[int], temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float64 of the target's own bf16 logits after token_ids (a fresh runner: the native
    kernels give every row the same values whatever the batch)."""
    runner = ModelRunner.load(target, torch.bfloat16, torch.device("cpu"), max_batch=1, max_len=64)
    logits = runner.logits(runner.prefill(0, token_ids))[0, 0].double()
    num_tokens = 1281
    return (logits[:num_tokens] / temperature).softmax(-1)


def _p_value(tokens: list[int], probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square p-value of tokens against probs, tokens expected fewer than min_expected times pooled; where
    nothing is left to pool (a cut distribution), a draw outside the support gives 0."""
    counts, n = Counter(tokens), len(tokens)
    expected = probs * n
    big = torch.nonzero(expected >= min_expected).flatten().tolist()
    observed = [counts[t] for t in big]
    wanted = [float(expected[t]) for t in big]
    rest_observed, rest_wanted = n - sum(observed), n - float(expected[big].sum())
    if rest_wanted > 1e-6:
        observed, wanted = observed + [rest_observed], wanted + [rest_wanted]
    elif rest_observed:
        return 0.0
    wanted = [w * n / sum(wanted) for w in wanted]   # the same total as observed (chisquare checks it)
    return float(chisquare(observed, wanted).pvalue)


def _generate(llm, temperature: float, seed0: int, max_tokens: int = 2, top_k: int = 0) -> list[tuple[int, ...]]:
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed0 + i, top_k=top_k)
              for i in range(NUM_SAMPLES)]
    return [tuple(o.outputs[0].token_ids) for o in llm.generate([PROMPT] * NUM_SAMPLES, params)]


def test_native_draws_follow_the_exact_softmax(llm, target, monkeypatch):
    calls = Counter()
    sample_ids = llm.target.sample_ids
    monkeypatch.setattr(llm.target, "sample_ids", lambda *a: calls.update(["sample"]) or sample_ids(*a))
    monkeypatch.setattr(llm.target, "logits", lambda *a: pytest.fail("the native path computed the logits"))
    outputs = _generate(llm, TEMPERATURE, seed0=0)
    assert calls["sample"] >= 2   # the prompt's token, then plain target steps
    prompt_ids = llm.tokenizer.encode(PROMPT)
    first = _exact_probs(target, prompt_ids, TEMPERATURE)
    assert first.max() < 0.9 and (first > 0.01).sum() >= 5   # spread: the test has power
    first_tokens = [o[0] for o in outputs]
    assert _p_value(first_tokens, first) > P_VALUE_MIN
    assert _p_value(first_tokens, _exact_probs(target, prompt_ids, 1.2 * TEMPERATURE)) < P_VALUE_MIN   # control
    # the second token (a plain target step) given the most common first one
    top, _ = Counter(first_tokens).most_common(1)[0]
    second = [o[1] for o in outputs if o[0] == top and len(o) > 1]
    assert len(second) > 500
    assert _p_value(second, _exact_probs(target, prompt_ids + [top], TEMPERATURE)) > P_VALUE_MIN


def test_seeded_requests_reproduce_whatever_their_batch(llm):
    alone = [llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=6, seed=s))[0].outputs[0].token_ids
             for s in (5, 6)]
    batch = llm.generate(["Some other prompt", PROMPT, PROMPT],
                         [SamplingParams(temperature=0.5, max_tokens=6, seed=99),
                          SamplingParams(temperature=1.0, max_tokens=6, seed=6),
                          SamplingParams(temperature=1.0, max_tokens=6, seed=5)])
    assert [batch[2].outputs[0].token_ids, batch[1].outputs[0].token_ids] == alone
    assert len({tuple(t) for t in alone}) == 2


def test_top_p_alone_draws_from_the_nucleus_natively(llm, target, monkeypatch):
    """A nucleus without a top-k cut is a share of the whole mass: a position draws from the head's largest logits
    where they and a bound on the rest's mass decide the cut, else from every logit (truncated_draws), without
    probabilities either way; the first token fits the nucleus's distribution (chi-square), and the same test
    rejects the uncut softmax (a control)."""
    import anydraft.spec_decode.target_step as target_step_module
    monkeypatch.setattr(target_step_module, "logits_to_probs", lambda *a, **k: pytest.fail("the PyTorch path ran"))
    top_p = 0.9
    first = [o.outputs[0].token_ids[0] for o in llm.generate(
        [PROMPT] * NUM_SAMPLES, [SamplingParams(temperature=TEMPERATURE, top_p=top_p, max_tokens=2, seed=80_000 + i)
                                 for i in range(NUM_SAMPLES)])]
    prompt_ids = llm.tokenizer.encode(PROMPT)
    cut = _truncated_probs(target, prompt_ids, TEMPERATURE, 0, top_p)
    assert int((cut > 0).sum()) >= 3 and cut.max() < 0.8   # a nucleus of several tokens
    assert _p_value(first, cut) > P_VALUE_MIN
    assert _p_value(first, _exact_probs(target, prompt_ids, TEMPERATURE)) < P_VALUE_MIN   # control: no cut


def test_a_nucleus_the_mass_bound_decides_draws_as_over_every_logit(llm, monkeypatch):
    """Where the largest logits and the mass bound decide a top-p cut, the draw from them is the draw over every logit:
    the same tokens when no position is decided (each then takes every logit). Some positions are decided (a peaked
    softmax at a low temperature), some not (a nucleus past the selection), and rows of both kinds, top-k rows and uncut
    rows share batches."""
    import anydraft.spec_decode.truncated_draws as truncated_draws
    settings = [(0.2, 0.9, 0), (0.3, 0.95, 0), (0.5, 0.8, 5), (2.0, 0.99, 0), (0.8, 1.0, 0)] * 13
    params = [SamplingParams(temperature=t, top_p=p, top_k=k, max_tokens=6, seed=90_000 + i, ignore_eos=True)
              for i, (t, p, k) in enumerate(settings)]
    decided = []
    bound = truncated_draws.cutoff_within_mass_bound

    def counted(*args):
        cutoff, mask = bound(*args)
        decided.append((int(mask.sum()), mask.numel()))
        return cutoff, mask
    monkeypatch.setattr(truncated_draws, "cutoff_within_mass_bound", counted)
    native = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(params), params)]
    positions = sum(n for _, n in decided)
    print(f"\n[nucleus] decided by the selection: {sum(d for d, _ in decided)} of {positions} positions")
    assert 0 < sum(d for d, _ in decided) < positions
    # The uncut rows sample as they do in a batch of their own (the full softmax, without the logits).
    uncut = [i for i, (_, p, k) in enumerate(settings) if p == 1.0 and k == 0]
    assert [native[i] for i in uncut] == [o.outputs[0].token_ids for o in llm.generate(
        [PROMPT] * len(uncut), [params[i] for i in uncut])]
    monkeypatch.setattr(truncated_draws, "cutoff_within_mass_bound",
                        lambda *args: (bound(*args)[0], torch.zeros_like(bound(*args)[1])))
    assert [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(params), params)] == native


def _truncated_probs(target, token_ids: list[int], temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits_to_probs' top-k / top-p distribution of the target's own bf16 logits after token_ids."""
    runner = ModelRunner.load(target, torch.bfloat16, torch.device("cpu"), max_batch=1, max_len=64)
    logits = runner.logits(runner.prefill(0, token_ids))[..., :1281].double()              # [1, 1, V]
    return logits_to_probs(logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]))[0, 0]


def test_top_k_draws_follow_the_truncated_softmax_without_the_logits(llm, target, monkeypatch):
    """Every row with a top-k cut: the draw comes from the head's k largest logits (truncated_draws), no logits, no
    probabilities; the first and second tokens fit logits_to_probs' top-k / top-p distribution (chi-square), and the
    same test rejects the uncut softmax (a control)."""
    monkeypatch.setattr(llm.target, "logits", lambda *a: pytest.fail("the native top-k path computed the logits"))
    top_k, top_p = 6, 0.9
    outputs = [tuple(o.outputs[0].token_ids) for o in llm.generate(
        [PROMPT] * NUM_SAMPLES, [SamplingParams(temperature=TEMPERATURE, top_k=top_k, top_p=top_p, max_tokens=2,
                                                seed=60_000 + i) for i in range(NUM_SAMPLES)])]
    prompt_ids = llm.tokenizer.encode(PROMPT)
    first = [o[0] for o in outputs]
    cut = _truncated_probs(target, prompt_ids, TEMPERATURE, top_k, top_p)
    assert 3 <= int((cut > 0).sum()) <= top_k and cut.max() < 0.8   # a cut that bites, a spread what it keeps
    assert _p_value(first, cut) > P_VALUE_MIN
    assert _p_value(first, _exact_probs(target, prompt_ids, TEMPERATURE)) < P_VALUE_MIN   # control: no cut
    top, _ = Counter(first).most_common(1)[0]
    second = [o[1] for o in outputs if o[0] == top and len(o) > 1]
    assert len(second) > 500
    assert _p_value(second, _truncated_probs(target, prompt_ids + [top], TEMPERATURE, top_k, top_p)) > P_VALUE_MIN


def test_a_cut_the_selection_cannot_decide_draws_the_same_over_all_logits(llm, monkeypatch):
    """With no room for ties past the k largest, the positions the selection cannot decide draw again from a wider
    one, and past it from every logit (same rule, same noise): the tokens are those of the native draws either way."""
    import anydraft.spec_decode.truncated_draws as truncated_draws
    params = [SamplingParams(temperature=1.5, top_k=k, top_p=p, max_tokens=6, seed=70_000 + i, ignore_eos=True)
              for i, (k, p) in enumerate([(3, 1.0), (5, 0.7), (40, 0.95), (1, 1.0)] * 16)]
    native = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(params), params)]
    monkeypatch.setattr(truncated_draws, "TIE_ROOM", 1)
    wider, fallbacks = [], []
    draw, over_all = truncated_draws.draw_truncated, truncated_draws._draw_over_all_logits
    monkeypatch.setattr(truncated_draws, "draw_truncated", lambda *a: wider.append(a[-1]) or draw(*a))   # retries
    monkeypatch.setattr(truncated_draws, "_draw_over_all_logits", lambda *a: fallbacks.append(1) or over_all(*a))
    assert [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(params), params)] == native
    assert wider and set(wider) == {truncated_draws.WIDE_SELECTED}   # bf16 logits tie at some cut
    monkeypatch.setattr(truncated_draws, "WIDE_SELECTED", 0)   # no wider selection: every logit at once
    assert [o.outputs[0].token_ids for o in llm.generate([PROMPT] * len(params), params)] == native
    assert fallbacks


def _sample_three(llm, seed0: int) -> tuple[list[tuple[int, ...]], float]:
    outputs = llm.generate([PROMPT] * NUM_SAMPLES, [SamplingParams(temperature=TEMPERATURE, max_tokens=3, seed=seed0 + i)
                                                    for i in range(NUM_SAMPLES)])
    forwards = sum(o.metrics["target_forwards"] for o in outputs)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    return [tuple(o.outputs[0].token_ids) for o in outputs], accepted / forwards


def _assert_exact_positions(llm, target, tokens: list[tuple[int, ...]]) -> None:
    """The first token (the prompt's forward), the second (the first that verification decides: the target's draw
    at position 0) and the third given the most common first two (reached through an accepted draft in most
    samples) fit the exact softmax of the target's bf16 logits; the second also rejects a wrong temperature."""
    prompt_ids = llm.tokenizer.encode(PROMPT)
    first_tokens = [t[0] for t in tokens]
    assert _p_value(first_tokens, _exact_probs(target, prompt_ids, TEMPERATURE)) > P_VALUE_MIN
    top, _ = Counter(first_tokens).most_common(1)[0]
    second = [t[1] for t in tokens if t[0] == top and len(t) > 1]
    assert len(second) > 500
    assert _p_value(second, _exact_probs(target, prompt_ids + [top], TEMPERATURE)) > P_VALUE_MIN
    assert _p_value(second, _exact_probs(target, prompt_ids + [top], 1.2 * TEMPERATURE)) < P_VALUE_MIN   # control
    pair, _ = Counter(t[:2] for t in tokens if len(t) > 2).most_common(1)[0]
    third = [t[2] for t in tokens if t[:2] == pair and len(t) > 2]
    assert len(third) > 300
    assert _p_value(third, _exact_probs(target, prompt_ids + list(pair), TEMPERATURE)) > P_VALUE_MIN


def test_coupled_tli_draws_follow_the_exact_softmax(target, tli_draft, monkeypatch):
    llm = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64,
              speculative_config={"model": str(tli_draft), "num_speculative_tokens": 3, "adaptive": False})
    assert llm.proposer.couples_draws and llm.proposer.vocab.kind == "tli"
    monkeypatch.setattr(llm.target, "logits", lambda *a: pytest.fail("coupled draws computed the target's logits"))
    tokens, accepted = _sample_three(llm, seed0=10_000)
    print(f"\n[coupled TLI] accepted per step {accepted:.2f}")
    assert 0.1 < accepted < 3   # drafts equal the target's draws often, not always
    _assert_exact_positions(llm, target, tokens)


def test_a_draft_that_ignores_the_coupling_breaks_nothing_but_acceptance(target, tli_draft, monkeypatch):
    """Accepting iff equal is lossless whatever the draft proposes, as long as it does not see the target's noise:
    drafts drawn with independent keys still give the exact law, with fewer acceptances."""
    llm = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64,
              speculative_config={"model": str(tli_draft), "num_speculative_tokens": 3, "adaptive": False})
    propose, generator = llm.proposer.propose, torch.Generator().manual_seed(3)

    def propose_with_other_noise(rows, sampling, k=None, target_states=None):
        if sampling is not None and sampling.keys is not None:
            sampling = replace(sampling, keys=torch.randint(-2 ** 63, 2 ** 63 - 1, sampling.keys.shape,
                                                            generator=generator))
        return propose(rows, sampling, k, target_states)
    monkeypatch.setattr(llm.proposer, "propose", propose_with_other_noise)
    tokens, accepted = _sample_three(llm, seed0=20_000)
    print(f"\n[independent draft noise] accepted per step {accepted:.2f}")
    _assert_exact_positions(llm, target, tokens)


@pytest.mark.parametrize("cut", [{"top_k": 4}, {"top_k": 8, "top_p": 0.6}, {"top_p": 0.5}],
                         ids=["top-k", "top-k and top-p", "top-p alone"])
def test_a_coupled_draft_proposes_within_the_request_s_cut(target, tli_draft, monkeypatch, cut):
    """Under a top-k / top-p cut the draft draws with the target's noise among the tokens its own logits keep by the
    same cut (truncated_draws.propose_coupled): it proposes the target's draw more often than drawing from its full
    softmax (the control: the draft's draws as before), and each seeded request's tokens stay the target alone's."""
    import anydraft.spec_decode.draft_proposer as draft_proposer
    llm = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64,
              speculative_config={"model": str(tli_draft), "num_speculative_tokens": 3, "adaptive": False})
    alone = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64)
    expected = _seeded_ids(alone, seed0=95_000, temperature=1.0, **cut)
    assert _seeded_ids(llm, seed0=95_000, temperature=1.0, **cut) == expected
    within_cut = llm.stats.num_accepted / llm.stats.num_drafted
    llm.engine.stats = type(llm.stats)(llm.engine.k)
    # Control: the draft's exact draws from its full softmax, same noise.
    monkeypatch.setattr(draft_proposer, "propose_coupled",
                        lambda runner, hidden, temperature, keys, top_k, top_p, top_k_max, noise_ids:
                        runner.sample_ids(hidden, temperature, keys, noise_ids))
    assert _seeded_ids(llm, seed0=95_000, temperature=1.0, **cut) == expected
    full_softmax = llm.stats.num_accepted / llm.stats.num_drafted
    print(f"\n[draft within the cut] acceptance {within_cut:.3f} against {full_softmax:.3f} from the full softmax")
    assert within_cut > full_softmax


def _seeded_ids(llm, seed0: int, num: int = 64, max_tokens: int = 12, temperature: float = TEMPERATURE,
                **cut) -> list[list[int]]:
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed0 + i, ignore_eos=True, **cut)
              for i in range(num)]
    return [o.outputs[0].token_ids for o in llm.generate([PROMPT] * num, params)]


@pytest.mark.parametrize("cut", [{}, {"top_k": 8, "top_p": 0.9}, {"top_p": 0.8}],
                         ids=["full softmax", "top-k and top-p", "top-p alone"])
def test_seeded_requests_sample_the_target_alone_s_tokens_with_any_k(llm, target, tli_draft, monkeypatch, cut):
    """A token's noise is keyed by its request and output position (sampling.draw_keys), and with coupled draws every
    emitted token is the target's own draw after the true prefix (from the full softmax, or from a top-k / top-p
    cut through truncated_draws): a seeded request's tokens equal the target alone's, with fixed k and with
    adaptive choices that follow the load (here random ks). Controls: another seed gives
    other tokens; keys counted per step instead of per position break the equality."""
    alone = _seeded_ids(llm, seed0=40_000, **cut)
    other_seed = _seeded_ids(llm, seed0=50_000, **cut)
    assert sum(a != b for a, b in zip(alone, other_seed)) > 32   # the seed decides the text
    spec = {"model": str(tli_draft), "num_speculative_tokens": 3}
    fixed = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=64, max_model_len=64,
                speculative_config={**spec, "adaptive": False})
    adaptive = LLM(model=str(target), dtype="bfloat16", device="cpu", max_num_seqs=16, max_model_len=64,
                   speculative_config=spec)
    chooser = random.Random(7)
    monkeypatch.setattr(adaptive.engine.policy, "plan", lambda batch: StepPlan(chooser.randint(0, 3)))
    assert _seeded_ids(fixed, seed0=40_000, **cut) == alone
    assert _seeded_ids(adaptive, seed0=40_000, **cut) == alone
    assert fixed.stats.num_accepted > 0 and adaptive.stats.num_accepted > 0   # drafts decided tokens
    # Control: a step's keys from its first position 0 (noise that depends on how tokens fall into steps).
    import anydraft.spec_decode.target_step as target_step_module
    draw_keys = target_step_module.draw_keys
    monkeypatch.setattr(target_step_module, "draw_keys", lambda randoms, positions, num, device:
                        draw_keys(randoms, [0] * len(positions), num, device))
    differ = sum(a != b for a, b in zip(_seeded_ids(llm, seed0=40_000, **cut),
                                        _seeded_ids(fixed, seed0=40_000, **cut)))
    print(f"\n[keys per step] {differ} of 64 requests differ from the target alone")
    assert differ > 16
