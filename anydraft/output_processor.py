"""The output processor: each request's new target ids -> its text, incrementally, with stop strings held back.

Text comes from the tokens' bytes through an incremental UTF-8 decoder, so the output is never re-decoded
per token, and a character split across tokens (byte-level BPE pieces that are partial UTF-8) appears only
once its last byte has arrived. Text that may still turn into a stop string is held back until decided, so a
stream never shows a stop string or text past it. Special tokens (EOS...) add no text, as
`decode(skip_special_tokens=True)` does. The result is the continuation's own bytes: a SentencePiece
continuation keeps its leading space (as vLLM's completions do), where decoding the output alone drops it.
"""
from __future__ import annotations

import codecs
import sys
from dataclasses import dataclass, field

from .tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Target ids -> text one token at a time; incomplete UTF-8 at the end is held until it completes."""

    def __init__(self, token_bytes: list[bytes | None], skip_ids: frozenset[int]):
        self._token_bytes, self._skip_ids = token_bytes, skip_ids
        # errors="replace": invalid bytes become U+FFFD, as the tokenizers library's decode does.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, target_id: int) -> str:
        return self.add_many([target_id])

    def add_many(self, target_ids: list[int]) -> str:
        """The text of several tokens in one decode (UTF-8 decoding is the same over any split of the bytes); special
        tokens and ids past the table add none."""
        table, skip, size = self._token_bytes, self._skip_ids, len(self._token_bytes)
        return self._decoder.decode(b"".join(table[t] or b"" for t in target_ids if t not in skip and t < size))

    def flush(self) -> str:
        """The output ended: bytes of an unfinished character become U+FFFD."""
        return self._decoder.decode(b"", final=True)


@dataclass
class TextState:
    """One request's output state: `text` is decided (safe to stream); `held` may still begin a stop string;
    `tokens_left` is how many more tokens max_tokens and max_model_len allow. Without stop strings the ids of a step
    wait in `unread_ids` and are decoded when `text` is next read (nothing in the text can end the output)."""
    detokenizer: IncrementalDetokenizer
    stops: list[str]
    tokens_left: int = sys.maxsize
    decided: str = ""
    held: str = ""
    sent_chars: int = 0           # how much of `text` and of the output ids `take_delta` has handed out
    sent_tokens: int = 0
    stopped_by: str | None = None  # the stop string found
    unread_ids: list[int] = field(default_factory=list)
    max_stop_chars: int = field(init=False)

    def __post_init__(self):
        self.max_stop_chars = max((len(s) for s in self.stops), default=0)

    @property
    def text(self) -> str:
        self.catch_up()
        return self.decided

    def catch_up(self) -> None:
        """Decode the ids waiting in unread_ids (before any later token's bytes reach the detokenizer)."""
        if self.unread_ids:
            target_ids, self.unread_ids = self.unread_ids, []
            self.feed(self.detokenizer.add_many(target_ids))

    def feed(self, new_text: str) -> bool:
        """Add decoded text; True when a stop string completed (the text is then cut before it)."""
        pending = self.held + new_text
        if not self.stops:
            self.decided, self.held = self.decided + pending, ""
            return False
        # `held` is the longest suffix that begins some stop string, so a stop string ending in the new
        # text starts inside `pending`: searching it is enough.
        found = [(at, stop) for at, stop in ((pending.find(stop), stop) for stop in self.stops) if at >= 0]
        if found:
            at, self.stopped_by = min(found)
            self.decided, self.held = self.decided + pending[:at], ""
            return True
        keep = next((n for n in range(min(len(pending), self.max_stop_chars - 1), 0, -1)
                     if any(stop.startswith(pending[-n:]) for stop in self.stops)), 0)
        self.decided, self.held = self.decided + pending[:len(pending) - keep], pending[len(pending) - keep:]
        return False

    def close(self) -> bool:
        """The output ended without a stop string so far: decide what was held. True if the final bytes
        complete a stop string after all."""
        self.catch_up()
        stopped = self.feed(self.detokenizer.flush())
        self.decided, self.held = self.decided + self.held, ""
        return stopped


class OutputProcessor:
    """Appends target ids to requests, decides finish reasons (EOS, length, stop string) and makes text."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int):
        self.token_bytes = tokenizer.token_table.token_bytes
        self.skip_ids = frozenset(tokenizer.special_ids)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.max_model_len = max_model_len

    def start(self, params, num_prompt_tokens: int) -> TextState:
        return TextState(IncrementalDetokenizer(self.token_bytes, self.skip_ids), list(params.stop),
                         min(params.max_tokens, self.max_model_len - num_prompt_tokens))

    def extend_rows(self, requests: list, new_target_ids: list[list[int]],
                    new_logprobs: dict[int, list] | None = None) -> tuple[list[int], list]:
        """A step's new tokens for each request (as extend); returns how many each kept and the requests that ended.
        A row without stop strings, EOS among its tokens or the end of its room costs no call: its ids are appended
        and their text decoded when next read. The rest (a few rows a step) go through extend. So the step's host
        work here is a constant number of calls, not a few per row.
        new_logprobs: row index -> one logprob entry per new token, for the requests that asked for them; each keeps
        the entries of the tokens it kept."""
        eos = self.eos_ids
        with_eos = {i for i, target_ids in enumerate(new_target_ids) for t in target_ids if t in eos}
        kept, ended = [*map(len, new_target_ids)], []
        for i, (request, target_ids) in enumerate(zip(requests, new_target_ids)):
            state = request.text_state
            if state.stops or i in with_eos or kept[i] >= state.tokens_left:
                kept[i] = self.extend(request, target_ids)
                if request.finish_reason is not None:
                    ended.append(request)
                continue
            request.output_target_ids += target_ids
            state.unread_ids += target_ids
            state.tokens_left -= kept[i]
        for i, entries in (new_logprobs or {}).items():
            requests[i].logprobs += entries[:kept[i]]
        return kept, ended

    def extend(self, request, target_ids: list[int]) -> int:
        """A step's new tokens, in order, up to the one that ends the request (EOS, max_tokens or max_model_len,
        a stop string; a stop string also finishes on the token where it completes); returns how many were kept
        and sets request.finish_reason when one ends it. Without stop strings the tokens' text is decoded in one
        call: the step's host work is a few calls per row, not per token."""
        output, params, state = request.output_target_ids, request.params, request.text_state
        state.catch_up()
        room = state.tokens_left
        kept = target_ids[:room]
        eos_at = None if params.ignore_eos else next((i for i, t in enumerate(kept) if t in self.eos_ids), None)
        if eos_at is not None:
            kept = kept[:eos_at + 1]
        if state.stops:   # which token completes a stop string decides where the output ends
            stopped = next((n for n, t in enumerate(kept, 1) if state.feed(state.detokenizer.add(t))), None)
            if stopped is not None:
                kept = kept[:stopped]
        else:   # no stop string: the text cannot end the output
            state.feed(state.detokenizer.add_many(kept))
            stopped = None
        output.extend(kept)
        state.tokens_left -= len(kept)
        if stopped is None:
            if eos_at is not None:
                request.finish_reason, request.stop_reason = "stop", kept[-1]
            elif len(kept) == room:
                request.finish_reason = "length"
        if stopped is not None or (request.finish_reason is not None and state.close()):
            request.finish_reason, request.stop_reason = "stop", state.stopped_by
        return len(kept)

    @staticmethod
    def take_delta(request) -> tuple[str, list[int], list | None]:
        """Decided text, output ids and their logprob entries (None where not asked for) not handed out before
        (what a stream sends next)."""
        state = request.text_state
        sent = state.sent_tokens
        text, target_ids = state.text[state.sent_chars:], request.output_target_ids[sent:]
        logprobs = None if request.logprobs is None else request.logprobs[sent:]
        state.sent_chars, state.sent_tokens = len(state.text), len(request.output_target_ids)
        return text, target_ids, logprobs
