"""On-disk cache of built VocabBridges, keyed by tokenizer contents and vocab rows (never paths).

One safetensors file per bridge holds the tensors, with the stats JSON in its metadata: a single
file written to a temp name and os.replace'd into place, so a reader sees a whole entry or none.
An entry that fails to load or validate is rebuilt and overwritten.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from ..atomic_file import save_safetensors_atomically

from anydraft.vocab.bridge import BridgeStats, VocabBridge

if TYPE_CHECKING:
    from anydraft.tokenizer import Tokenizer

CACHE_FORMAT = "1"  # bump when the bridge layout or matching rules change: old entries stop matching


def default_cache_dir() -> Path:
    """$ANYDRAFT_CACHE_DIR, else ~/.cache/anydraft/bridges (read at call time, not import time)."""
    configured = os.environ.get("ANYDRAFT_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "anydraft" / "bridges"


def bridge_cache_key(target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer, target_vocab_rows: int,
                     draft_vocab_rows: int) -> str:
    text = (f"anydraft-bridge-v{CACHE_FORMAT}:{target_tokenizer.content_hash}:{draft_tokenizer.content_hash}:"
            f"{target_vocab_rows}:{draft_vocab_rows}")
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"bridge-{key[:40]}.safetensors"


def save_bridge(path: Path, bridge: VocabBridge, key: str) -> None:
    """Write atomically: a crash leaves at most a stray temp file, never a half-written entry."""
    tensors = {"draft_in_intersection": bridge.draft_in_intersection.contiguous()}
    if not bridge.is_identity:
        tensors["draft_to_target"] = bridge.draft_to_target.contiguous()
        tensors["target_to_draft"] = bridge.target_to_draft.contiguous()
    metadata = {"format": CACHE_FORMAT, "key": key, "is_identity": str(int(bridge.is_identity)),
                "target_vocab_rows": str(bridge.target_vocab_rows), "draft_vocab_rows": str(bridge.draft_vocab_rows),
                "stats": json.dumps(bridge.stats.to_dict())}
    save_safetensors_atomically(path, tensors, metadata)


def load_bridge(path: Path, key: str, target_vocab_rows: int, draft_vocab_rows: int) -> VocabBridge:
    """Read one entry; raises ValueError (or the reader's error) if it is not the expected bridge."""
    with safe_open(str(path), framework="pt") as entry:
        metadata = entry.metadata() or {}
        if metadata.get("format") != CACHE_FORMAT or metadata.get("key") != key:
            raise ValueError(f"{path}: cache entry for another key or format")
        tensors = {name: entry.get_tensor(name) for name in entry.keys()}
    is_identity = metadata["is_identity"] == "1"
    draft_in_intersection = tensors["draft_in_intersection"]  # [V_draft_rows]
    draft_to_target = tensors.get("draft_to_target")          # [V_draft_rows] or None
    target_to_draft = tensors.get("target_to_draft")          # [V_target_rows] or None
    expected = [(draft_in_intersection, draft_vocab_rows, torch.bool)]
    if not is_identity:
        if draft_to_target is None or target_to_draft is None:
            raise ValueError(f"{path}: mapping tensors missing")
        expected += [(draft_to_target, draft_vocab_rows, torch.long), (target_to_draft, target_vocab_rows, torch.long)]
    for tensor, rows, dtype in expected:
        if tensor.dtype != dtype or tuple(tensor.shape) != (rows,):
            raise ValueError(f"{path}: tensor {tuple(tensor.shape)} {tensor.dtype}, expected ({rows},) {dtype}")
    stats = BridgeStats.from_dict(json.loads(metadata["stats"]))
    return VocabBridge(target_vocab_rows, draft_vocab_rows, is_identity, draft_to_target, target_to_draft,
                       draft_in_intersection, stats, from_cache=True)


def load_or_build_bridge(target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer,
                         target_vocab_rows: int | None = None, draft_vocab_rows: int | None = None,
                         cache_dir: str | Path | None = None, use_cache: bool = True) -> VocabBridge:
    """The cached bridge if a valid entry exists, else build it and store it (best effort)."""
    target_rows = target_tokenizer.vocab_size if target_vocab_rows is None else int(target_vocab_rows)
    draft_rows = draft_tokenizer.vocab_size if draft_vocab_rows is None else int(draft_vocab_rows)
    if not use_cache:
        return VocabBridge.build(target_tokenizer, draft_tokenizer, target_rows, draft_rows)
    key = bridge_cache_key(target_tokenizer, draft_tokenizer, target_rows, draft_rows)
    path = cache_path(Path(cache_dir) if cache_dir is not None else default_cache_dir(), key)
    if path.is_file():
        try:
            return load_bridge(path, key, target_rows, draft_rows)
        except Exception:  # corrupt or foreign entry (any reader error): rebuild and overwrite it
            pass
    bridge = VocabBridge.build(target_tokenizer, draft_tokenizer, target_rows, draft_rows)
    try:
        save_bridge(path, bridge, key)
    except OSError:
        pass  # an unwritable cache only costs the next run a rebuild
    return bridge
