"""anydraft: lossless speculative decoding with a draft model of any vocabulary."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "SpeculativeConfig", "RequestOutput"]


def __getattr__(name: str):
    # Lazy: `anydraft vocab` and friends should not pay for importing the engine.
    if name in ("LLM", "RequestOutput"):
        from . import llm
        return getattr(llm, name)
    if name in ("SamplingParams", "SpeculativeConfig"):
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module 'anydraft' has no attribute {name!r}")
