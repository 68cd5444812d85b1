"""Which draft state serves which row of vLLM's persistent batch, decided by token history alone.

vLLM hands a proposer per-row histories (`token_ids_cpu[row, :num_tokens_no_spec[row]]`) and nothing else:
no request ids, no add/remove callbacks; rows are reused by new requests, moved when the batch is condensed
or reordered, and a preempted request comes back later in any row. So a draft state is keyed by the target
ids it has seen: a row may use a state only if the row's history *extends* the state's history (equal
prefix, compared in full). The draft state is a function of the text so far, so such a state is right for
the row whoever owned it before (a new chat turn that extends a finished one reuses its draft cache).

Per call, in order: each row first tries the state it had at the last call (a hint, checked like any other);
rows left over take the longest unclaimed state their history extends; rows still without one get a free
slot or evict the least recently used unclaimed state. A state serves at most one row per call. Rows beyond
the slots get no state (they are not drafted). States of finished requests stay until evicted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SlotState:
    slot: int                                          # draft KV cache row
    history: np.ndarray                                # [n] target ids the draft state has taken in
    proposal: list[int] = field(default_factory=list)  # target ids proposed at its last call (may sit in the cache)
    last_used: int = 0                                 # call number (LRU order)


@dataclass(frozen=True)
class Claim:
    row: int
    slot: int | None      # None: no slot left for this row
    fresh: bool = False   # a new state: build it from the whole history


def extends(history: np.ndarray, state_history: np.ndarray) -> bool:
    """Whether `history` starts with all of `state_history` (a row may then use that state)."""
    n = len(state_history)
    return n <= len(history) and np.array_equal(history[:n], state_history)


class RequestStates:
    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.free_slots = list(range(num_slots))[::-1]
        self.states: dict[int, SlotState] = {}   # slot -> state
        self.row_hint: dict[int, int] = {}        # vLLM row -> slot it used at the last call (checked before use)
        self.calls = 0

    def match(self, rows: list[int], histories: list[np.ndarray]) -> tuple[list[Claim], list[int]]:
        """One claim per row (same order) and the slots evicted to make room (their old state is gone)."""
        self.calls += 1
        claims: dict[int, Claim] = {}
        claimed: set[int] = set()
        for row, history in zip(rows, histories):
            slot = self.row_hint.get(row)
            if slot in self.states and slot not in claimed and extends(history, self.states[slot].history):
                claims[row] = Claim(row, slot)
                claimed.add(slot)
        for row, history in zip(rows, histories):
            if row in claims:
                continue
            candidates = [s for s in self.states.values() if s.slot not in claimed and extends(history, s.history)]
            if candidates:
                best = max(candidates, key=lambda s: (len(s.history), s.last_used))
                claims[row] = Claim(row, best.slot)
                claimed.add(best.slot)
        evicted: list[int] = []
        for row, history in zip(rows, histories):
            if row in claims:
                continue
            slot = self._free_slot(claimed, evicted)
            if slot is not None:
                self.states[slot] = SlotState(slot, history[:0].copy())
                claimed.add(slot)
            claims[row] = Claim(row, slot, fresh=slot is not None)
        self.row_hint = {row: c.slot for row, c in claims.items() if c.slot is not None}
        for slot in claimed:
            self.states[slot].last_used = self.calls
        return [claims[row] for row in rows], evicted

    def _free_slot(self, claimed: set[int], evicted: list[int]) -> int | None:
        if self.free_slots:
            return self.free_slots.pop()
        idle = [s for s in self.states.values() if s.slot not in claimed]
        if not idle:
            return None
        oldest = min(idle, key=lambda s: s.last_used)
        del self.states[oldest.slot]
        evicted.append(oldest.slot)
        return oldest.slot

    def record(self, slot: int, history: np.ndarray, proposal: list[int]) -> None:
        """The state of `slot` has now taken in `history` and proposed `proposal` after it."""
        state = self.states[slot]
        state.history, state.proposal = history.copy(), proposal
