"""A stand-in for vLLM 0.32's V1 model runner as a custom_class proposer sees it, without vLLM.

It reproduces the call sequence of `GPUModelRunner` (and the CPU runner built on it) for method
"custom_class": a persistent batch (`InputBatch`) whose rows are filled by admissions at the first free row,
emptied when a request finishes or is preempted (stale tokens stay in `token_ids_cpu`, as in vLLM), closed up
by `condense` (the last rows move into the holes) and reordered by swaps; after each step's bookkeeping the
sampled tokens are written into `token_ids_cpu` and `num_tokens_no_spec`, then
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)` is called with an empty
list for rows that sampled nothing (a prefill chunk). A preempted request comes back with its prompt and
output so far as its tokens, recomputed, and samples again.

Verification is greedy against each request's reference output (the target alone's), so the tokens a row
appends are exactly what vLLM would append: the accepted prefix of the proposals, then the target's token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class FakeRequest:
    name: str
    prompt_ids: list[int]
    reference_ids: list[int]           # the target alone's greedy output
    prefill_chunks: int = 1            # > 1: the first chunks sample nothing (chunked prefill)
    output_ids: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    chunks_left: int = 0
    num_drafted: int = 0
    num_accepted: int = 0

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= len(self.reference_ids)


class PersistentBatch:
    """vLLM's InputBatch, reduced to what a custom_class proposer is given."""

    def __init__(self, max_rows: int, max_len: int):
        self.token_ids_cpu = np.zeros((max_rows, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_rows, dtype=np.int32)
        self.requests: list[FakeRequest | None] = [None] * max_rows

    @property
    def num_rows(self) -> int:
        return max((i + 1 for i, r in enumerate(self.requests) if r is not None), default=0)

    def add(self, request: FakeRequest) -> int:
        row = self.requests.index(None)
        token_ids = request.prompt_ids + request.output_ids
        self.token_ids_cpu[row, :len(token_ids)] = token_ids
        self.num_tokens_no_spec[row] = len(token_ids)
        self.requests[row] = request
        return row

    def remove(self, request: FakeRequest) -> None:
        self.requests[self.requests.index(request)] = None   # its tokens stay behind, as in vLLM

    def condense(self) -> None:
        """Move the last requests into the holes, lowest hole first (InputBatch.condense)."""
        while None in self.requests[:self.num_rows]:
            hole, last = self.requests.index(None), self.num_rows - 1
            self.swap(hole, last)

    def swap(self, i: int, j: int) -> None:
        self.token_ids_cpu[[i, j]] = self.token_ids_cpu[[j, i]]
        self.num_tokens_no_spec[[i, j]] = self.num_tokens_no_spec[[j, i]]
        self.requests[i], self.requests[j] = self.requests[j], self.requests[i]


class FakeVLLM:
    def __init__(self, proposer, max_rows: int, max_len: int, k: int, check=None, keywords: dict | None = None):
        """keywords: what vLLM passes by name besides the three arrays ({"slot_mappings": ...} for AnydraftProposer)."""
        self.proposer, self.k, self.check = proposer, k, check
        self.keywords = keywords or {}
        self.batch = PersistentBatch(max_rows, max_len)
        self.calls = 0

    def admit(self, request: FakeRequest) -> int:
        """A new or resumed request: its tokens are (re)computed, it samples at its last prefill chunk."""
        request.drafts, request.chunks_left = [], request.prefill_chunks
        return self.batch.add(request)

    def preempt(self, request: FakeRequest) -> None:
        self.batch.remove(request)
        request.drafts = []                                  # scheduled drafts of a preempted request are dropped

    def step(self) -> list[FakeRequest]:
        """One forward + bookkeeping + propose; returns the requests that finished (already removed)."""
        batch = self.batch
        sampled: list[list[int]] = []
        for row in range(batch.num_rows):
            request = batch.requests[row]
            new_ids: list[int] = []
            if request is not None and request.chunks_left > 1:
                request.chunks_left -= 1                     # a prefill chunk: nothing sampled
            elif request is not None:
                request.chunks_left = 0
                done = len(request.output_ids)
                reference = request.reference_ids[done:]
                accepted, most = 0, min(len(request.drafts), len(reference) - 1)
                while accepted < most and request.drafts[accepted] == reference[accepted]:
                    accepted += 1
                request.num_drafted += bool(request.drafts)
                request.num_accepted += accepted
                new_ids = reference[:accepted + 1]
                n = int(batch.num_tokens_no_spec[row])
                batch.token_ids_cpu[row, n:n + len(new_ids)] = new_ids
                batch.num_tokens_no_spec[row] = n + len(new_ids)
                request.output_ids += new_ids
            sampled.append(new_ids)
        drafts = self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu, **self.keywords)
        self.calls += 1
        assert len(drafts) == len(sampled)
        for row, (request, row_drafts) in enumerate(zip(batch.requests, drafts)):
            assert len(row_drafts) <= self.k
            if request is not None:
                request.drafts = list(row_drafts) if sampled[row] else []
        if self.check is not None:
            self.check(self, sampled, drafts)
        finished = [r for r in batch.requests if r is not None and r.finished]
        for request in finished:
            batch.remove(request)
        if finished:
            batch.condense()
        return finished
