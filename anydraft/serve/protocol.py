"""The OpenAI wire format: request models (pydantic, validated on arrival), the error body, pydantic's errors as one.

Unknown fields are ignored (as vLLM does), known fields are type-checked: a wrong type is a 400 with the
field's name. Every text field must be valid Unicode (a lone UTF-16 surrogate such as "\\udcff" cannot be
tokenized or encoded as UTF-8), every number finite. Options the engine does not implement (suffix, tools,
image parts...) are refused with a 400 saying so, never silently ignored. `top_k`, `ignore_eos` and
`repetition_penalty` are vLLM's extensions, accepted here too; `logit_bias` keys are target token ids. Logprobs: completions' `logprobs` (top-n per token) and
`echo` (the prompt's own logprobs first; max_tokens 0 with echo scores the prompt only), chat's `logprobs` and
`top_logprobs`; each at most 20 alternatives.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import FLOAT32_MAX, MAX_LOGPROBS, MAX_PENALTY, SamplingParams
from ..tokenizer import check_text


class ApiError(Exception):
    """An error the client caused or must hear about, with its HTTP status and OpenAI error type."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowedError",
             500: "InternalServerError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "Error"),
                          "param": self.param, "code": self.status}}


def validation_error(errors: list[dict]) -> ApiError:
    """pydantic's errors as one 400: each as 'field.path: what is wrong', the first one's field as param.

    A union field (prompt: text or token ids) fails once per alternative; its path then names the alternative
    ('prompt.list[int].0'), which is dropped, and the same message is said once. The models' own checks (a
    lone surrogate, an image part) say most: when one fired, the alternatives' type errors are left out."""
    own = [err for err in errors if err.get("type") == "value_error"]
    found = []
    for err in own or errors:
        loc = [str(p) for p in err.get("loc", ()) if not _is_type_name(p)]
        where = ".".join(loc[1:] if loc and loc[0] == "body" else loc) or "body"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":   # its path is ('body', character offset)
            where = "body"
            message = (f"not valid JSON at character {loc[1] if len(loc) > 1 else '?'} "
                       f"({(err.get('ctx') or {}).get('error', 'decode error')})")
        if where == "body":
            message += "; send a JSON object with Content-Type: application/json"
        found.append((where, message))
    # An alternative that got deeper into the value (content: a list whose part lacks "type") says more than
    # one that failed at its top (content: not a string).
    parts, params = [], []
    for where, message in found:
        deeper = any(other.startswith(where + ".") for other, _ in found)
        if not deeper and f"{where}: {message}" not in parts:
            parts.append(f"{where}: {message}")
            params.append(where)
    if not parts:
        return ApiError(400, "invalid request body")
    return ApiError(400, "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else ""),
                    None if params[0] == "body" else params[0])


_UNION_ALTERNATIVES = ("str", "int", "float", "bool", "dict", "list", "ContentPart", "StreamOptions")


def _is_type_name(part) -> bool:
    """A union alternative in a pydantic error path: 'str', 'list[int]', 'function-after[...]', 'ContentPart'."""
    return isinstance(part, str) and (part in _UNION_ALTERNATIVES or "[" in part)


def _valid_text(text: str) -> str:
    check_text(text, "the text")
    return text


# A str that can be encoded as UTF-8 (so tokenized and echoed back in an error message).
Text = Annotated[str, AfterValidator(_valid_text)]


def _int64(token_id: int) -> int:
    if not -2 ** 63 <= token_id < 2 ** 63:
        raise ValueError(f"token id {token_id} is not a 64-bit integer; token ids are in [0, the vocabulary size)")
    return token_id


