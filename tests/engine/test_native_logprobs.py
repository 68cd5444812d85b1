"""Logprobs on the shipped pair in bf16 (qwen3-target, smollm2-draft: native kernels, TLI): asking for logprobs
makes the target compute its logits, whose argmax must be the greedy head's ids exactly (else greedy output would
change); with speculation the logprobs equal the target alone's within 1e-4, output and prompt alike."""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.model.loader import resolve_model_path
from anydraft.tensors import greedy_argmax

from test_native_decoder import HARDWARE
from tiny_models import gsm8k_questions

pytestmark = pytest.mark.skipif(HARDWARE is not None, reason=f"hardware: {HARDWARE}")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair(llms):
    target, draft = resolve_model_path("qwen3-target"), resolve_model_path("smollm2-draft")
    spec = llms.get(target, draft, k=3, dtype="bfloat16", max_model_len=512)
    alone = llms.get(target, None, dtype="bfloat16", max_model_len=512)
    # screened ("native") or full logits on the native linear kernel ("native logits: ..."): batch-invariant both
    assert all(llm.kernels["target"]["head"].startswith("native") for llm in (spec, alone)), spec.kernels
    return spec, alone


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [f"Question: {q}\nAnswer:" for q in gsm8k_questions(4, start=60)]


def test_the_argmax_of_the_logits_is_the_greedy_heads_ids(pair):
    """Hidden states of real text and of degenerate activations (one huge outlier), in [B, S] and one-row shapes."""
    runner = pair[1].target
    generator = torch.Generator().manual_seed(3)
    width = runner.cfg.hidden_size
    real = runner.model.model.embed_tokens.weight[torch.randint(0, 150000, (64,), generator=generator)]
    hidden = torch.cat([real * 8, torch.randn(32, width, generator=generator)]).to(torch.bfloat16)
    hidden[70, 5] = 300.0
    for shaped in (hidden.view(12, 8, width), hidden.view(-1, 1, width)):
        assert torch.equal(greedy_argmax(runner.logits(shaped)), runner.greedy_ids(shaped))


def test_bf16_logprobs_with_speculation_equal_the_target_alones(pair, questions):
    spec, alone = pair
    plain = SamplingParams(temperature=0, max_tokens=48)
    asked = SamplingParams(temperature=0, max_tokens=48, logprobs=5, prompt_logprobs=2)
    spec_out, alone_out = spec.generate(questions, asked), alone.generate(questions, asked)
    plain_ids = [o.outputs[0].token_ids for o in spec.generate(questions, plain)]
    assert [o.outputs[0].token_ids for o in spec_out] == plain_ids == [o.outputs[0].token_ids for o in alone_out]
    assert spec.stats.acceptance_length > 1.5   # drafts were verified, not only plain steps
    worst = 0.0
    for s, a in zip(spec_out, alone_out):
        for mine, theirs in zip(s.outputs[0].logprobs + s.prompt_logprobs[1:],
                                a.outputs[0].logprobs + a.prompt_logprobs[1:]):
            assert list(mine) == list(theirs)   # the same chosen token and alternatives, in order
            worst = max([worst] + [abs(mine[i].logprob - theirs[i].logprob) for i in mine])
        assert len(s.outputs[0].logprobs) == len(s.outputs[0].token_ids)
    assert worst <= TOLERANCE, worst


def test_bf16_sampled_logprobs_are_raw(pair, questions):
    """A seeded sampled request: its tokens' logprobs equal those a greedy scoring of the same text gives."""
    spec, alone = pair
    out = spec.generate(questions[0], SamplingParams(temperature=0.8, top_k=40, seed=5, max_tokens=24, logprobs=0))[0]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    scored = alone.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1,
                                                                      prompt_logprobs=0))[0]
    drawn = [d[t].logprob for d, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids)]
    wanted = [d[t].logprob for d, t in zip(scored.prompt_logprobs[len(out.prompt_token_ids):],
                                           out.outputs[0].token_ids)]
    assert len(drawn) == len(wanted) == 24
    assert max(abs(a - b) for a, b in zip(drawn, wanted)) <= TOLERANCE
