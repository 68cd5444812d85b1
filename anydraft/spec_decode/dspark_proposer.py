"""DSparkProposer: a DSpark draft writes a whole block per step from the target's hidden states.

Each proposal appends the fused target states the target verified since the last one (they come with the
proposal) to the draft's context cache (keys and values only), then runs one forward over the block [anchor = the
newest target token, mask tokens]. Two layouts, as the checkpoint's config says (sample_from_anchor):
anchor-first, where slot i predicts the token after slot i's position (block_size drafts), and 1+N, where the
anchor is the bonus token and slot i >= 1 predicts its own position's token (block_size - 1 drafts). The Markov bias makes each
slot's logits depend on the token chosen at the slot before, so choosing is sequential (cheap: rank-r).
"""
from __future__ import annotations

import torch

from ..model.captured_states import CapturedStates
from ..model.dspark import DSparkDraft, block_window
from ..model.kv_cache import KVCache
from ..model.speculators_config import SpeculatorsConfig
from ..tensors import host_to_device
from .proposer import Proposal, SamplingBatch, empty_proposal
from .reduced_vocab import ReducedVocab
from .target_states import TargetStateLog


class DSparkProposer:
    def __init__(self, module: DSparkDraft, vocab: ReducedVocab, num_speculative_tokens: int, max_batch: int,
                 max_len: int, cfg: SpeculatorsConfig):
        # One block is one forward: more tokens than it drafts would need a second, so k is capped there
        # (reported as draft_info["num_speculative_tokens"]).
        self.drafts_per_block = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
        self.module, self.vocab = module, vocab
        self.num_speculative_tokens = min(num_speculative_tokens, self.drafts_per_block)
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id
        self.first_slot = 0 if cfg.sample_from_anchor else 1   # the slot that predicts the token after the anchor
        param = module.fc.weight
        self.device, self.dtype = param.device, param.dtype
        lc = module.cfg
        self.cache = KVCache(lc.num_hidden_layers, max_batch, max_len + cfg.block_size, lc.num_key_value_heads,
                             lc.head_dim, self.dtype, self.device)
        self.states = TargetStateLog()

    def add_request(self, row: int, prompt_text: str, prompt_target_ids: list[int]) -> None:
        self.states.start(row, prompt_target_ids)
        self.cache.reset(row)

    def remove_request(self, row: int) -> None:
        self.states.remove(row)
        self.cache.reset(row)

    def observe(self, rows: list[int], num_accepted: list[int], new_target_ids: list[list[int]]) -> None:
        """The verified ids; their target states go into the context cache at the next proposal."""
        for row, target_ids in zip(rows, new_target_ids):
            self.states.extend(row, target_ids)

    def _write_context(self, rows: list[int]) -> None:
        pending = [self.states.take(row)[1] for row in rows]
        counts = [len(states) for states in pending]
        width = max(counts)
        context = torch.stack([torch.nn.functional.pad(s, (0, 0, 0, width - len(s))) for s in pending])
        self.module.write_context(context, self.cache, self.cache.window(rows, width, counts))
        self.cache.advance(rows, counts)

    def unread_tokens(self, rows: list[int]) -> int:
        """The prompts of rows the draft has read nothing of (a proposal reads them first). Not the entries of plain
        steps, as DraftModelProposer.unread_tokens says why."""
        return sum(self.states.unread(row) for row in rows if not self.states.rows[row].consumed)

    def draft_forwards(self, num_tokens: int) -> int:
        """One block forward drafts them all (the Markov bias between slots is rank-r, not a forward; the context
        written first is keys and values of the verified entries)."""
        return 1 if num_tokens else 0

    later_draft_seconds = 0.0   # one forward a proposal (Proposer)

    @torch.inference_mode()
    def propose(self, rows: list[int], sampling: SamplingBatch | None, num_tokens: int | None = None,
                target_states: list[CapturedStates] | None = None) -> Proposal:
        """target_states: what the target's forwards captured since the last proposal (all of them, every row's)."""
        self.states.receive(target_states or [], self.module.fuse_target_states)
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.drafts_per_block)
        if k == 0:   # a plain target step: the unread entries wait for the next proposal that drafts
            return empty_proposal(len(rows), self.vocab.target_vocab_rows, sampling is not None, self.device)
        for group in self.states.reading_groups(rows):
            self._write_context(group)
        anchors = [self.states.last_target_id(row) for row in rows]
        block_ids = host_to_device([[a] + [self.mask_token_id] * (self.block_size - 1) for a in anchors],
                                   self.device, torch.long)                                  # [B, block]
        hidden = self.module(block_ids, self.cache, block_window(self.cache, rows, self.block_size))
        head_logits_all = self.module.logits(hidden)                                          # [B, block, N]
        previous = block_ids[:, :1]                                                           # the anchor
        draft_target_ids, draft_probs = [], []
        for i in range(k):
            slot = self.first_slot + i
            head_logits = head_logits_all[:, slot:slot + 1] + self.module.markov_bias(previous)   # [B, 1, N]
            head_logits = self.vocab.mask_padding(head_logits)
            chosen, target_probs = self.vocab.draw(head_logits, sampling)                 # [B, 1] target ids
            if target_probs is not None:
                draft_probs.append(target_probs)                                          # [B, 1, V_target]
            draft_target_ids.append(chosen)
            previous = chosen
        probs = None if sampling is None else torch.cat(draft_probs, dim=1)
        return Proposal(torch.cat(draft_target_ids, dim=1), probs)
