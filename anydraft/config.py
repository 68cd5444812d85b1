"""User-facing configuration dataclasses, validated on construction with messages that say what to change."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

FLOAT32_MAX = float(torch.finfo(torch.float32).max)   # a larger temperature is inf on the device

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
    """Per-request decoding settings (vLLM's names). temperature 0 = greedy."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 128
    seed: int | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool = False
    # At most this many draft tokens per step for this request; 0 opts it out of speculation (its output is the
    # same either way; speculation only changes speed). None: as many as the engine drafts.
    num_speculative_tokens: int | None = None

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= FLOAT32_MAX):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), finite and at most {FLOAT32_MAX:.4g} "
                             f"(float32's largest), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k < 2 ** 63:   # a 64-bit count on the device
            raise ValueError(f"top_k must be in [-1, 2**63) (0 or -1 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (isinstance(self.seed, int) and -2 ** 63 <= self.seed < 2 ** 64):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64) (a 64-bit seed) or None, got {self.seed!r}")
        if self.num_speculative_tokens is not None and (not isinstance(self.num_speculative_tokens, int)
                                                        or self.num_speculative_tokens < 0):
            raise ValueError(f"num_speculative_tokens must be an integer >= 0 (0 = no speculation for this request) "
                             f"or None, got {self.num_speculative_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @staticmethod
    def all_greedy(params: list["SamplingParams"]) -> bool:
        """Whether every one is greedy (as `greedy`, temperature 0), in a constant number of calls: a decode step
        asks it of its whole batch."""
        return not any([p.temperature for p in params])


@dataclass
class SpeculativeConfig:
    """The draft side: which model proposes, how many tokens per step, how vocabularies are matched."""
    model: str
    num_speculative_tokens: int = 5   # the most a step drafts (adaptive picks 0..this per step)
    vocab_mode: str = "auto"
    adaptive: bool = True             # choose k per step for speed; False: always num_speculative_tokens
    dtype: str | None = None     # None = the target's dtype
    device: str | None = None    # None = the target's device
    resync_window: int = 6
    # Frequency-ranked draft head (vocab/frequency.py): keep the draft_vocab_size output rows whose target
    # tokens draft_vocab_corpus uses most (SLEM: the draft's own tokens). None = the whole head (TLI: the whole
    # intersection).
    draft_vocab_size: int | None = None
    draft_vocab_corpus: str | None = None
    # In-domain text vocab_mode="auto" measures TLI's coverage on (vocab/mode_choice.py); None: auto keeps TLI
    # across vocabularies. Not draft_vocab_corpus: a head cut ranks TLI's rows, it does not ask for another mode.
    vocab_mode_corpus: str | None = None

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
    max_model_len: int = 2048
    dtype: str = "bfloat16"
    device: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        parse_dtype(self.dtype)
