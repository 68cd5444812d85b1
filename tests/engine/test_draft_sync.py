"""The draft stays in step with the target across steps: what it proposes is what it would propose from
scratch on its current sequence, and (TLI) that sequence spells the target's text.

Each propose is checked against the draft model run without a KV cache over the draft's whole sequence, so a
wrong rewind, a stale cache entry or a bad re-sync edit shows up as a different proposal, even where the
target's output (always lossless) would hide it.
"""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.spec_decode.draft_vocab import ResyncContextSync

CASES = [
    ("identity_partial", "smollm2_target", "smollm2_noisy_draft", 3),
    ("d2t_partial", "smollm2_target", "smollm2_d2t_draft", 3),
    ("tli_qwen3_target_llama2_draft", "qwen3_target", "llama2_draft", 3),
    ("tli_llama2_target_qwen3_draft", "llama2_target", "qwen3_draft", 2),
    ("tli_shuffled_partial", "gpt2_target", "gpt2_shuffled_noisy_draft", 4),
    ("tli_cut_vocabulary", "small_target", "small_tli_draft", 3),
]


@torch.inference_mode()
def proposals_from_scratch(proposer, row: int) -> list[int]:
    """k greedy proposals (target ids) of the draft over its full sequence, no cache."""
    runner, vocab = proposer.runner, proposer.vocab
    draft_ids = list(proposer.states[row].draft_ids)
    out = []
    for _ in range(proposer.num_speculative_tokens):
        hidden = runner.model(torch.tensor([draft_ids], device=runner.device))[:, -1]
        head_row = runner.logits(hidden).argmax(-1)
        out.append(int(vocab.to_target(head_row)))
        draft_ids.append(int(vocab.to_draft_input(head_row)))
    return out


@pytest.mark.parametrize("case, target, draft, k", CASES, ids=[c[0] for c in CASES])
def test_draft_proposes_from_its_synced_sequence(ckpts, llms, prompts, monkeypatch, case, target, draft, k):
    llm = llms.get(getattr(ckpts, target), getattr(ckpts, draft), k=k)
    proposer = llm.proposer
    real_propose, real_observe, real_add = proposer.propose, proposer.observe, proposer.add_request
    checked = {"proposals": 0, "steps": 0}
    prompt_bytes: dict[int, bytes] = {}
    target_bytes: dict[int, bytes] = {}
    resync = proposer.vocab.sync.resync if isinstance(proposer.vocab.sync, ResyncContextSync) else None
    target_table = llm.tokenizer.token_table

    def propose(rows, sampling, num_tokens=None, target_states=None):
        assert num_tokens in (None, k)   # a fixed k: the engine drafts k every step
        # propose reads the rows' waiting text first (a joining row's first token) and writes its proposals to the
        # cache only: after it, each row's sequence is whole and is what the draft had to propose from.
        proposal = real_propose(rows, sampling, num_tokens, target_states)
        for i, row in enumerate(rows):
            expected = proposals_from_scratch(proposer, row)
            assert proposal.draft_target_ids[i].tolist() == expected, f"row {row}, step {checked['steps']}"
            checked["proposals"] += k
            if resync is not None:   # it has read any backlog: its text is the target's
                assert_synced(row)
        checked["steps"] += 1
        return proposal

    def add_request(row, prompt_text, prompt_target_ids):
        real_add(row, prompt_text, prompt_target_ids)
        if resync is not None:
            # The draft's own tokenization of the prompt; the target's tokens (its first one next) follow it.
            prompt_bytes[row] = resync.draft_text_bytes(resync.new_state(prompt_text).draft_ids)
            target_bytes[row] = b""

    def assert_synced(row):
        state = proposer.states[row]
        assert resync.draft_text_bytes(state.draft_ids) + state.pending == prompt_bytes[row] + target_bytes[row]

    def observe(rows, num_accepted, new_target_ids):
        real_observe(rows, num_accepted, new_target_ids)
        if resync is None:
            return
        for row, target_ids in zip(rows, new_target_ids):
            # Specials spell nothing on either side (the re-sync invariant, see vocab/resync.py).
            target_bytes[row] += b"".join(target_table.token_bytes[t] for t in target_ids
                                          if t not in llm.tokenizer.special_ids)
            if not proposer.backlog:   # text left for the next propose (after a join) is checked there
                assert_synced(row)
                assert proposer.runner.cache.length(row) <= len(proposer.states[row].draft_ids)

    def remove_request(row, real_remove=proposer.remove_request):
        prompt_bytes.pop(row, None)
        real_remove(row)

    monkeypatch.setattr(proposer, "propose", propose)
    monkeypatch.setattr(proposer, "add_request", add_request)
    monkeypatch.setattr(proposer, "observe", observe)
    monkeypatch.setattr(proposer, "remove_request", remove_request)
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n) for n in (12, 16, 20, 12, 8, 16)])
    assert all(o.outputs[0].token_ids for o in outputs)
    assert checked["steps"] >= 10 and checked["proposals"] >= 60
