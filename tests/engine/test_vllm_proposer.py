"""anydraft's vLLM custom_class proposer, driven the way vLLM 0.32 drives it (vllm_caller.py), without vLLM.

Every propose call is checked, for every drafted row, against that row's own history:
- the draft state serving the row spells the row's text (a state of another request, or a stale one, would
  not), and for a shared vocabulary holds exactly the row's target ids;
- its proposals are what the draft computes without a KV cache over that state's draft ids;
- its draft KV cache row holds exactly the keys and values of those draft ids followed by the proposals it
  fed while drafting (a wrong rewind, a stale entry or a row of another request would differ).
"""
from __future__ import annotations

import json
import random
import sys
import types

import numpy as np
import pytest
import torch

from anydraft.config import SpeculativeConfig
from anydraft.integrations.vllm.history_drafter import HistoryDrafter, VLLMContractError
from anydraft.model.kv_cache import KVCache
from anydraft.spec_decode.draft_vocab import ResyncContextSync
from reference_model import reference_greedy
from tiny_models import tokenizer_of
from vllm_caller import FakeRequest, FakeVLLM

PAIRS = [
    ("tli_qwen3_target_llama2_draft", "qwen3_target", "llama2_draft", {}),
    ("tli_shuffled_partial", "gpt2_target", "gpt2_shuffled_noisy_draft", {}),
    ("tli_fr_head", "gpt2_target", "gpt2_shuffled_noisy_draft", {"draft_vocab_size": 2048}),
    ("identity_partial", "smollm2_target", "smollm2_noisy_draft", {}),
    ("d2t_partial", "smollm2_target", "smollm2_d2t_draft", {}),
]


def build_drafter(target_dir, draft_dir, k: int, num_slots: int, max_model_len: int = 256,
                  **spec_options) -> HistoryDrafter:
    vocab_rows = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    spec = SpeculativeConfig(model=str(draft_dir), num_speculative_tokens=k, **spec_options)
    drafter, _ = HistoryDrafter.build(spec,
                                      tokenizer_of(target_dir), vocab_rows, torch.device("cpu"), torch.float64,
                                      num_slots, max_model_len)
    return drafter


@torch.inference_mode()
def assert_cache_holds(draft, slot: int, draft_ids: list[int]) -> None:
    """The draft cache row `slot` holds the keys/values of `draft_ids`, position by position, as a fresh cache
    filled in one forward would (float64: equal to rounding)."""
    runner = draft.runner
    assert runner.cache.length(slot) == len(draft_ids)
    fresh = KVCache(runner.cfg.num_hidden_layers, 1, len(draft_ids), runner.cfg.num_key_value_heads,
                    runner.cfg.head_dim, runner.dtype, runner.device)
    runner.model(torch.tensor([draft_ids]), fresh, fresh.window([0], len(draft_ids)))
    fresh.advance([0], len(draft_ids))
    for held, expected in zip(runner.cache.entries(slot), fresh.entries(0)):
        torch.testing.assert_close(held, expected, rtol=1e-9, atol=1e-9)


@torch.inference_mode()
def proposals_without_cache(draft, slot: int) -> list[int]:
    runner, vocab = draft.runner, draft.vocab
    draft_ids = list(draft.states[slot].draft_ids)
    out = []
    for _ in range(draft.num_speculative_tokens):
        head_row = runner.logits(runner.model(torch.tensor([draft_ids]))[:, -1]).argmax(-1)
        out.append(int(vocab.to_target(head_row)))
        draft_ids.append(int(vocab.to_draft_input(head_row)))
    return out


class RowChecker:
    """Checks each drafted row's draft state against the row's own history (see the module docstring)."""

    def __init__(self, drafter: HistoryDrafter):
        self.drafter = drafter
        self.target_tokenizer = drafter.target_tokenizer
        sync = drafter.draft.vocab.sync
        self.resync = sync.resync if isinstance(sync, ResyncContextSync) else None
        self.rows_checked = 0

    def target_text(self, target_ids: list[int]) -> bytes:
        table, specials = self.target_tokenizer.token_table, set(self.target_tokenizer.special_ids)
        return b"".join(table.token_bytes[t] for t in target_ids if t not in specials)

    def __call__(self, fake: FakeVLLM, sampled, drafts) -> None:
        draft = self.drafter.draft
        for row, row_drafts in enumerate(drafts):
            if not row_drafts:
                continue
            history = fake.batch.token_ids_cpu[row, :fake.batch.num_tokens_no_spec[row]].tolist()
            state = draft.states[self.drafter.states.row_hint[row]]
            if self.resync is None:
                assert state.draft_ids == history, f"row {row}: draft ids are not the row's target ids"
            else:
                draft_text = self.resync.draft_text_bytes(state.draft_ids) + state.pending
                # A Metaspace draft tokenizer (llama2) spells the prompt with its dummy leading space.
                assert draft_text in (self.target_text(history), b" " + self.target_text(history)), f"row {row}"
            slot = self.drafter.states.row_hint[row]
            assert row_drafts == proposals_without_cache(draft, slot), f"row {row}"
            fed = [draft.vocab.sync.draft_id_of(t) for t in row_drafts[:-1]]   # proposals 1..k-1 went in
            assert_cache_holds(draft, slot, state.draft_ids + fed)
            self.rows_checked += 1


