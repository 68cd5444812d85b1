"""Eagle3Proposer: an EAGLE-3 draft reading the target's hidden states, k tokens per row per step.

A proposal first reads the entries the target verified since the last one (token x_j with the fused target
states of x_{j-1}, see model/eagle3.py; the states come with the proposal), then drafts k tokens chaining its own
output. The drafted entries are rewound at the next observe: once verified, those positions are fed again with the
target's states.
"""
from __future__ import annotations

import time

import torch

from ..model.captured_states import CapturedStates
from ..model.eagle3 import Eagle3Draft
from ..model.kv_cache import KVCache
from ..tensors import host_to_device
from .proposer import Proposal, SamplingBatch, empty_proposal
from .reduced_vocab import ReducedVocab
from .target_states import TargetStateLog


class Eagle3Proposer:
    def __init__(self, module: Eagle3Draft, vocab: ReducedVocab, num_speculative_tokens: int, max_batch: int,
                 max_len: int):
        cfg = module.cfg
        param = module.fc.weight
        self.module, self.vocab = module, vocab
        self.num_speculative_tokens = num_speculative_tokens
        self.later_draft_seconds = 0.0   # the last proposal's forwards after its first (Proposer)
        self.device, self.dtype = param.device, param.dtype
        self.cache = KVCache(cfg.num_hidden_layers, max_batch, max_len, cfg.num_key_value_heads, cfg.head_dim,
                             self.dtype, self.device)
        self.states = TargetStateLog()
        self.carried: dict[int, torch.Tensor] = {}   # row -> the draft's output at its last verified entry

    def add_request(self, row: int, prompt_text: str, prompt_target_ids: list[int]) -> None:
        self.states.start(row, prompt_target_ids)
        self.cache.reset(row)

    def remove_request(self, row: int) -> None:
        self.states.remove(row)
        self.carried.pop(row, None)
        self.cache.reset(row)

    @torch.inference_mode()
    def observe(self, rows: list[int], num_accepted: list[int], new_target_ids: list[list[int]]) -> None:
        """Rewind the drafted entries; the verified ones are read with their states, at the next proposal."""
        for row, target_ids in zip(rows, new_target_ids):
            self.states.extend(row, target_ids)
            self.cache.truncate(row, self.states.rows[row].consumed)   # drop the drafted entries

    def _feed_verified(self, rows: list[int]) -> None:
        pending = [self.states.take(row) for row in rows]
        counts = [len(ids) for ids, _ in pending]
        width = max(counts)
        input_ids = host_to_device([ids + [0] * (width - len(ids)) for ids, _ in pending], self.device, torch.long)
        hidden = torch.stack([torch.nn.functional.pad(states, (0, 0, 0, width - len(states)))
                              for _, states in pending])                                  # [B, W, hidden]
        out = self._forward(rows, input_ids, hidden, counts)                             # [B, W, hidden]
        for b, (row, count) in enumerate(zip(rows, counts)):
            self.carried[row] = out[b, count - 1]                  # what the first draft step reads [hidden]

    def unread_tokens(self, rows: list[int]) -> int:
        """The prompts of rows the draft has read nothing of (a proposal reads them first). Not the entries of plain
        steps, as DraftModelProposer.unread_tokens says why."""
        return sum(self.states.unread(row) for row in rows if not self.states.rows[row].consumed)

    def draft_forwards(self, num_tokens: int) -> int:
        """A layer forward over the verified entries, a head per draft and a layer forward between drafts: about
        one layer-and-head per drafted token."""
        return num_tokens

    @torch.inference_mode()
    def propose(self, rows: list[int], sampling: SamplingBatch | None, num_tokens: int | None = None,
                target_states: list[CapturedStates] | None = None) -> Proposal:
        """target_states: what the target's forwards captured since the last proposal (all of them, every row's)."""
        self.states.receive(target_states or [], self.module.fuse_target_states)
        k = self.num_speculative_tokens if num_tokens is None else num_tokens
        if k == 0:   # a plain target step: the unread entries wait for the next proposal that drafts
            return empty_proposal(len(rows), self.vocab.target_vocab_rows, sampling is not None, self.device)
        for group in self.states.reading_groups(rows):
            self._feed_verified(group)
        carried = torch.stack([self.carried[row] for row in rows])[:, None]              # [B, 1, hidden]
        draft_target_ids, draft_probs = [], []
        for i in range(k):
            head_logits = self.vocab.mask_padding(self.module.logits(carried))             # [B, 1, N]
            chosen, target_probs = self.vocab.draw(head_logits, sampling)                 # [B, 1] target ids
            if target_probs is not None:
                draft_probs.append(target_probs)                                          # [B, 1, V_target]
            draft_target_ids.append(chosen)
            if i == 0:
                first_done = time.perf_counter()
            if i < k - 1:
                carried = self._forward(rows, chosen, carried, 1)
        self.later_draft_seconds = time.perf_counter() - first_done
        probs = None if sampling is None else torch.cat(draft_probs, dim=1)               # [B, k, V_target]
        return Proposal(torch.cat(draft_target_ids, dim=1), probs)

    def _forward(self, rows: list[int], input_ids: torch.Tensor, hidden: torch.Tensor, num_new) -> torch.Tensor:
        """Append entries [B, S] to the draft cache (num_new[b] real ones per row)."""
        seq_len = input_ids.shape[1]
        counts = num_new if isinstance(num_new, list) else None
        out = self.module(input_ids, hidden, self.cache, self.cache.window(rows, seq_len, counts))
        self.cache.advance(rows, num_new)
        return out
