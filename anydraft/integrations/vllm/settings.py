"""The draft side's settings inside vLLM, read from the environment (vLLM's config has no draft field for
custom_class, and its SpeculativeConfig forbids extra keys, so nothing else can carry them).

    ANYDRAFT_DRAFT_MODEL        required: draft checkpoint directory or builtin name (smollm2-draft, ...)
    ANYDRAFT_VOCAB_MODE         auto (default) | tli | identity | d2t
    ANYDRAFT_DRAFT_VOCAB_SIZE   cut the draft head to the N rows a corpus uses most (FR head); with:
    ANYDRAFT_DRAFT_VOCAB_CORPUS   a .jsonl or text file of in-domain text
    ANYDRAFT_RESYNC_WINDOW      draft tokens re-tokenized around a target token outside the intersection (6)
    ANYDRAFT_DRAFT_DTYPE        default: the target's dtype
    ANYDRAFT_DRAFT_SLOTS        requests whose draft state (KV cache) is kept; default: vLLM's max_num_seqs
    ANYDRAFT_TARGET_TOKENIZER   directory with the target's tokenizer.json; default: vLLM's tokenizer
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...config import SpeculativeConfig

ENV_OF_FIELD = {"model": "ANYDRAFT_DRAFT_MODEL", "vocab_mode": "ANYDRAFT_VOCAB_MODE",
                "draft_vocab_size": "ANYDRAFT_DRAFT_VOCAB_SIZE", "draft_vocab_corpus": "ANYDRAFT_DRAFT_VOCAB_CORPUS",
                "vocab_mode_corpus": "ANYDRAFT_VOCAB_MODE_CORPUS",
                "resync_window": "ANYDRAFT_RESYNC_WINDOW", "dtype": "ANYDRAFT_DRAFT_DTYPE"}
INT_FIELDS = ("draft_vocab_size", "resync_window")


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class DraftSettings:
    spec: SpeculativeConfig
    slots: int | None              # None: vLLM's max_num_seqs
    target_tokenizer: str | None   # None: vLLM's tokenizer

    @classmethod
    def from_env(cls, environ: Mapping[str, str], num_speculative_tokens: int) -> "DraftSettings":
        if not environ.get("ANYDRAFT_DRAFT_MODEL"):
            raise ValueError("anydraft's vLLM proposer needs the draft model: set ANYDRAFT_DRAFT_MODEL to a draft "
                             "checkpoint directory or a builtin name (e.g. ANYDRAFT_DRAFT_MODEL=smollm2-draft)")
        fields = {"num_speculative_tokens": num_speculative_tokens}
        for field, name in ENV_OF_FIELD.items():
            if environ.get(name):
                fields[field] = _int(environ, name) if field in INT_FIELDS else environ[name]
        try:
            spec = SpeculativeConfig(**fields)
        except ValueError as e:
            names = ", ".join(f"{f} = {n}" for f, n in ENV_OF_FIELD.items())
            raise ValueError(f"anydraft's vLLM proposer: {e} (settings come from the environment: {names})") from None
        slots = _int(environ, "ANYDRAFT_DRAFT_SLOTS") if environ.get("ANYDRAFT_DRAFT_SLOTS") else None
        if slots is not None and slots < 1:
            raise ValueError(f"ANYDRAFT_DRAFT_SLOTS must be >= 1, got {slots}")
        return cls(spec, slots, environ.get("ANYDRAFT_TARGET_TOKENIZER") or None)
