"""Reusing one built engine and its draft at another fixed k, as sweeps over k do (the advisor, the bench)."""
from __future__ import annotations

from .engine import Engine
from .metrics import SpecStats
from .spec_decode.policy import FixedK


def set_k(engine: Engine, k: int) -> None:
    """Reuse a built draft at another fixed k (the sweep): the proposer, the engine and its policy all say k."""
    engine.proposer.num_speculative_tokens = k
    engine.k = k
    engine.policy = FixedK(k)
    engine.max_model_len = min(engine.max_model_len, engine.target.cache.max_len - k)
    engine.stats = SpecStats(k)
