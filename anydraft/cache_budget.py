"""The KV budget: how many blocks the target's and the draft's pools get, from bytes asked or memory available.

Both pools come out of one budget (as vLLM's `--kv-cache-memory`): a target token costs its own K/V bytes plus the
draft's K/V for the draft tokens of the same text. The pools never exceed what `max_num_seqs` rows at full length
could use, and a budget that cannot hold one request of `max_model_len` is refused at start with what would fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import psutil
import torch

from .model.kv_cache import BLOCK_TOKENS, blocks_for

DEFAULT_KV_CACHE_FRACTION = 0.5   # of the memory free once the weights are loaded, when no budget is given
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(value: int | float | str) -> int:
    """4000000000, "4GB", "4 GiB", "512MiB" -> bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"kv_cache_memory {value!r} is not a size; give bytes or a number with a unit, "
                             f"e.g. 4GiB, 4GB or 512MiB")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"kv_cache_memory must be positive, got {value!r}")
    return size


def available_memory(device: torch.device) -> int:
    """Bytes that can still be allocated where the caches live."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class CachePlan:
    target_blocks: int           # pool sizes, the null block included
    draft_blocks: int | None     # None: no draft model with a cache of its own
    target_bytes_per_token: int
    draft_bytes_per_token: int
    budget_bytes: int
    source: str                  # where the budget came from, for the log

    @property
    def target_tokens(self) -> int:
        return (self.target_blocks - 1) * BLOCK_TOKENS

    @property
    def draft_tokens(self) -> int:
        return 0 if self.draft_blocks is None else (self.draft_blocks - 1) * BLOCK_TOKENS

    @property
    def bytes(self) -> int:
        return self.target_tokens * self.target_bytes_per_token + self.draft_tokens * self.draft_bytes_per_token

    def describe(self, request_tokens: int) -> str:
        """The startup log line: the pool in tokens and how many requests of request_tokens fit."""
        line = (f"KV cache {_gib(self.bytes)} ({self.source}): target {self.target_tokens:,} tokens "
                f"= {self.target_tokens // request_tokens} requests of {request_tokens:,}")
        if self.draft_blocks is not None:
            line += f"; draft {self.draft_tokens:,} tokens"
        return line


def block_rounded(num_rows: int, max_len: int) -> int:
    """Tokens the pool needs for num_rows rows of max_len each (a row takes whole blocks)."""
    return num_rows * blocks_for(max_len) * BLOCK_TOKENS


def plan_caches(kv_cache_memory: int | str | None, device: torch.device, target_bytes_per_token: int,
                target_full_tokens: int, request_tokens: int, draft_bytes_per_token: int = 0,
                draft_full_tokens: int = 0, draft_tokens_per_target_token: float = 1.0,
                available_bytes: int | None = None) -> CachePlan:
    """Blocks for each pool. target_full_tokens / draft_full_tokens: what every row at full length would hold (the
    most worth allocating); request_tokens: one request of max_model_len (+ a verification's k), which must fit."""
    available = available_memory(device) if available_bytes is None else available_bytes
    per_target_token = target_bytes_per_token + draft_tokens_per_target_token * draft_bytes_per_token
    full_bytes = target_full_tokens * target_bytes_per_token + draft_full_tokens * draft_bytes_per_token
    if kv_cache_memory is None:
        budget = int(min(full_bytes, DEFAULT_KV_CACHE_FRACTION * available))
        source = ("every row at max_model_len" if budget == full_bytes else
                  f"{DEFAULT_KV_CACHE_FRACTION:.0%} of {_gib(available)} free; set --kv-cache-memory to change")
    else:
        budget = parse_bytes(kv_cache_memory)
        source = f"--kv-cache-memory {kv_cache_memory}"
        if budget > available:
            raise ValueError(f"kv_cache_memory {kv_cache_memory} is more than the {_gib(available)} free on "
                             f"{device} after loading the weights; give at most that")
    target_tokens = min(int(budget / per_target_token), target_full_tokens)
    if target_tokens < request_tokens:
        need = request_tokens * per_target_token
        raise ValueError(f"a KV budget of {_gib(budget)} ({source}) holds {target_tokens:,} target tokens, less "
                         f"than one request of max_model_len ({request_tokens:,} tokens, {_gib(need)}); give "
                         f"--kv-cache-memory at least {_gib(need)} or lower --max-model-len")
    target_blocks = blocks_for(target_tokens) + 1
    draft_blocks = None
    if draft_bytes_per_token:
        draft_tokens = min(int(target_tokens * draft_tokens_per_target_token), draft_full_tokens)
        draft_blocks = blocks_for(draft_tokens) + 1
    return CachePlan(target_blocks, draft_blocks, target_bytes_per_token, draft_bytes_per_token, budget, source)
