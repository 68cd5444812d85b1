"""Finished replies as the ids the model generated: a prompt that repeats one is given those ids.

A chat client sends the conversation back as text, and the target tokenizer's encoding of a reply need not be the
ids the model generated (a model may write `####` in other pieces than the tokenizer reads it). The prefix cache
holds the generated ids, so from the first such difference the next turn misses it and prefills the previous reply
again. A prompt that begins with the exact text of a finished request (its prompt text, then its whole reply) is
given that request's ids for that part, the ids the model itself read and wrote, as a stateful chat API keeps
them, and only the text after it is encoded. The reply's KV is then a prefix-cache hit.

The ids differ from the re-encoded text's only where the model wrote text in other pieces than the tokenizer
would; the target alone served the same way reads the same ids, so speculation stays lossless
(`--no-reuse-reply-ids` encodes every prompt afresh). Entries are kept least recently used first, at most as many
tokens as the target's KV pool holds: a reply the pool has evicted is no use.
"""
from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..request import Request

@dataclass
class _Prompt:
    add_special_tokens: bool   # how the text was encoded: a completion's prompt gets BOS, a chat's template has it
    text: str
    target_ids: list[int]


class ReplyMemory:
    """(how encoded, text of prompt + reply) -> its target ids. `watching` the requests of a call made from a text
    prompt; `remember` each when it ends (from the engine thread); `encode` a later prompt (from the server's)."""

    def __init__(self, tokenizer, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"a reply memory needs room for at least one token, got max_tokens={max_tokens}")
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self._token_bytes = tokenizer.token_table.token_bytes   # built here, not on the engine thread's first call
        self._entries: OrderedDict[tuple[bool, str], array] = OrderedDict()   # least recently used first
        self._num_tokens = 0
        self._watched: dict[int, _Prompt] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], int]:
        """Target ids of a prompt, and how many of them are a remembered request's: its ids for the longest
        remembered text the prompt begins with, then the rest encoded as text continuing it."""
        with self._lock:
            best = max((key for key in self._entries if key[0] == add_special_tokens and text.startswith(key[1])),
                       key=lambda key: len(key[1]), default=None)
            if best is not None:
                self._entries.move_to_end(best)
                known_ids = self._entries[best].tolist()
        if best is None:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens), 0
        rest = text[len(best[1]):]
        return known_ids + (self.tokenizer.encode_continuation(rest) if rest else []), len(known_ids)

    async def watching(self, requests: list[Request], add_special_tokens: bool,
                       deltas: AsyncIterator) -> AsyncIterator:
        """The deltas of these requests, remembering each when it ends: watched when the stream starts, which is
        when they are queued (a response never started queues nothing, and leaves nothing here)."""
        with self._lock:
            for request in requests:
                self._watched[request.request_id] = _Prompt(add_special_tokens, request.prompt,
                                                            list(request.prompt_target_ids))
        try:
            async for delta in deltas:
                yield delta
        finally:   # a client that leaves closes this generator: close the engine's stream now, which aborts
            await deltas.aclose()

    def remember(self, request: Request) -> None:
        """A request ended: keep its prompt and reply if it finished whole and its ids spell exactly that text."""
        with self._lock:
            prompt = self._watched.pop(request.request_id, None)
        if prompt is None or request.finish_reason not in ("stop", "length"):
            return
        reply_ids = list(request.output_target_ids)
        if reply_ids and isinstance(request.stop_reason, int) and reply_ids[-1] == request.stop_reason:
            reply_ids.pop()   # the stop token is not in the text; the template writes it after the reply
        # The reply's bytes must be the text's: not so for a reply a stop string cut, one ending inside a UTF-8
        # character (the text shows U+FFFD), or one holding a special token (the text leaves it out).
        table = self._token_bytes
        if any(i >= len(table) or table[i] is None for i in reply_ids) or \
                b"".join(table[i] for i in reply_ids) != request.text.encode("utf-8", "surrogatepass"):
            return
        target_ids = array("l", prompt.target_ids + reply_ids)
        if len(target_ids) > self.max_tokens:
            return
        with self._lock:
            key = (prompt.add_special_tokens, prompt.text + request.text)
            old = self._entries.pop(key, None)
            self._num_tokens += len(target_ids) - (len(old) if old is not None else 0)
            self._entries[key] = target_ids
            while self._num_tokens > self.max_tokens:
                self._num_tokens -= len(self._entries.popitem(last=False)[1])
