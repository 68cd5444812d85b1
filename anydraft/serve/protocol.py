"""The OpenAI wire format: request models (pydantic, validated on arrival) and the error body.

Unknown fields are ignored (as vLLM does), known fields are type-checked: a wrong type is a 400 with the
field's name. Options the engine does not implement (logprobs, penalties, tools...) are refused with a 400
saying so, never silently ignored. `top_k` and `ignore_eos` are vLLM's extensions, accepted here too.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import SamplingParams


class ApiError(Exception):
    """An error the client caused or must hear about, with its HTTP status and OpenAI error type."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 500: "InternalServerError",
             503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "Error"),
                          "param": self.param, "code": self.status}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def refuse_unsupported(self) -> None:
        if self.presence_penalty or self.frequency_penalty or self.logit_bias:
            raise ApiError(400, "presence_penalty, frequency_penalty and logit_bias are not supported by this "
                                "server; leave them out", "presence_penalty")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")

    def sampling_params(self, max_tokens: int, choice: int) -> SamplingParams:
        """Choice i of n samples with seed + i, so n > 1 gives n different samples and a seed reproduces all."""
        seed = None if self.seed is None else self.seed + choice
        try:
            return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
                                  max_tokens=max_tokens, seed=seed, stop=self.stop, ignore_eos=self.ignore_eos)
        except ValueError as e:
            raise ApiError(400, str(e)) from e

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(16, ge=1)      # OpenAI's and vLLM's default for completions
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None:
            raise ApiError(400, "logprobs is not supported by this server; leave it out", "logprobs")
        if self.echo or self.suffix:
            raise ApiError(400, "echo and suffix are not supported by this server; leave them out", "echo")
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, "best_of is not supported (only best_of = n); use n", "best_of")

    def prompt_input(self) -> tuple[str | None, list[int] | None]:
        """(text, None) or, for a prompt of token ids, (None, target ids)."""
        if isinstance(self.prompt, list) and self.prompt and all(isinstance(x, int) for x in self.prompt):
            return None, list(self.prompt)
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise ApiError(400, f"prompt must be one string or one list of token ids (got a list of {len(prompts)}); "
                                f"send one request per prompt, or use n for several completions", "prompt")
        return prompts[0], None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list | None = None
    response_format: dict | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise ApiError(400, "logprobs is not supported by this server; leave it out", "logprobs")
        if self.tools:
            raise ApiError(400, "tools are not supported by this server", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ApiError(400, "response_format other than text is not supported", "response_format")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
