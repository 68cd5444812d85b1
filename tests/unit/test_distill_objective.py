"""Distillation's objective on hand-made logits, and its examples' alignment on real tokenizers (no model)."""
from __future__ import annotations

import json

import pytest
import torch

from anydraft.distill.examples import align, as_target_continuation, on_policy_prompts
from anydraft.distill.objective import (acceptance, distillation_loss, one_hot_acceptance, proposal_log_probs,
                                       target_probs_on)
from anydraft.vocab.bridge import VocabBridge
from anydraft.vocab.resync import DraftResync

COLUMNS = torch.tensor([0, 2, 3])   # the intersection's target ids, in the draft's order


def test_acceptance_is_one_minus_total_variation_with_the_draft_inside_the_intersection():
    target_logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1, 0.0]], dtype=torch.float64) + 1e-300)
    p = target_probs_on(target_logits, COLUMNS, 1.0, num_token_rows=5)                # [1, 3]
    log_q = torch.log(torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64))
    full_q = torch.tensor([0.2, 0.0, 0.5, 0.3, 0.0], dtype=torch.float64)          # q scattered into the target vocab
    full_p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0], dtype=torch.float64)
    tv = 0.5 * (full_p - full_q).abs().sum()
    assert acceptance(p, log_q).item() == pytest.approx(1 - tv.item())
    assert acceptance(p, log_q).item() == pytest.approx(0.2 + 0.2 + 0.1)


def test_one_hot_acceptance_is_the_targets_probability_of_the_drafts_argmax():
    p = torch.tensor([[0.2, 0.2, 0.1], [0.5, 0.1, 0.3]], dtype=torch.float64)         # within the intersection
    log_q = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]], dtype=torch.float64))
    assert one_hot_acceptance(p, log_q).tolist() == [0.2, 0.3]
    # Drawing from q and verifying with q accepts more than verifying its argmax as one-hot whenever q spreads
    # like p: q = p restricted to the intersection gives the total intersection mass for the first.
    q_like_p = torch.log(p / p.sum(dim=-1, keepdim=True))
    assert (acceptance(p, q_like_p) > one_hot_acceptance(p, q_like_p)).all()


def test_padding_rows_never_take_target_probability():
    logits = torch.tensor([[1.0, 0.0, 2.0, 0.5, 50.0, 50.0]])   # rows 4 and 5: padding past the tokenizer
    p = target_probs_on(logits, COLUMNS, 1.0, num_token_rows=4)
    expected = torch.softmax(logits[:, :4], dim=-1)[:, COLUMNS]
    torch.testing.assert_close(p, expected)


def test_temperature_applies_to_both_sides():
    logits = torch.tensor([[1.0, 0.0, 2.0, 0.5]])
    hot, cold = target_probs_on(logits, COLUMNS, 2.0, 4), target_probs_on(logits, COLUMNS, 0.5, 4)
    assert hot.max() < cold.max()
    draft = torch.tensor([[0.0, 1.0, 2.0]])
    assert proposal_log_probs(draft, 2.0).exp().max() < proposal_log_probs(draft, 0.5).exp().max()
    torch.testing.assert_close(proposal_log_probs(draft, 1.0).exp().sum(-1), torch.ones(1))


@pytest.mark.parametrize("kind", ["tv", "kl", "jsd"])
def test_a_gradient_step_on_each_loss_raises_acceptance(kind):
    torch.manual_seed(0)
    p = target_probs_on(torch.randn(16, 40) * 2, torch.arange(0, 40, 2), 0.7, 40)
    draft_logits = torch.randn(16, 20, requires_grad=True)
    before = acceptance(p, proposal_log_probs(draft_logits, 0.7)).mean()
    loss = distillation_loss(p, proposal_log_probs(draft_logits, 0.7), kind)
    loss.backward()
    with torch.no_grad():
        after = acceptance(p, proposal_log_probs(draft_logits - 0.5 * draft_logits.grad, 0.7)).mean()
    assert after > before


