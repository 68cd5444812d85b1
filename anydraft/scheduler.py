"""The scheduler: which requests hold cache rows, and what each runs in the next step under a token budget.

A step's target tokens are bounded by `max_num_batched_tokens`: every decoding row costs k+1 (one
verification forward), and what is left goes to prompts, first to those already part-way in, then to waiting
requests that get a free row. A long prompt is thus prefilled in chunks over several steps while the
running requests keep decoding, instead of stalling them for its whole prefill.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class ScheduledStep:
    prefill: list[tuple[object, int]]   # (request, prompt tokens to put in its cache this step)
    decode: list[object]                # requests whose prompt is in the cache: one speculative step each
    completing: list[bool]              # per prefill chunk: it ends its request's prompt (decodes from the next step)


class Scheduler:
    """Waiting queue (first come, first served), a free-row list, and the requests holding rows."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, tokens_per_decode: int):
        if max_num_batched_tokens <= max_num_seqs * tokens_per_decode:
            raise ValueError(f"max_num_batched_tokens {max_num_batched_tokens} leaves no room for prompts once "
                             f"{max_num_seqs} rows decode {tokens_per_decode} tokens each; raise it above "
                             f"{max_num_seqs * tokens_per_decode} or lower max_num_seqs")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.tokens_per_decode = tokens_per_decode
        self.free_rows = list(range(max_num_seqs))[::-1]
        self.waiting: deque = deque()
        self.running: dict[int, object] = {}        # row -> request (prefilling or decoding), in admission order
        self.decoding: set[int] = set()              # the rows of `running` whose prompt is all in the cache

    def add(self, request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """The step's prompt chunks and decoding requests. The prompts whose last chunk is scheduled here decode
        from the next step on. Decoding rows cost no call each (a set lookup), so a step's host work here does not
        grow by calls per row."""
        decoding = self.decoding
        decode = [r for r in self.running.values() if r.row in decoding]
        budget = self.max_num_batched_tokens - len(decode) * self.tokens_per_decode
        prefill = []
        for request in self.running.values():
            if request.row in decoding or budget <= 0:
                continue
            prefill.append((request, min(len(request.prompt_target_ids) - request.num_prefilled, budget)))
            budget -= prefill[-1][1]
        while budget > 0 and self.waiting and self.free_rows:
            request = self.waiting.popleft()
            request.row = self.free_rows.pop()
            self.running[request.row] = request
            prefill.append((request, min(len(request.prompt_target_ids), budget)))
            budget -= prefill[-1][1]
        completing = [request.num_prefilled + n == len(request.prompt_target_ids) for request, n in prefill]
        decoding.update(request.row for (request, _), done in zip(prefill, completing) if done)
        return ScheduledStep(prefill, decode, completing)

    def remove(self, request) -> bool:
        """Take a request out of the queue or its row; True when it held a row (its caches need resetting)."""
        if request in self.waiting:
            self.waiting.remove(request)
            return False
        if request.row is not None and self.running.get(request.row) is request:
            del self.running[request.row]
            self.decoding.discard(request.row)
            self.free_rows.append(request.row)
            return True
        return False
