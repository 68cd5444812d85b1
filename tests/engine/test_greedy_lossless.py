"""Greedy speculative output equals target-alone greedy output token for token (float64), in every vocab mode.

The reference is the slow obvious decoder (full sequence through the target each step, no KV cache), so a
bug in the engine's cache handling is caught even where it would hit target-alone decoding too.
Drafts that agree only partly make the step accept some tokens and reject others, so rewinds and re-sync
run on every step; those cases also assert the acceptance is strictly between none and all.
"""
from __future__ import annotations

import pytest

from anydraft.config import SamplingParams

from anydraft.vocab.cache import load_or_build_bridge

from reference_model import reference_greedy
from tiny_models import tokenizer_of

# (case, target checkpoint, draft checkpoint, vocab mode auto must pick, k, draft agrees partly)
CASES = [
    ("identity_random", "smollm2_target", "smollm2_random_draft", "identity", 3, False),
    ("identity_partial", "smollm2_target", "smollm2_noisy_draft", "identity", 3, True),
    ("identity_more_draft_rows", "smollm2_target", "smollm2_padded_draft", "identity", 3, True),
    ("d2t_partial", "smollm2_target", "smollm2_d2t_draft", "d2t", 3, True),
    ("tli_qwen3_target_llama2_draft", "qwen3_target", "llama2_draft", "tli", 3, False),
    ("tli_llama2_target_qwen3_draft", "llama2_target", "qwen3_draft", "tli", 2, False),
    ("tli_shuffled_partial", "gpt2_target", "gpt2_shuffled_noisy_draft", "tli", 4, True),
]
IDS = [c[0] for c in CASES]


def _acceptance(outputs, k: int) -> tuple[float, int, int]:
    forwards = sum(o.metrics["target_forwards"] for o in outputs)
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    return accepted / forwards, accepted, forwards


@pytest.mark.parametrize("case, target, draft, mode, k, partial", CASES, ids=IDS)
def test_batch_of_one_matches_target_alone(ckpts, llms, prompts, case, target, draft, mode, k, partial):
    target_dir, draft_dir = getattr(ckpts, target), getattr(ckpts, draft)
    llm = llms.get(target_dir, draft_dir, k=k)
    assert llm.draft_info["vocab_mode"] == mode
    prompt = prompts[2]
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=32))
    expected_target_ids = reference_greedy(target_dir, prompt, 32)
    assert out.outputs[0].token_ids == expected_target_ids
    assert out.outputs[0].finish_reason == ("stop" if len(expected_target_ids) < 32 else "length")
    assert out.metrics["vocab_mode"] == mode
    assert 1 <= out.metrics["acceptance_length"] <= k + 1
    split = out.metrics["time_split_seconds"]
    # The split is reported rounded to 0.1 ms per part: allow that rounding, nothing more.
    assert split["draft"] > 0 and split["target"] > 0 and sum(split.values()) <= llm.stats.wall_seconds + 1.5e-4


@pytest.mark.parametrize("case, target, draft, mode, k, partial", CASES, ids=IDS)
def test_mixed_length_batch_matches_target_alone(ckpts, llms, prompts, case, target, draft, mode, k, partial):
    """Six prompts over four cache rows: rows are reused as requests finish (continuous batching)."""
    target_dir, draft_dir = getattr(ckpts, target), getattr(ckpts, draft)
    llm = llms.get(target_dir, draft_dir, k=k, max_num_seqs=4)
    max_tokens = [24, 17, 30, 24, 9, 24]
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    for prompt, n, out in zip(prompts, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:40]!r}"
    acceptance, accepted, forwards = _acceptance(outputs, k)
    print(f"\n[{case}] k={k} accepted {accepted} over {forwards} target forwards: "
          f"mean accepted/step {acceptance:.2f}, AL {1 + acceptance:.2f}")
    if partial:
        # The draft agrees partly: some steps accept, others reject (the check could fail either way).
        assert 0 < acceptance < k, f"mean accepted per step {acceptance:.2f} not strictly inside (0, {k})"
        per_step = [o.metrics["acceptance_by_position"] for o in outputs]
        assert any(p[0] > 0 for p in per_step) and any(p[-1] < 1 for p in per_step)


def test_identity_with_more_draft_rows_samples_within_the_target_vocabulary(ckpts, llms, prompts):
    """Sampling through the identity map when the draft has 128 more (padding) rows than the target."""
    llm = llms.get(ckpts.smollm2_target, ckpts.smollm2_padded_draft, k=3)
    outputs = llm.generate(prompts, [SamplingParams(temperature=1.0, max_tokens=12, seed=i) for i in range(6)])
    vocab_size = llm.tokenizer.vocab_size
    assert all(0 <= t < vocab_size for o in outputs for t in o.outputs[0].token_ids)
    assert sum(o.metrics["num_accepted"] for o in outputs) > 0


# (case, target, draft, vocab mode, head rows kept): heads cut hard, so the draft's favourite is often cut
FR_CASES = [
    ("tli_fr_head", "qwen3_target", "llama2_draft", "tli", 96),
    ("identity_fr_head", "smollm2_target", "smollm2_noisy_draft", "identity", 64),
]


@pytest.mark.parametrize("case, target, draft, mode, head_rows", FR_CASES, ids=[c[0] for c in FR_CASES])
def test_frequency_ranked_head_matches_target_alone(ckpts, llms, prompts, draft_vocab_corpus, case, target, draft,
                                                    mode, head_rows):
    """A draft head cut to its most frequent rows changes what is proposed, never what is output."""
    target_dir, draft_dir = getattr(ckpts, target), getattr(ckpts, draft)
    llm = llms.get(target_dir, draft_dir, k=3, draft_vocab_size=head_rows, draft_vocab_corpus=str(draft_vocab_corpus))
    info = llm.draft_info
    assert info["vocab_mode"] == mode and info["draft_head_rows"] == head_rows == info["draft_vocab"]["size"]
    assert 0 < info["draft_vocab"]["corpus_coverage_pct"] < 100
    head_targets = set(llm.proposer.vocab.head_to_target.tolist())
    bridge = load_or_build_bridge(llm.tokenizer, tokenizer_of(draft_dir), llm.target.vocab_rows,
                                  llm.proposer.runner.vocab_rows)
    proposable_eos = [t for t in llm.tokenizer.eos_token_ids if bridge.is_identity or bridge.target_to_draft[t] >= 0]
    assert proposable_eos and set(proposable_eos) <= head_targets   # specials stay in the head whatever their count
    max_tokens = [24, 17, 30, 24, 9, 24]
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    for prompt, n, out in zip(prompts, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:40]!r}"
    proposed = sum(o.metrics["num_drafted"] for o in outputs)
    assert proposed > 0


def test_frequency_ranked_head_is_refused_for_a_reduced_d2t_head(ckpts, draft_vocab_corpus):
    from anydraft.llm import LLM
    with pytest.raises(ValueError, match="already reduced"):
        LLM(model=str(ckpts.smollm2_target), dtype="float64", device="cpu", max_model_len=64,
            speculative_config={"model": str(ckpts.smollm2_d2t_draft), "draft_vocab_size": 8,
                                "draft_vocab_corpus": str(draft_vocab_corpus)})
