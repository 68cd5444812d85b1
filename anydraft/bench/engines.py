"""anydraft's own engines in the bench: one target runner with batch_size cache rows, shared by the target-alone,
same-vocab and TLI engines (fixed k, and adaptive as LLM runs it by default). The k setter the sweep uses is
anydraft/k_sweep.py; timing lives in contenders.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SpeculativeConfig, parse_dtype
from ..engine import Engine
from ..model.loader import load_model, resolve_model_path
from ..model.runner import ModelRunner
from ..spec_decode.factory import build_proposer
from ..spec_decode.proposer import NoDraftProposer
from ..tokenizer import Tokenizer
from .inflate import InflateSpec, inflate_model, parameter_count


@dataclass
class TargetSetup:
    runner: ModelRunner
    tokenizer: Tokenizer
    path: str
    parameters: int
    inflate: InflateSpec | None      # set = cost-emulated target (same logits, bigger cost)


def load_target(name: str, dtype: str, max_model_len: int, inflate: InflateSpec | None,
                batch_size: int = 1) -> TargetSetup:
    """The target with batch_size cache rows; with `inflate`, enlarged in memory before its KV cache is built."""
    path = resolve_model_path(name)
    tokenizer = Tokenizer.from_dir(path)
    model, extras = load_model(path, parse_dtype(dtype), torch.device("cpu"))
    if inflate is not None:
        inflate_model(model, inflate)
    # + 16: room for a verification forward of up to k+1 tokens at the length limit (k <= 15), as LLM does.
    runner = ModelRunner(model, batch_size, max_model_len + 16, num_token_rows=tokenizer.vocab_size, extras=extras)
    return TargetSetup(runner, tokenizer, str(path), parameter_count(model), inflate)


def build_engine(target: TargetSetup, draft: str | None, k: int, max_model_len: int, vocab_mode: str = "auto",
                 draft_vocab_size: int | None = None, draft_vocab_corpus: str | None = None,
                 adaptive: bool = False) -> tuple[Engine, dict, ModelRunner | None]:
    """(engine, draft_info, draft runner) for the target alone (draft None) or with a draft, as many rows as the
    target's cache; draft_vocab_size cuts the draft head to its most frequent rows (vocab/frequency.py);
    adaptive: each step drafts 0..k tokens (LLM's default), else always k."""
    if draft is None:
        proposer = NoDraftProposer(target.runner.device, target.runner.vocab_rows)
        return Engine(target.runner, target.tokenizer, proposer, max_model_len), {"vocab_mode": None}, None
    spec = SpeculativeConfig(model=draft, num_speculative_tokens=k, vocab_mode=vocab_mode, adaptive=adaptive,
                             draft_vocab_size=draft_vocab_size, draft_vocab_corpus=draft_vocab_corpus)
    rows = target.runner.cache.max_batch
    proposer, info = build_proposer(spec, target.runner, target.tokenizer, rows, max_model_len)
    engine = Engine(target.runner, target.tokenizer, proposer, max_model_len, adaptive=spec.adaptive)
    return engine, info, proposer.runner
