"""User-facing configuration dataclasses, validated on construction with messages that say what to change."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .cache_budget import parse_bytes

FLOAT32_MAX = float(torch.finfo(torch.float32).max)   # a larger temperature is inf on the device
MAX_LOGPROBS = 20   # top alternatives a request may ask for per token (OpenAI's cap)
MAX_PENALTY = 2.0   # the largest presence / frequency penalty magnitude (OpenAI's range)
MAX_LOGIT_BIAS = 100.0   # the largest logit bias magnitude (OpenAI's range)

VOCAB_MODES = ("auto", "identity", "tli", "d2t", "slem")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float64": torch.float64, "fp64": torch.float64, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(sorted(set(DTYPES)))}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None picks cuda when present; asking for a device this machine lacks is an error, not a fallback."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available; use device='cpu'")
    return dev


@dataclass
class SamplingParams:
    """Per-request decoding settings (vLLM's names). temperature 0 = greedy.

    Each field's string below it is its documentation (docs/configuration.md is generated from them)."""
    temperature: float = 1.0
    """0 = greedy (argmax, lowest id on ties); > 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus cut: keep the most likely tokens whose probabilities sum to top_p (1 = no cut)."""
    top_k: int = 0
    """Keep only the top_k most likely tokens (0 or -1 = no cut)."""
    max_tokens: int = 128
    """The most tokens this request generates."""
    seed: int | None = None
    """A 64-bit seed for this request's draws (None: a fresh non-deterministic seed)."""
    stop: list[str] | str | None = None
    """Stop strings: the output ends before the first one (not included in the text)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token, up to max_tokens."""
    num_speculative_tokens: int | None = None
    """At most this many draft tokens per step for this request; 0 opts it out of speculation (its output is
    the same either way; speculation only changes speed). None: as many as the engine drafts."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many top alternatives (0 = the chosen token only, at
    most 20): the target's raw logprobs (log_softmax of its logits before temperature, top-k, top-p), the same
    with or without speculation. None: none."""
    prompt_logprobs: int | None = None
    """Return each prompt token's log-probability (the first has none) and this many top alternatives (0..20);
    such a prompt skips the prefix cache. With it max_tokens may be 0 (score the prompt only). None: none."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the output already holds, in [-2, 2] (OpenAI's definition)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the output holds it, in [-2, 2] (OpenAI's definition)."""
    repetition_penalty: float = 1.0
    """A token seen in the prompt or output gets its logit divided by this where positive, multiplied where
    negative (vLLM's and HF's definition; > 0, 1 = off)."""
    logit_bias: dict[int, float] | None = None
    """Target token id -> a bias in [-100, 100] added to its logit before the penalties (OpenAI's logit_bias)."""

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= FLOAT32_MAX):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), finite and at most {FLOAT32_MAX:.4g} "
                             f"(float32's largest), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k < 2 ** 63:   # a 64-bit count on the device
            raise ValueError(f"top_k must be in [-1, 2**63) (0 or -1 = off), got {self.top_k}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] (top alternatives per token; "
                                 f"0 = the chosen token only) or None, got {value!r}")
        if self.max_tokens < (0 if self.prompt_logprobs is not None else 1):
            raise ValueError(f"max_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt), "
                             f"got {self.max_tokens}")
        if self.seed is not None and not (isinstance(self.seed, int) and -2 ** 63 <= self.seed < 2 ** 64):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64) (a 64-bit seed) or None, got {self.seed!r}")
        if self.num_speculative_tokens is not None and (not isinstance(self.num_speculative_tokens, int)
                                                        or self.num_speculative_tokens < 0):
            raise ValueError(f"num_speculative_tokens must be an integer >= 0 (0 = no speculation for this request) "
                             f"or None, got {self.num_speculative_tokens!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise ValueError(f"{name} must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] (0 = off), "
                                 f"got {value!r}")
        if not (isinstance(self.repetition_penalty, (int, float)) and 0 < self.repetition_penalty <= FLOAT32_MAX):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty!r}")
        if self.logit_bias is not None:
            self.logit_bias = dict(self.logit_bias)
            for target_id, bias in self.logit_bias.items():
                if not isinstance(target_id, int) or isinstance(target_id, bool) or target_id < 0:
                    raise ValueError(f"logit_bias keys must be target token ids (integers >= 0), got {target_id!r}")
                if not (isinstance(bias, (int, float)) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                    raise ValueError(f"logit_bias values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                                     f"{MAX_LOGIT_BIAS:g}], got {bias!r} for token {target_id}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a logit bias changes the target's logits (TargetStep then computes them all)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    @staticmethod
    def any_penalized(params: list["SamplingParams"]) -> bool:
        """Whether some one is `penalized`, in a constant number of calls (asked of every decode step's batch)."""
        return any([p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 or p.logit_bias
                    for p in params])

    @staticmethod
    def all_greedy(params: list["SamplingParams"]) -> bool:
        """Whether every one is greedy (as `greedy`, temperature 0), in a constant number of calls: a decode step
        asks it of its whole batch."""
        return not any([p.temperature for p in params])


@dataclass
class SpeculativeConfig:
    """The draft side: which model proposes, how many tokens per step, how vocabularies are matched."""
    model: str
    """The draft: a checkpoint directory, a builtin name (smollm2-draft, ...) or SMALL@SHAPE (grown)."""
    num_speculative_tokens: int = 5
    """The most draft tokens a step proposes (adaptive speculation picks 0..this per step)."""
    vocab_mode: str = "auto"
    """How the vocabularies are matched: auto | identity | tli | d2t | slem (auto picks one and says why)."""
    adaptive: bool = True
    """Choose k per step for speed; False: always num_speculative_tokens."""
    dtype: str | None = None
    """The draft's dtype; None = the target's."""
    device: str | None = None
    """The draft's device; None = the target's."""
    resync_window: int = 6
    """Draft tokens re-tokenized around a target token outside the intersection (re-sync's look-back)."""
    draft_vocab_size: int | None = None
    """Frequency-ranked draft head (vocab/frequency.py): keep the draft_vocab_size output rows whose target
    tokens draft_vocab_corpus uses most (SLEM: the draft's own tokens). None = the whole head (TLI: the whole
    intersection)."""
    draft_vocab_corpus: str | None = None
    """In-domain text (.jsonl with string fields, or plain text) that ranks the head's rows for
    draft_vocab_size; required with it."""
    vocab_mode_corpus: str | None = None
    """In-domain text vocab_mode="auto" measures TLI's coverage on (vocab/mode_choice.py); None: auto keeps TLI
    across vocabularies. Not draft_vocab_corpus: a head cut ranks TLI's rows, it does not ask for another mode."""

    def __post_init__(self):
        if not self.model:
            raise ValueError("speculative_config needs 'model': a draft checkpoint directory or builtin name")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {self.num_speculative_tokens!r}; "
                             f"to decode with the target alone, leave speculative_config out")
        if self.vocab_mode not in VOCAB_MODES:
            raise ValueError(f"vocab_mode {self.vocab_mode!r} is unknown; use one of {', '.join(VOCAB_MODES)}")
        if self.vocab_mode_corpus and self.vocab_mode != "auto":
            raise ValueError(f"vocab_mode_corpus is read only by vocab_mode 'auto' (to choose a mode); with "
                             f"vocab_mode {self.vocab_mode!r} drop it")
        if self.dtype is not None:
            parse_dtype(self.dtype)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if self.resync_window < 1:
            raise ValueError(f"resync_window must be >= 1, got {self.resync_window}")
        if self.draft_vocab_size is not None:
            if not isinstance(self.draft_vocab_size, int) or self.draft_vocab_size < 1:
                raise ValueError(f"draft_vocab_size must be an integer >= 1, got {self.draft_vocab_size!r}; "
                                 f"leave it None to keep the whole draft head")
            if not self.draft_vocab_corpus:
                raise ValueError("draft_vocab_size ranks the draft's tokens by how often a corpus uses them; "
                                 "also give draft_vocab_corpus (a .jsonl or text file of in-domain text)")
        elif self.draft_vocab_corpus:
            raise ValueError("draft_vocab_corpus is set but draft_vocab_size is not; give the number of head rows "
                             "to keep (e.g. 8192), or drop the corpus")

    @classmethod
    def from_any(cls, value: "SpeculativeConfig | dict | None") -> "SpeculativeConfig | None":
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict or SpeculativeConfig, got {type(value).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**value)


@dataclass
class EngineConfig:
    """Capacity of the running batch and the caches."""
    max_num_seqs: int = 8
    """Requests decoding at once; more wait in the queue."""
    max_model_len: int = 2048
    """Prompt + output tokens per request."""
    dtype: str = "bfloat16"
    """The target's dtype: bfloat16 | float32 | float64 | float16 (or bf16, fp32, fp64, fp16)."""
    device: str | None = None
    """cpu | cuda; None = cuda when present, else cpu."""
    kv_cache_memory: int | str | None = None
    """Bytes (or "4GiB") for the target's and the draft's KV block pools together; None: half the memory free
    after loading, at most what every row at max_model_len holds."""
    enable_prefix_caching: bool = True
    """Reuse the KV of prompt prefixes seen before, for the target and the draft."""
    extra: dict = field(default_factory=dict)
    """Free-form settings carried along unread by the engine."""

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        parse_dtype(self.dtype)
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