def requests_for(target_dir, prompts: list[str], max_tokens: int) -> list[FakeRequest]:
    tokenizer = tokenizer_of(target_dir)
    return [FakeRequest(f"r{i}", tokenizer.encode(p), reference_greedy(target_dir, p, max_tokens),
                        prefill_chunks=2 if i % 3 == 1 else 1) for i, p in enumerate(prompts)]


def run_with_moves(fake: FakeVLLM, requests: list[FakeRequest], max_rows: int, seed: int,
                   preempt_at: int | None = 4) -> int:
    """Admit while rows are free; every step swap two rows; preempt one request once and resume it later."""
    rng = random.Random(seed)
    waiting, steps, preempted = list(requests), 0, None
    while waiting or any(r is not None for r in fake.batch.requests):
        while waiting and None in fake.batch.requests[:max_rows]:
            fake.admit(waiting.pop(0))
        fake.step()
        steps += 1
        live = [row for row, r in enumerate(fake.batch.requests) if r is not None]
        if len(live) >= 2:
            fake.batch.swap(*rng.sample(live, 2))
        if steps == preempt_at and live:
            preempted = fake.batch.requests[live[0]]
            fake.preempt(preempted)
            fake.batch.condense()
            waiting.append(preempted)      # resumed once a row is free, with its output so far
        assert steps < 500
    return steps


@pytest.mark.parametrize("case, target, draft, spec_options", PAIRS, ids=[p[0] for p in PAIRS])
def test_rows_moved_finished_preempted_keep_their_own_state(ckpts, prompts, draft_vocab_corpus, case, target, draft,
                                                            spec_options):
    target_dir, draft_dir = getattr(ckpts, target), getattr(ckpts, draft)
    k, max_rows = 3, 3
    if spec_options:
        spec_options = {**spec_options, "draft_vocab_corpus": str(draft_vocab_corpus)}
    drafter = build_drafter(target_dir, draft_dir, k, num_slots=2 * max_rows, **spec_options)
    assert drafter.draft.vocab.kind == case.split("_")[0]
    if "draft_vocab_size" in spec_options:
        assert drafter.draft.runner.head_rows == spec_options["draft_vocab_size"]
    checker = RowChecker(drafter)
    fake = FakeVLLM(drafter, max_rows=4, max_len=256, k=k, check=checker)
    requests = requests_for(target_dir, prompts, max_tokens=20)
    run_with_moves(fake, requests, max_rows, seed=0)
    assert all(r.output_ids == r.reference_ids for r in requests)   # the caller itself appends what vLLM would
    assert checker.rows_checked >= 30
    # Spare slots: the moved and the preempted request found their states again instead of starting over.
    assert drafter.states.calls == fake.calls
    assert len(drafter.states.states) == len(requests)
    if case != "tli_qwen3_target_llama2_draft":   # two random models there: proposals are rarely accepted
        assert sum(r.num_accepted for r in requests) > 0


def test_few_slots_evict_and_resync(ckpts, prompts):
    """With as many slots as rows, a resumed request's state is gone (evicted): it is rebuilt from its history."""
    target_dir, draft_dir = ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft
    drafter = build_drafter(target_dir, draft_dir, k=3, num_slots=2)
    checker = RowChecker(drafter)
    fake = FakeVLLM(drafter, max_rows=2, max_len=256, k=3, check=checker)
    requests = requests_for(target_dir, prompts, max_tokens=16)
    run_with_moves(fake, requests, max_rows=2, seed=1, preempt_at=3)
    assert checker.rows_checked >= 20
    assert all(r.output_ids == r.reference_ids for r in requests)
    # Control: the cache check sees one stale entry (the re-fed last token aside, nothing else would).
    draft = drafter.draft
    slot, state = next((s, st) for s, st in draft.states.items() if draft.runner.cache.length(s) >= 3)
    draft.runner.cache.k[0, draft.runner.cache.tables[slot][0], 1] += 1e-3
    with pytest.raises(AssertionError):
        assert_cache_holds(draft, slot, state.draft_ids[:draft.runner.cache.length(slot)])


def test_row_reused_with_rewritten_history(ckpts, prompts):
    """A row whose tokens were overwritten in place (another request, same row, same length or longer)
    gets a fresh state; two rows with the same history get two states."""
    target_dir, draft_dir = ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft
    drafter = build_drafter(target_dir, draft_dir, k=3, num_slots=4)
    checker = RowChecker(drafter)
    fake = FakeVLLM(drafter, max_rows=3, max_len=256, k=3, check=checker)
    first, second = requests_for(target_dir, prompts[2:4], max_tokens=12)
    second.prefill_chunks = 1         # samples at once: the row's old state is still its hint
    twin = FakeRequest("twin", first.prompt_ids, first.reference_ids)
    for request in (first, twin):
        fake.admit(request)
    fake.step()
    fake.step()
    slots = [drafter.states.row_hint[row] for row in (0, 1)]
    assert slots[0] != slots[1]
    fake.batch.requests[0] = None     # row 0 handed to another request without a condense
    fake.admit(second)
    assert fake.batch.requests[0] is second
    fake.step()
    fake.step()
    assert checker.rows_checked >= 6