def test_kl_and_jsd_vanish_where_the_draft_matches_the_target_within_the_intersection():
    p = target_probs_on(torch.randn(4, 10), torch.arange(5), 1.0, 10)
    matched = torch.log(p / p.sum(-1, keepdim=True))
    assert distillation_loss(p, matched, "kl").item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(p, matched, "jsd").item() == pytest.approx(0.0, abs=1e-6)
    uniform = torch.log(torch.full_like(p, 0.2))   # negative control
    assert distillation_loss(p, uniform, "kl").item() > 0.01
    assert acceptance(p, matched).mean() > acceptance(p, uniform).mean()


def test_an_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="loss must be one of tv, kl, jsd"):
        distillation_loss(torch.ones(1, 2) / 2, torch.log(torch.ones(1, 2) / 2), "mse")


@pytest.mark.parametrize("target, draft", [("qwen3", "smollm2"), ("qwen3", "mistral_v0.1"), ("llama2", "qwen3")])
def test_aligned_positions_share_a_text_boundary_as_the_draft_reads_it_while_serving(load_tokenizer, shared_dir,
                                                                                   target, draft):
    """At every aligned pair of positions the target's ids and the draft's ids spell the same bytes, and the draft's
    ids are what re-sync gives the draft while serving (its prompt encoding, then the target's tokens)."""
    target_tokenizer, draft_tokenizer = load_tokenizer(target), load_tokenizer(draft)
    resync = DraftResync(VocabBridge.build(target_tokenizer, draft_tokenizer), target_tokenizer, draft_tokenizer)
    with open(shared_dir / "data" / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(6), f)]
    for row in rows:
        prompt = f"Question: {row['question']}\nAnswer:"
        prompt_ids = target_tokenizer.encode(prompt)
        continuation = target_tokenizer.encode(" " + row["answer"] + " café 日本", add_special_tokens=False)
        example = align(resync, prompt_ids, prompt, continuation)
        assert example.target_ids == prompt_ids + continuation
        assert len(example.target_positions) > len(continuation) // 3   # most boundaries are shared
        state = resync.new_state(prompt)
        resync.extend(state, continuation[:-1])
        assert example.draft_ids == state.draft_ids
        prompt_bytes = resync.draft_text_bytes(resync.new_state(prompt).draft_ids)
        for t, d in zip(example.target_positions, example.draft_positions):
            written = continuation[:t + 1 - len(prompt_ids)]   # the target's tokens before the boundary
            spelled = b"".join(target_tokenizer.token_bytes(i) for i in written)
            assert resync.draft_text_bytes(example.draft_ids[:d + 1]) == prompt_bytes + spelled


@pytest.mark.parametrize("num_prompts, fraction", [(8, 0.0), (8, 0.5), (10, 0.3), (7, 1.0), (256, 0.25)])
def test_on_policy_prompts_are_the_fraction_asked_spread_over_the_corpus(num_prompts, fraction):
    chosen = on_policy_prompts(num_prompts, fraction)
    assert len(chosen) == int(num_prompts * fraction)
    assert chosen == sorted(set(chosen)) and all(0 <= i < num_prompts for i in chosen)
    if len(chosen) > 1:   # evenly spread: no gap wider than one stride + 1
        assert max(b - a for a, b in zip(chosen, chosen[1:])) <= 1 / fraction + 1


@pytest.mark.parametrize("target", ["qwen3", "llama2"])
def test_another_models_text_continues_the_prompt_in_the_targets_ids(load_tokenizer, target):
    """The draft's text, re-read by the target: the continuation ids follow the prompt's own encoding and spell the
    text, also where the text would merge with the prompt's last token."""
    tokenizer = load_tokenizer(target)
    prompt = "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"
    prompt_ids = tokenizer.encode(prompt)
    for text in (" He has 3 + 4 = 7 apples. #### 7", "\n\n7 apples, café 日本", ":) 7"):
        continuation = as_target_continuation(tokenizer, prompt, prompt_ids, text)
        whole = tokenizer.encode(prompt + text)
        if whole[:len(prompt_ids)] == prompt_ids:   # the usual case: the target's own reading of the whole text
            assert continuation == whole[len(prompt_ids):]
        assert tokenizer.decode(prompt_ids + continuation, skip_special_tokens=True).endswith(text)
