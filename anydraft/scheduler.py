"""The scheduler: which requests hold cache rows and blocks, and what each runs in the next step.

A step's target tokens are bounded by `max_num_batched_tokens`: every decoding row costs k+1 (one verification
forward), and what is left goes to prompts, first to those already part-way in, then to waiting requests. A long
prompt is thus prefilled in chunks while the running requests keep decoding. Blocks bound it too: decoding rows get
their k+1 slots first; where the pool runs short the newest request is preempted (its blocks freed and published to
the prefix cache, its output kept; it re-prefills later, mostly from that cache). A waiting request is admitted when
a row is free and its first chunk's blocks fit, after taking the longest cached prefix of its prompt; one whose
prompt shares a block that a prefilling request is about to cache waits for it rather than compute it again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .model.kv_cache import BLOCK_TOKENS, KVCache


@dataclass
class ScheduledStep:
    prefill: list[tuple[object, int]]   # (request, tokens of its prefill_target_ids to put in its cache this step)
    decode: list[object]                # requests whose prompt is in the cache: one speculative step each
    completing: list[bool]              # per prefill chunk: it ends its request's prefill (decodes from the next step)
    preempted: list[tuple[object, int]] = field(default_factory=list)   # (request, the row it left): reset those


class Scheduler:
    """Waiting queue (first come, first served), a free-row list, and the requests holding rows."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, tokens_per_decode: int, cache: KVCache):
        if max_num_batched_tokens <= max_num_seqs * tokens_per_decode:
            raise ValueError(f"max_num_batched_tokens {max_num_batched_tokens} leaves no room for prompts once "
                             f"{max_num_seqs} rows decode {tokens_per_decode} tokens each; raise it above "
                             f"{max_num_seqs * tokens_per_decode} or lower max_num_seqs")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.tokens_per_decode = tokens_per_decode
        self.cache = cache
        self.free_rows = list(range(max_num_seqs))[::-1]
        self.waiting: deque = deque()
        self.running: dict[int, object] = {}        # row -> request (prefilling or decoding), in admission order
        self.decoding: set[int] = set()              # the rows of `running` whose prefill is all in the cache
        self.num_preemptions = 0

    def add(self, request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """The step's prefill chunks and decoding requests. The requests whose last chunk is scheduled here decode
        from the next step on. Decoding rows cost no call each (a set lookup, one reserve for all), so a step's host
        work here does not grow by calls per row."""
        preempted: list[tuple[object, int]] = []
        decode = self._reserve_decodes(preempted)
        budget = self.max_num_batched_tokens - len(decode) * self.tokens_per_decode
        prefill = []
        for request in list(self.running.values()):
            if request.row in self.decoding or budget <= 0:
                continue
            n = self._fit_chunk(request, min(len(request.prefill_target_ids) - request.num_prefilled, budget))
            if n:
                prefill.append((request, n))
                budget -= n
        if not decode and not prefill and self.running:   # every row waits for blocks: free the newest one's
            self._preempt(list(self.running.values())[-1], preempted)
        deferred = []
        while budget > 0 and self.waiting and self.free_rows and not preempted:
            if self._awaits_a_prefix(self.waiting[0]):
                deferred.append(self.waiting.popleft())
                continue
            n = self._admit(self.waiting[0], budget)
            if not n:
                break
            prefill.append((self.waiting.popleft(), n))
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        completing = [request.num_prefilled + n == len(request.prefill_target_ids) for request, n in prefill]
        self.decoding.update(request.row for (request, _), done in zip(prefill, completing) if done)
        return ScheduledStep(prefill, decode, completing, preempted)

    def _reserve_decodes(self, preempted: list) -> list:
        """The decoding requests, each with blocks for a verification forward's k+1 tokens; the newest requests
        are preempted while the pool cannot hold that."""
        decoding, lengths, t = self.decoding, self.cache.lengths, self.tokens_per_decode
        decode = [r for r in self.running.values() if r.row in decoding]
        while decode and not self.cache.try_reserve([r.row for r in decode], [lengths[r.row] + t for r in decode]):
            newest = list(self.running.values())[-1]
            self._preempt(newest, preempted)
            if newest in decode:
                decode.remove(newest)
        return decode

    def _fit_chunk(self, request, want: int) -> int:
        """Up to `want` more prefill tokens of a running request, as many as free blocks hold (reserved)."""
        cache, row = self.cache, request.row
        room = (cache.held[row] + cache.pool.num_free) * BLOCK_TOKENS - cache.lengths[row]
        n = min(want, room)
        if n > 0:
            cache.reserve([row], [cache.lengths[row] + n])
        return max(n, 0)

    def _awaits_a_prefix(self, request) -> bool:
        """Whether a prefilling request will cache a full block of this one's prompt that the cache lacks now:
        admitted now it would compute that prefix a second time (a burst of requests with one system prompt), so
        it waits until the block is cached. Requests behind it are admitted meanwhile."""
        if not self.cache.prefix_caching or request.resuming or request.params.prompt_logprobs is not None:
            return False   # a request scoring its prompt reads no cached prefix: nothing to wait for
        wanted = request.prefill_target_ids
        cached = None
        for other in self.running.values():
            if other.row in self.decoding:
                continue
            # Its cached blocks end at `start`; the next full block is shared and would be hit once cached (hits
            # stop before the last prompt token, which is always computed).
            start = other.num_prefilled // BLOCK_TOKENS * BLOCK_TOKENS
            end = start + BLOCK_TOKENS
            if end <= min(len(wanted) - 1, len(other.prefill_target_ids)) and wanted[:end] == other.prefill_target_ids[:end]:
                if cached is None:   # cached already (another request's): no need to wait for this one's
                    cached = len(self.cache.pool.match(wanted, len(wanted) - 1)) * BLOCK_TOKENS
                if cached < end:
                    return True
        return False

    def _admit(self, request, budget: int) -> int:
        """Give the request a row, its cached prefix and blocks for its first chunk; 0 (nothing changed) where that
        chunk does not fit. The last prefill token is always computed: its hidden state gives the first token."""
        row, wanted = self.free_rows[-1], request.prefill_target_ids
        # Prompt logprobs are read off the forward at every prompt position: a cached prefix would skip them.
        scoring = request.params.prompt_logprobs is not None and not request.resuming
        hit = self.cache.attach_prefix(row, wanted, 0 if scoring else len(wanted) - 1, count=False)
        n = min(len(wanted) - hit, budget)
        if not self.cache.try_reserve([row], [hit + n]):
            self.cache.reset(row)
            return 0
        if self.cache.prefix_caching:
            self.cache.pool.count_lookup(len(wanted), hit)
        self.free_rows.pop()
        request.row, request.num_prefilled = row, hit
        self.running[row] = request
        return n

    def _preempt(self, request, preempted: list) -> None:
        row = request.row
        self.publish(request)
        self.cache.reset(row)
        del self.running[row]
        self.decoding.discard(row)
        self.free_rows.append(row)
        request.resume_from_output()
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        preempted.append((request, row))

    def publish(self, request) -> None:
        """Offer the request's cached tokens to later prompts (no-op without prefix caching)."""
        if request.row is not None:
            self.cache.publish(request.row, request.prompt_target_ids + request.output_target_ids)

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
