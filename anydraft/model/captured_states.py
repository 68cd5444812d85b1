"""What one target forward captured for a hidden-state draft: the residual stream at the draft's layers.

ModelRunner.capture_hidden_states turns capturing on; each forward then keeps one CapturedStates until
ModelRunner.take_hidden_states hands them over, and the engine passes them to the next proposal
(Proposer.propose's target_states).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CapturedStates:
    rows: list[int]              # the cache rows of the forward, in batch order
    states: torch.Tensor         # [B, S, len(layers) * hidden], right-padded where a row has fewer new tokens
    num_new: list[int] | int     # real new tokens per row (an int: every row has S)
    starts: list[int]            # the cache position of each row's first new token (0: a new sequence)

    def counts(self) -> list[int]:
        """Real new tokens of each row."""
        return [self.num_new] * len(self.rows) if isinstance(self.num_new, int) else list(self.num_new)
