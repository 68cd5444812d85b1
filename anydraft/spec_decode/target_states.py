"""Per row, the target hidden states a hidden-state draft has not read yet, kept at the verified positions.

The target hands over the states of every position it reads (ModelRunner.hand_hidden_states_to): the prompt's,
then [last verified token, k drafts] at each step. When `extend` learns how many drafts were accepted (host
ints the step already has), the states of the rejected ones are dropped. No device sync: only host counts.

Invariant after `extend`: with n target tokens x_0..x_{n-1}, the log holds the states of x_m..x_{n-2} (the
target has read all but the newest token) and the ids x_{m+1}..x_{n-1}, where m = `consumed`. So the i-th
held state and the i-th held id form the draft's entry m+1+i, the pairing EAGLE-3 trains on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RowStates:
    chunks: list[torch.Tensor] = field(default_factory=list)   # each [S_i, W], in position order
    num_states: int = 0          # rows across chunks
    consumed: int = 0            # m: states already read by the draft (and dropped here)
    target_ids: list[int] = field(default_factory=list)        # x_{m+1}..x_{n-1}
    num_target_ids: int = 0      # n
    started: bool = False
    last_target_id: int = -1


class TargetStateLog:
    def __init__(self):
        self.rows: dict[int, RowStates] = {}

    def receive(self, rows: list[int], states: torch.Tensor, num_new: list[int] | int, starts: list[int]) -> None:
        """states [B, S, W] of a target forward over S new tokens of each row (num_new[b] real ones), the first
        at cache position starts[b]. Position 0 starts a new sequence (a prompt's first chunk comes before
        add_request); any other start must continue what the log holds."""
        counts = [num_new] * len(rows) if isinstance(num_new, int) else num_new
        for b, (row, count, start) in enumerate(zip(rows, counts, starts)):
            if start == 0:
                self.rows[row] = RowStates()
            log = self.rows.get(row)
            if log is None or start != log.consumed + log.num_states:
                held = None if log is None else log.consumed + log.num_states
                raise RuntimeError(f"row {row}: target states from position {start}, but the log ends at {held}")
            log.chunks.append(states[b, :count])
            log.num_states += count

    def start(self, row: int, prompt_target_ids: list[int]) -> None:
        log = self.rows.get(row)
        if log is None or log.num_states != len(prompt_target_ids):
            have = 0 if log is None else log.num_states
            raise RuntimeError(f"row {row}: the target handed over {have} hidden states for a prompt of "
                               f"{len(prompt_target_ids)} tokens; is the target runner wired to this proposer "
                               f"(ModelRunner.hand_hidden_states_to)?")
        log.target_ids = list(prompt_target_ids[1:])
        log.last_target_id = prompt_target_ids[-1]
        log.num_target_ids = len(prompt_target_ids)
        log.started = True

    def extend(self, row: int, new_target_ids: list[int]) -> None:
        """The target sequence grew by these ids; drop the states of positions the target has rewound."""
        log = self.rows[row]
        log.target_ids.extend(new_target_ids)
        log.last_target_id = log.target_ids[-1]
        log.num_target_ids += len(new_target_ids)
        excess = log.consumed + log.num_states - (log.num_target_ids - 1)
        if excess < 0:
            raise RuntimeError(f"row {row}: {-excess} target hidden states missing")
        while excess:
            last = log.chunks[-1]
            cut = min(excess, len(last))
            log.chunks[-1] = last[:len(last) - cut]
            if len(log.chunks[-1]) == 0:
                log.chunks.pop()
            log.num_states -= cut
            excess -= cut

    def take(self, row: int) -> tuple[list[int], torch.Tensor]:
        """(ids x_{m+1}..x_{n-1}, states of x_m..x_{n-2} [n-1-m, W]); the draft has read them after this."""
        log = self.rows[row]
        states = log.chunks[0] if len(log.chunks) == 1 else torch.cat(log.chunks)
        target_ids = log.target_ids
        log.consumed += log.num_states
        log.chunks, log.num_states, log.target_ids = [], 0, []
        return target_ids, states

    def last_target_id(self, row: int) -> int:
        """x_{n-1}, the newest target token (kept after `take`)."""
        return self.rows[row].last_target_id

    def remove(self, row: int) -> None:
        self.rows.pop(row, None)
