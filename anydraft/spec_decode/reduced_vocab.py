"""A hidden-state draft's output head against the target vocabulary: d2t offsets, or nothing at all.

Speculators convention: head row i proposes target id i + d2t[i]. Greedy: argmax over the head rows, then
one gather. Sampling: the head logits go into a target-vocabulary buffer filled with -inf once, at load,
through a constant index (only those entries are ever written), so q lives in the target vocabulary and
standard rejection sampling stays exact. A head as wide as the target's vocabulary has no table (None):
then no gather, no scatter, no buffer.
"""
from __future__ import annotations

import torch

from ..tensors import greedy_argmax
from .proposer import SamplingBatch
from .sampling import draw_uniforms, logits_to_probs, sample_from_probs


class ReducedVocab:
    def __init__(self, head_to_target: torch.Tensor | None, target_vocab_rows: int, num_token_rows: int,
                 max_batch: int, device: torch.device, dtype: torch.dtype):
        self.head_to_target = None if head_to_target is None else head_to_target.to(device)   # [N] target ids
        self.target_vocab_rows = target_vocab_rows
        head_target_ids = torch.arange(target_vocab_rows) if head_to_target is None else head_to_target.cpu()
        # Head rows that would propose a padding row (past the tokenizer): -inf in every path, as the target's.
        padding = torch.nonzero(head_target_ids >= num_token_rows).flatten()
        self.padding_head_rows = padding.to(device) if len(padding) else None
        self.logits_buffer = None
        if self.head_to_target is not None:
            self.logits_buffer = torch.full((max_batch, 1, target_vocab_rows), float("-inf"), dtype=dtype,
                                            device=device)   # [B_max, 1, V_target]; written only at head_to_target

    @property
    def size(self) -> int:
        return self.target_vocab_rows if self.head_to_target is None else len(self.head_to_target)

    def mask_padding(self, head_logits: torch.Tensor) -> torch.Tensor:
        if self.padding_head_rows is not None:
            head_logits.index_fill_(-1, self.padding_head_rows, float("-inf"))
        return head_logits

    def to_target(self, head_rows: torch.Tensor) -> torch.Tensor:
        """[...] head rows -> [...] target ids (the same tensor when there is no table)."""
        return head_rows if self.head_to_target is None else self.head_to_target[head_rows]

    def greedy_target_ids(self, head_logits: torch.Tensor) -> torch.Tensor:
        """[B, 1, N] -> [B, 1] target ids: the draft's argmax (lowest row on ties), then d2t."""
        return self.to_target(greedy_argmax(head_logits))

    def target_logits(self, head_logits: torch.Tensor) -> torch.Tensor:
        """[B, 1, N] head logits -> [B, 1, V_target]: -inf outside the head's reach. Without a table, the
        input itself. With one, a view of the load-time buffer, valid until the next call."""
        if self.head_to_target is None:
            return head_logits
        out = self.logits_buffer[:head_logits.shape[0]]
        return out.index_copy_(-1, self.head_to_target, head_logits.to(out.dtype))

    def head_probs(self, target_probs: torch.Tensor) -> torch.Tensor:
        """[B, 1, V_target] -> [B, 1, N]: the same probabilities at the head's rows (a draw over N, not V)."""
        return target_probs if self.head_to_target is None else target_probs.index_select(-1, self.head_to_target)

    def draw(self, head_logits: torch.Tensor,          # [B, 1, N]
             sampling: SamplingBatch | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row as the step's SamplingBatch says: ([B, 1] target ids, None) by argmax when no
        row samples, else a draw from each row's processed distribution and that q, [B, 1, V_target], for
        rejection sampling (top-k / top-p cut in the target vocabulary, as the target's are)."""
        if sampling is None:
            return self.greedy_target_ids(head_logits), None
        target_probs = logits_to_probs(self.target_logits(head_logits), sampling.temperature, sampling.top_k,
                                       sampling.top_p, sampling.any_greedy)                # [B, 1, V_target]
        uniforms = draw_uniforms(sampling.randoms, 1, head_logits.device)                  # [B, 1]
        return self.to_target(sample_from_probs(self.head_probs(target_probs), uniforms)), target_probs
