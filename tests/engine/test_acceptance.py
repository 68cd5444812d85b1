"""Acceptance where it is known exactly: a draft identical to the target (all accepted), the target with a
shuffled vocabulary (all accepted through the bridge, ~none without it)."""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.engine import Engine
from anydraft.model.runner import ModelRunner
from anydraft.spec_decode.draft_proposer import DraftModelProposer
from anydraft.spec_decode.draft_vocab import DraftVocab, SharedVocabSync

from reference_model import reference_greedy
from tiny_models import tokenizer_of

K = 3
MAX_TOKENS = 24  # a multiple of k+1: every step is a full one unless EOS ends the request


def test_shuffled_vocabulary_draft_is_fully_accepted_through_the_bridge(ckpts, llms, prompts):
    """The target itself behind a shuffled tokenizer: TLI maps every proposal to the target's own choice."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, k=K)
    assert llm.draft_info["vocab_mode"] == "tli"
    assert llm.draft_info["intersection"] == tokenizer_of(ckpts.gpt2_target).vocab_size - 1  # all but <|endoftext|>
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == reference_greedy(ckpts.gpt2_target, prompt, MAX_TOKENS)
        assert out.metrics["acceptance_by_position"] == [1.0] * K, out.metrics
        assert out.metrics["acceptance_length"] == K + 1
        if out.outputs[0].finish_reason == "length":
            assert out.metrics["target_forwards"] == MAX_TOKENS // (K + 1)


def test_shuffled_vocabulary_draft_without_the_bridge_is_rejected(ckpts, prompts):
    """Same draft, ids taken as target ids (an identity DraftVocab): proposals are other tokens, so the
    target rejects them; the output is still the target's (lossless whatever the draft says)."""
    target_tokenizer = tokenizer_of(ckpts.gpt2_target)
    target = ModelRunner.load(ckpts.gpt2_target, torch.float64, torch.device("cpu"), 4, 256,
                              num_token_rows=target_tokenizer.vocab_size)
    draft = ModelRunner.load(ckpts.gpt2_shuffled_draft, torch.float64, torch.device("cpu"), 4, 576)
    no_bridge = DraftVocab("identity", None, None, target.vocab_rows, SharedVocabSync())
    engine = Engine(target, target_tokenizer, DraftModelProposer(draft, no_bridge, K), max_model_len=256)
    requests = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=16)) for p in prompts[:4]]
    engine.run()
    for prompt, request in zip(prompts, requests):
        assert request.output_target_ids == reference_greedy(ckpts.gpt2_target, prompt, 16)
    print(f"\n[shuffled, no bridge] acceptance rate {engine.stats.acceptance_rate:.3f} "
          f"over {engine.stats.num_drafted} drafted")
    assert engine.stats.num_drafted >= 40
    assert engine.stats.acceptance_rate < 0.05


@pytest.mark.parametrize("k", [1, 4])
def test_identical_draft_accepts_every_position(ckpts, llms, prompts, k):
    llm = llms.get(ckpts.smollm2_target, ckpts.smollm2_target, k=k)
    assert llm.draft_info["vocab_mode"] == "identity"
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20))
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == reference_greedy(ckpts.smollm2_target, prompt, 20)
        assert out.metrics["acceptance_by_position"] == [1.0] * k
        assert out.metrics["acceptance_length"] == k + 1
    assert llm.stats.acceptance_rate == 1.0


def test_identical_draft_is_accepted_when_sampling(ckpts, llms, prompts):
    """p == q: the rejection test u * q(x) < p(x) accepts every draft token (float64: no rounding gap shows)."""
    llm = llms.get(ckpts.smollm2_target, ckpts.smollm2_target, k=4)
    params = [SamplingParams(temperature=1.0, max_tokens=20, seed=i) for i in range(len(prompts))]
    outputs = llm.generate(prompts, params)
    drafted = sum(o.metrics["num_drafted"] for o in outputs)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    assert drafted >= 80 and accepted == drafted, (accepted, drafted)
