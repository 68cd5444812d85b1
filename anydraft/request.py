"""A request: its prompt, sampling settings, output so far, and where it stands in the cache (row, prefill)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .config import SamplingParams
from .metrics import SpecStats
from .output_processor import TextState
from .spec_decode.sampling import RowRandom

# One token's logprob entry: (its logprob, its rank, [(id, logprob)] of the top alternatives, largest first).
TokenLogprob = tuple[float, int, list[tuple[int, float]]]


@dataclass(eq=False)
class Request:
    request_id: int
    prompt: str
    prompt_target_ids: list[int]
    params: SamplingParams
    random: RowRandom
    stats: SpecStats
    text_state: TextState
    output_target_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None   # the stop string or EOS id that finished it
    row: int | None = None
    num_prefilled: int = 0       # tokens of prefill_target_ids in the target cache (a long prompt takes several steps)
    # Set when the request was preempted after some output: the cache must hold prompt + output[:-1] again
    # (re-prefilled, mostly from the prefix cache) before it decodes on from output[-1].
    resume_target_ids: list[int] | None = None
    num_preemptions: int = 0
    output_budget: int = 0       # the most output tokens it may write: max_tokens, within max_model_len
    arrival: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    first_token_at: float = 0.0  # when the prompt's forward gave the first token (decode time is after it)
    # Where the params ask for them: one entry per output token (cut with the tokens), and per prompt token (None
    # for the first, which nothing predicts), filled chunk by chunk as the prompt is prefilled.
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def __post_init__(self):
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """The completion's decided text (all of it once finished; cut before a stop string)."""
        return self.text_state.text

    @property
    def prefill_target_ids(self) -> list[int]:
        """What the target cache must hold before the request decodes."""
        return self.prompt_target_ids if self.resume_target_ids is None else self.resume_target_ids

    @property
    def resuming(self) -> bool:
        return self.resume_target_ids is not None

    def resume_from_output(self) -> None:
        """The request lost its row: it goes back in line keeping its output, to re-prefill and decode on."""
        self.resume_target_ids = (self.prompt_target_ids + self.output_target_ids[:-1]
                                  if self.output_target_ids else None)
        self.row, self.num_prefilled = None, 0
        self.num_preemptions += 1
