"""What generate returns, shaped like vLLM's RequestOutput / CompletionOutput, so code written for vLLM reads it.

Logprobs as vLLM gives them: per token a dict {token id: Logprob(logprob, rank, decoded_token)} holding the chosen
token and the top-n alternatives asked for (the chosen one may be among them); the values are the target's raw
logprobs (spec_decode/logprobs.py). Prompt logprobs: one such dict per prompt token, None for the first.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None          # 1 = the most likely token; for alternatives, their place in the top-n
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]          # target ids of the completion
    finish_reason: str | None     # "stop" | "length" | "abort"
    stop_reason: str | int | None = None   # the stop string or EOS id that ended it, as vLLM reports
    logprobs: list[dict[int, Logprob]] | None = None   # per output token, where SamplingParams.logprobs asks


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: dict = field(default_factory=dict)   # speculative stats of this request (metrics.SpecStats.to_dict)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None   # where SamplingParams.prompt_logprobs asks


def token_text(tokenizer, token_id: int) -> str:
    """A token's own text (its bytes as UTF-8, a partial character as U+FFFD; a special token its content)."""
    try:
        return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
    except (ValueError, AttributeError):
        return tokenizer.decode([token_id], skip_special_tokens=False)


def logprob_dicts(entries: list, token_ids: list[int], tokenizer) -> list[dict[int, Logprob] | None]:
    """Request entries (logprob, rank, [(id, logprob)]) of the tokens token_ids -> vLLM's per-token dicts: the
    chosen token first, then the alternatives in order (rank = their place)."""
    out = []
    for entry, token_id in zip(entries, token_ids):
        if entry is None:
            out.append(None)
            continue
        logprob, rank, top = entry
        one = {token_id: Logprob(logprob, rank, token_text(tokenizer, token_id))}
        for place, (alt, alt_logprob) in enumerate(top, 1):
            one.setdefault(alt, Logprob(alt_logprob, place, token_text(tokenizer, alt)))
        out.append(one)
    return out
