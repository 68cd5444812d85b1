"""How a draft's vocabulary relates to the target's: head rows -> target ids, and keeping the draft's text in sync.

Three kinds, one shape: `head_to_target` maps a draft output row to a target id (None = identity), and
`sync` turns appended target ids into the draft's own input ids.
- identity: same tokenizer, no table; the draft reads target ids. With a frequency-ranked head
  (vocab/frequency.py) the table lists the kept rows, which are target ids.
- d2t: same tokenizer, reduced head; target_id = head_row + d2t[head_row]; the draft reads target ids.
- tli: other tokenizer; the head is pruned to the intersection (or its most frequent part); the draft
  reads its own ids, re-synced.
- slem: other tokenizer, the draft writes its own ids (the target re-tokenizes their text, slem_proposer.py), so
  the table maps a head row to a *draft* id: None for the whole head, the kept ids for a frequency-ranked one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .proposer import Proposal


@dataclass
class SharedState:
    draft_ids: list[int] = field(default_factory=list)


class ContextSync(Protocol):
    def start(self, prompt_text: str, prompt_target_ids: list[int]): ...
    def extend(self, state, target_ids: list[int]) -> int:
        """Append target tokens to state.draft_ids; returns how many trailing draft ids were dropped first."""
    def append_direct(self, states: list, target_id_lists: list[list[int]]) -> list[bool]:
        """`extend` for each row where it would only append (a few calls for all rows); returns which rows it
        extended: the others need `extend`."""
    def draft_id_of(self, target_id: int) -> int:
        """Draft input id of a token the draft itself proposed (always in the intersection)."""


class SharedVocabSync:
    """Draft and target share a tokenizer: the draft sequence is the target sequence."""

    def start(self, prompt_text, prompt_target_ids):
        return SharedState(list(prompt_target_ids))

    def extend(self, state, target_ids):
        state.draft_ids.extend(target_ids)
        return 0

    def append_direct(self, states, target_id_lists):
        for state, target_ids in zip(states, target_id_lists):
            state.draft_ids += target_ids
        return [True] * len(states)

    def draft_id_of(self, target_id):
        return target_id


class ResyncContextSync:
    """Other tokenizer: the draft re-tokenizes the text the target wrote (the bridge's re-sync)."""

    def __init__(self, resync, target_to_draft: list[int]):
        self.resync = resync
        self.target_to_draft = target_to_draft   # host list: one lookup per accepted token, no device sync

    def start(self, prompt_text, prompt_target_ids):
        return self.resync.new_state(prompt_text)

    def extend(self, state, target_ids):
        return self.resync.extend(state, target_ids).num_dropped

    def append_direct(self, states, target_id_lists):
        return self.resync.append_direct(states, target_id_lists)

    def draft_id_of(self, target_id):
        return self.target_to_draft[target_id]


@dataclass
class DraftVocab:
    kind: str                                   # "identity" | "d2t" | "tli" | "slem" (ids are the draft's)
    head_to_target: torch.Tensor | None         # [N_head] target id of each draft output row; None = identity
    head_to_draft_input: torch.Tensor | None    # [N_head] id fed back to the draft for a proposal; None = same row
    target_vocab_rows: int
    sync: ContextSync

    def to_target(self, head_rows: torch.Tensor) -> torch.Tensor:
        """[B, ...] draft head rows -> target ids."""
        return head_rows if self.head_to_target is None else self.head_to_target[head_rows]

    def to_draft_input(self, head_rows: torch.Tensor) -> torch.Tensor:
        return head_rows if self.head_to_draft_input is None else self.head_to_draft_input[head_rows]

    def proposal(self, head_rows: torch.Tensor,             # [B, k] drawn head rows
                 head_probs: torch.Tensor | None,          # [B, k, N_head] q over the head; None = greedy
                 ) -> Proposal:
        """Proposals in target ids with q kept over the head's rows where a table maps them (TLI, d2t, a
        frequency-ranked head): verification subtracts it from p only where it lives."""
        draft_target_ids = self.to_target(head_rows)
        if head_probs is None or self.head_to_target is None:
            probs = None if head_probs is None else self.scatter_probs(head_probs)
            return Proposal(draft_target_ids, probs)
        return Proposal(draft_target_ids, head_probs, head_rows, self.head_to_target)

    def scatter_probs(self, head_probs: torch.Tensor) -> torch.Tensor:
        """[B, k, N_head] draft probabilities -> [B, k, V_target_rows] (zero outside the draft's reach)."""
        if self.head_to_target is None:
            n = head_probs.shape[-1]
            if n == self.target_vocab_rows:
                return head_probs
            if n > self.target_vocab_rows:
                return head_probs[..., :self.target_vocab_rows]
            return torch.nn.functional.pad(head_probs, (0, self.target_vocab_rows - n))
        out = head_probs.new_zeros(*head_probs.shape[:-1], self.target_vocab_rows)
        return out.scatter_(-1, self.head_to_target.expand_as(head_probs), head_probs)
