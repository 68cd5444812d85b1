"""Logprob entries (the engine's (logprob, rank, [(id, logprob)]) per token) in OpenAI's two wire shapes.

Completions (the legacy shape): {tokens, token_logprobs, top_logprobs, text_offset}, top_logprobs a dict token text
-> logprob holding the chosen token and its alternatives; a prompt's first token (echo) has None for both, as vLLM
gives. Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, the alternatives
largest first. The values are the target's raw logprobs (spec_decode/logprobs.py).
"""
from __future__ import annotations

from ..outputs import token_text


def _bytes(tokenizer, token_id: int, text: str) -> list[int]:
    try:
        return list(tokenizer.token_bytes(token_id))
    except (ValueError, AttributeError):
        return list(text.encode("utf-8"))


class CompletionLogprobs:
    """One choice's completions logprobs, built delta by delta (text_offset runs on over the choice's text)."""

    def __init__(self, tokenizer, offset: int = 0):
        self.tokenizer, self.offset = tokenizer, offset

    def part(self, entries: list, token_ids: list[int]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry, token_id in zip(entries, token_ids):
            text = token_text(self.tokenizer, token_id)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            logprob, _, top = entry
            out["token_logprobs"].append(logprob)
            tops = {text: logprob}
            for alt, alt_logprob in top:
                tops.setdefault(token_text(self.tokenizer, alt), alt_logprob)
            out["top_logprobs"].append(tops)
        return out

    @staticmethod
    def join(parts: list[dict]) -> dict:
        return {key: [v for part in parts for v in part[key]] for key in
                ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_logprobs(tokenizer, entries: list, token_ids: list[int]) -> list[dict]:
    """The chat `content` list of these tokens."""
    content = []
    for (logprob, _, top), token_id in zip(entries, token_ids):
        text = token_text(tokenizer, token_id)
        alternatives = []
        for alt, alt_logprob in top:
            alt_text = token_text(tokenizer, alt)
            alternatives.append({"token": alt_text, "logprob": alt_logprob, "bytes": _bytes(tokenizer, alt, alt_text)})
        content.append({"token": text, "logprob": logprob, "bytes": _bytes(tokenizer, token_id, text),
                        "top_logprobs": alternatives})
    return content
