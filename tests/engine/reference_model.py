"""Reference decoding for the tests: the target alone, the slow obvious way (no KV cache, float64).

Every exactness test compares the engine with these functions; they share nothing with the engine but the model
definition and the loader.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from anydraft.model.llama import CausalLM
from tiny_models import tokenizer_of


@functools.lru_cache(maxsize=None)
def _reference_model(model_dir: str) -> CausalLM:
    from anydraft.model.loader import load_model
    return load_model(model_dir, torch.float64, torch.device("cpu"))[0]


@torch.inference_mode()
def _reference_logits(model_dir: Path, target_ids: list[int]) -> torch.Tensor:
    """Last-position logits [V_rows], the full sequence through the model (no KV cache), float64, with the
    rows past the tokenizer (padding) at -inf as the engine does."""
    model = _reference_model(str(model_dir))
    logits = model.logits(model(torch.tensor([target_ids]))[:, -1])[0]
    logits[tokenizer_of(Path(model_dir)).vocab_size:] = float("-inf")
    return logits


@functools.lru_cache(maxsize=None)
def _reference_greedy(model_dir: str, prompt_target_ids: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    eos_ids = set(tokenizer_of(Path(model_dir)).eos_token_ids)
    target_ids, out = list(prompt_target_ids), []
    for _ in range(max_tokens):
        next_id = int(_reference_logits(Path(model_dir), target_ids).argmax())
        out.append(next_id)
        target_ids.append(next_id)
        if next_id in eos_ids:
            break
    return tuple(out)


def reference_greedy(model_dir: Path, prompt: str, max_tokens: int) -> list[int]:
    """Target-alone greedy decoding the slow obvious way (no cache, float64), stopping at EOS."""
    prompt_target_ids = tokenizer_of(Path(model_dir)).encode(prompt)
    return list(_reference_greedy(str(model_dir), tuple(prompt_target_ids), max_tokens))


def reference_first_token_probs(model_dir: Path, prompt: str, temperature: float = 1.0,
                                after: tuple[int, ...] = ()) -> torch.Tensor:
    """Exact target distribution [V_rows], float64, of the first generated token, or of the token that
    follows the generated target ids `after`."""
    prompt_target_ids = tokenizer_of(Path(model_dir)).encode(prompt) + list(after)
    return (_reference_logits(Path(model_dir), prompt_target_ids) / temperature).softmax(-1)
