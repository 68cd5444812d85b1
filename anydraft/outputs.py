"""What generate returns, shaped like vLLM's RequestOutput / CompletionOutput, so code written for vLLM reads it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]          # target ids of the completion
    finish_reason: str | None     # "stop" | "length" | "abort"
    stop_reason: str | int | None = None   # the stop string or EOS id that ended it, as vLLM reports


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: dict = field(default_factory=dict)   # speculative stats of this request (metrics.SpecStats.to_dict)