# Token ids are checked against the vocabulary later (the engine knows it); this bound keeps them 64-bit.
TokenId = Annotated[int, AfterValidator(_int64)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""
    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=FLOAT32_MAX, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1, lt=2 ** 63)
    n: int = Field(1, ge=1, le=64)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=-2 ** 63, lt=2 ** 64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0, le=FLOAT32_MAX, allow_inf_nan=False)   # vLLM's extra
    logit_bias: dict[str, float] | None = None
    user: Text | None = None

    def refuse_unsupported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")

    def sampling_params(self, max_tokens: int, choice: int) -> SamplingParams:
        """Choice i of n samples with seed + i, so n > 1 gives n different samples and a seed reproduces all."""
        seed = None if self.seed is None else self.seed + choice
        try:
            return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
                                  max_tokens=max_tokens, seed=seed, stop=self.stop, ignore_eos=self.ignore_eos,
                                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                  repetition_penalty=self.repetition_penalty, logit_bias=self.target_logit_bias(),
                                  **self.logprob_params(max_tokens))
        except ValueError as e:   # SamplingParams' messages start with the field's name
            name = str(e).split(" ", 1)[0]
            raise ApiError(400, str(e), name if name in type(self).model_fields else None) from e

    def logprob_params(self, max_tokens: int) -> dict:
        """SamplingParams' logprobs and prompt_logprobs for this request."""
        return {}

    def target_logit_bias(self) -> dict[int, float] | None:
        """logit_bias with its keys as target token ids (OpenAI sends them as strings of integers)."""
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.strip().lstrip("+-").isdigit():
                raise ApiError(400, f"logit_bias keys must be target token ids (strings of integers), got {key!r}",
                               "logit_bias")
            bias[int(key)] = value
        return bias

    @property
    def max_tokens_field(self) -> str:
        """The field the output length came from, for error messages."""
        return "max_tokens"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _shape(value) -> str:
    if isinstance(value, list):
        kinds = sorted({type(x).__name__ for x in value})
        return f"a list of {' and '.join(kinds)}" if kinds else "an empty list"
    return "null" if value is None else f"a {type(value).__name__}"


class CompletionRequest(_SamplingRequest):
    prompt: Text | list[Text] | list[TokenId]
    max_tokens: int | None = Field(16, ge=0)      # OpenAI's and vLLM's default for completions; 0 only with echo
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value):
        """The shape first, in one message (the union's alternatives would each report their own type error). A batch
        of one list of token ids (what lm-eval sends at batch size 1) is that list."""
        if (isinstance(value, list) and len(value) == 1 and isinstance(value[0], list) and value[0]
                and all(isinstance(x, int) and not isinstance(x, bool) for x in value[0])):
            value = value[0]
        if isinstance(value, str) or (isinstance(value, list) and (
                all(isinstance(x, str) for x in value)
                or all(isinstance(x, int) and not isinstance(x, bool) for x in value))):
            return value
        raise ValueError(f"prompt must be a string or a list of token ids (integers), got "
                         f"{_shape(value)}; batches (a list of lists) are not supported, send one request per prompt")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens must be greater than or equal to 1 (0 only with echo: true, which "
                                "returns the prompt, with its logprobs where logprobs is set)", "max_tokens")
        if self.suffix:
            raise ApiError(400, "suffix is not supported by this server; leave it out", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, "best_of is not supported (only best_of = n); use n", "best_of")

    def logprob_params(self, max_tokens: int) -> dict:
        """echo with logprobs: the prompt's too; echo with max_tokens 0 scores the prompt (its logprobs where asked,
        else only so that the engine takes the request: the reply holds the prompt only)."""
        prompt = self.logprobs if self.echo and self.logprobs is not None else (0 if self.echo and not max_tokens
                                                                               else None)
        return {"logprobs": self.logprobs, "prompt_logprobs": prompt}

    def prompt_input(self) -> tuple[str | None, list[int] | None]:
        """(text, None) or, for a prompt of token ids, (None, target ids)."""
        if isinstance(self.prompt, list) and not self.prompt:
            raise ApiError(400, "prompt is an empty list; give one string or one list of token ids", "prompt")
        if isinstance(self.prompt, list) and all(isinstance(x, int) for x in self.prompt):
            return None, list(self.prompt)
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise ApiError(400, f"prompt must be one string or one list of token ids (got a list of {len(prompts)}); "
                                f"send one request per prompt, or use n for several completions", "prompt")
        return prompts[0], None


class ContentPart(BaseModel):
    """One part of a message's content: OpenAI's {"type": "text", "text": ...}; other types are refused."""
    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None

    @model_validator(mode="after")
    def _text_only(self) -> "ContentPart":
        if self.type != "text":
            raise ValueError(f"content parts of type {self.type!r} are not supported by this server (text only); "
                             f"send {{\"type\": \"text\", \"text\": ...}} parts or a string")
        if self.text is None:
            raise ValueError("a text content part needs \"text\" (a string)")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list | None = None
    response_format: dict | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true; set it, or leave top_logprobs out", "top_logprobs")
        if self.tools:
            raise ApiError(400, "tools are not supported by this server", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ApiError(400, "response_format other than text is not supported", "response_format")

    def logprob_params(self, max_tokens: int) -> dict:
        return {"logprobs": (self.top_logprobs or 0) if self.logprobs else None}

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"
