"""Per row, the target hidden states a hidden-state draft has not read yet, kept at the verified positions.

The target captures the states of every position it reads (ModelRunner.capture_hidden_states): the prompt's, then
[last verified token, k drafts] at each step. The engine hands them over with the next proposal (propose's
target_states), after observe told the proposer the ids the target accepted (`start`, `extend`); `receive` then
keeps the states of verified positions only, dropping those of rejected drafts. No device sync: only host counts.

States arrive after the ids, so a row's request may have left since (remove) and its row gone to another request,
whose prompt forward starts at cache position 0. A row's states from before its latest start at 0 belong to an
earlier sequence, and so do the states of a row with no log that do not start one: both are dropped.

Invariant after `receive`, for a row whose request joined, with n target tokens x_0..x_{n-1}: the log holds the
states of x_m..x_{n-2} (the target has read all but the newest token) and the ids x_{m+1}..x_{n-1}, where
m = `consumed`. So the i-th held state and the i-th held id form the draft's entry m+1+i, the pairing EAGLE-3
trains on.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..model.captured_states import CapturedStates


@dataclass
class RowStates:
    chunks: list[torch.Tensor] = field(default_factory=list)   # each [S_i, W], in position order
    num_states: int = 0          # rows across chunks
    consumed: int = 0            # m: states already read by the draft (and dropped here)
    target_ids: list[int] = field(default_factory=list)        # x_{m+1}..x_{n-1}
    num_target_ids: int = 0      # n
    started: bool = False        # the request joined: its ids are known
    last_target_id: int = -1

    @property
    def held_until(self) -> int:
        """The position after the last state held."""
        return self.consumed + self.num_states


class TargetStateLog:
    def __init__(self):
        self.rows: dict[int, RowStates] = {}

    def receive(self, captured: list[CapturedStates], fuse: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The states of the target forwards since the last call, oldest first. `fuse` maps one forward's states
        [B, S, ...] to what the draft keeps [B, S, W]; it runs once per forward that has states to keep."""
        latest_start: dict[int, int] = {}   # row -> its last forward that starts a sequence
        for i, forward in enumerate(captured):
            for row, start in zip(forward.rows, forward.starts):
                if start == 0:
                    latest_start[row] = i
        for i, forward in enumerate(captured):
            fused = None
            for b, (row, count, start) in enumerate(zip(forward.rows, forward.counts(), forward.starts)):
                if i < latest_start.get(row, -1):
                    continue   # an earlier sequence on this row
                log = self.rows.get(row)
                if start == 0:   # the prompt's first forward; its ids may be known already (start)
                    if log is None:
                        log = self.rows[row] = RowStates()
                    log.chunks, log.num_states, log.consumed = [], 0, 0
                elif log is None:
                    continue   # the request left after this forward
                if start != log.held_until:
                    raise RuntimeError(f"row {row}: target states from position {start}, but the log ends at "
                                       f"{log.held_until}")
                if fused is None:
                    fused = fuse(forward.states)
                log.chunks.append(fused[b, :count])
                log.num_states += count
                if log.started:
                    self._drop_rejected(log)

    @staticmethod
    def _drop_rejected(log: RowStates) -> None:
        """Drop the states of positions the target has rewound (past x_{n-2})."""
        excess = log.held_until - (log.num_target_ids - 1)
        while excess > 0:
            last = log.chunks[-1]
            cut = min(excess, len(last))
            log.chunks[-1] = last[:len(last) - cut]
            if len(log.chunks[-1]) == 0:
                log.chunks.pop()
            log.num_states -= cut
            excess -= cut

    def start(self, row: int, prompt_target_ids: list[int]) -> None:
        """A request joined on `row`; its prompt's states come with the next `receive` or came before."""
        log = self.rows.setdefault(row, RowStates())
        log.target_ids = list(prompt_target_ids[1:])
        log.last_target_id = prompt_target_ids[-1]
        log.num_target_ids = len(prompt_target_ids)
        log.started = True

    def extend(self, row: int, new_target_ids: list[int]) -> None:
        """The target sequence grew by these ids (their states come with the next `receive`)."""
        log = self.rows[row]
        log.target_ids.extend(new_target_ids)
        log.last_target_id = log.target_ids[-1]
        log.num_target_ids += len(new_target_ids)

    def unread(self, row: int) -> int:
        """Entries the draft has yet to read on `row` (counted from the ids: their states may be on their way)."""
        log = self.rows[row]
        return log.num_target_ids - 1 - log.consumed

    def reading_groups(self, rows: list[int]) -> list[list[int]]:
        """The rows of `rows` with entries to read, in two groups read apart: those reading their prompt (the draft
        has read nothing of them yet) and the others, so that a joining row's prompt does not pad every row's read
        to its length."""
        unread = [row for row in rows if self.unread(row)]
        prompts = [row for row in unread if not self.rows[row].consumed]
        others = [row for row in unread if self.rows[row].consumed]
        return [group for group in (prompts, others) if group]

    def take(self, row: int) -> tuple[list[int], torch.Tensor]:
        """(ids x_{m+1}..x_{n-1}, states of x_m..x_{n-2} [n-1-m, W]); the draft has read them after this."""
        log = self.rows.get(row)
        if log is None or not log.started or log.held_until != log.num_target_ids - 1 or not log.num_states:
            held = 0 if log is None else log.held_until
            tokens = 0 if log is None else log.num_target_ids
            raise RuntimeError(f"row {row}: the target handed over hidden states up to position {held} for "
                               f"{tokens} target tokens (the draft reads all but the newest token's); hand the "
                               f"proposer the target's captured states with every proposal (propose's target_states, "
                               f"from ModelRunner.take_hidden_states)")
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