def test_history_ending_mid_character(ckpts):
    """A request first seen with a history that ends inside a UTF-8 character: the complete text is the draft's
    prompt and the partial byte goes through re-sync (a byte token, or pending), never decoded to U+FFFD."""
    target_dir = ckpts.qwen3_target
    drafter = build_drafter(target_dir, ckpts.llama2_draft, k=2, num_slots=2)
    tokenizer = tokenizer_of(target_dir)
    table = tokenizer.token_table
    lead_byte = next(i for i, b in enumerate(table.token_bytes) if b == "é".encode()[:1])
    history = tokenizer.encode("Answer: caf") + [lead_byte]
    token_ids = np.zeros((1, 64), dtype=np.int32)
    token_ids[0, :len(history)] = history
    drafts = drafter.propose([[lead_byte]], np.array([len(history)], dtype=np.int32), token_ids)
    state = drafter.draft.states[drafter.states.row_hint[0]]
    resync = drafter.draft.vocab.sync.resync
    assert len(drafts[0]) == 2
    assert (resync.draft_text_bytes(state.draft_ids) + state.pending).lstrip(b" ") == b"Answer: caf\xc3"


def test_contract_is_checked(ckpts):
    drafter = build_drafter(ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft, k=2, num_slots=2)
    token_ids = np.zeros((2, 16), dtype=np.int32)
    token_ids[0, :5] = [10, 11, 12, 13, 14]
    num_tokens = np.array([5, 0], dtype=np.int32)
    assert drafter.propose([[14], []], num_tokens, token_ids)[1] == []
    with pytest.raises(VLLMContractError, match="does not end with the sampled tokens"):
        drafter.propose([[99], []], num_tokens, token_ids)
    with pytest.raises(VLLMContractError, match="not a list"):
        drafter.propose(np.array([[14]]), num_tokens, token_ids)
    with pytest.raises(VLLMContractError, match="2-D"):
        drafter.propose([[14], []], num_tokens, token_ids[0])


def fake_vllm_config(target_dir, k=3, async_scheduling=False):
    vocab_rows = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    model_config = types.SimpleNamespace(max_model_len=256, get_vocab_size=lambda: vocab_rows, dtype=torch.float64,
                                         tokenizer=str(target_dir), tokenizer_revision=None)
    return types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(num_speculative_tokens=k), model_config=model_config,
        scheduler_config=types.SimpleNamespace(max_num_seqs=2, async_scheduling=async_scheduling),
        device_config=types.SimpleNamespace(device=torch.device("cpu")))


@pytest.fixture
def fake_vllm_module(monkeypatch):
    module = types.ModuleType("vllm")
    module.__version__ = "0.32.0"
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_anydraft_proposer_as_vllm_builds_it(ckpts, monkeypatch, fake_vllm_module):
    from anydraft.integrations.vllm import AnydraftProposer
    target_dir = ckpts.gpt2_target
    monkeypatch.delenv("ANYDRAFT_DRAFT_MODEL", raising=False)
    with pytest.raises(ValueError, match="set ANYDRAFT_DRAFT_MODEL"):
        AnydraftProposer(fake_vllm_config(target_dir))
    monkeypatch.setenv("ANYDRAFT_DRAFT_MODEL", str(ckpts.gpt2_shuffled_noisy_draft))
    with pytest.raises(VLLMContractError, match="async scheduling"):
        AnydraftProposer(fake_vllm_config(target_dir, async_scheduling=True))
    fake_vllm_module.__version__ = "0.21.3"
    with pytest.raises(VLLMContractError, match="no custom_class proposers"):
        AnydraftProposer(fake_vllm_config(target_dir))
    fake_vllm_module.__version__ = "0.32.0"
    proposer = AnydraftProposer(fake_vllm_config(target_dir))
    proposer.load_model(torch.nn.Linear(2, 2, dtype=torch.float64))   # vLLM passes the target model
    assert proposer.info["vocab_mode"] == "tli" and proposer.num_slots == 2
    with pytest.raises(VLLMContractError, match="positional arguments"):
        proposer.propose(3, [[1]], np.zeros(1), np.zeros((1, 4)))
    with pytest.raises(VLLMContractError, match="keywords"):
        proposer.propose([[1]], np.ones(1, dtype=np.int32), np.ones((1, 4), dtype=np.int32), request_ids=["a"])
    token_ids = np.zeros((1, 32), dtype=np.int32)
    prompt = tokenizer_of(target_dir).encode("Answer: 12 + 7 =")
    token_ids[0, :len(prompt)] = prompt
    drafts = proposer.propose([[prompt[-1]]], np.array([len(prompt)], dtype=np.int32), token_ids, slot_mappings=None)
    assert len(drafts) == 1 and len(drafts[0]) == 3
