"""Writing grown checkpoints: a standard Hugging Face directory, written whole or not at all, and the cache
behind builtin names like `qwen3-target@qwen3-1.7b`."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ..model.config import ModelConfig
from .grow import GrowError, grown_config, grown_names, grown_tensors, plan_growth
from .shapes import get_shape

GROW_FORMAT = "1"            # bump when grow.py changes what it writes: cached checkpoints stop matching
SHARD_BYTES = 1 << 30        # tensors per safetensors file: bounded memory while writing
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def grown_cache_dir() -> Path:
    """$ANYDRAFT_CACHE_DIR/grown, else ~/.cache/anydraft/grown (read at call time)."""
    configured = os.environ.get("ANYDRAFT_CACHE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "anydraft") / "grown"


def grow_checkpoint(small_dir: str | Path, shape_name: str, out_dir: str | Path, progress: bool = True) -> dict:
    """Write `small_dir` grown into the shape `shape_name` to `out_dir` (which must not exist yet).

    Written into a temporary sibling directory and renamed into place, so `out_dir` is either whole or
    absent. Tensors are stored in the small checkpoint's dtype where that is exact, else in float32 (norm
    weights scaled by non-power-of-two factors). Returns the summary that is also saved as grown.json."""
    from ..model.loader import read_state_dict   # the loader imports this module for builtin grown names

    small_dir, out_dir = Path(small_dir), Path(out_dir)
    shape = get_shape(shape_name)
    small_config = _read_config(small_dir)
    plan = plan_growth(ModelConfig.from_dict(small_config), shape)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; choose a new --out directory")
    state = {k.removeprefix("module."): v for k, v in read_state_dict(small_dir).items()}
    if {"d2t", "t2d"} & state.keys():
        raise GrowError("checkpoints with a reduced-vocab draft head (d2t) cannot be grown")
    store_dtype = state["model.embed_tokens.weight"].dtype
    summary = {
        "grown_from": str(small_dir.resolve()), "shape": shape.name, "shape_source": shape.source,
        "architecture": shape.architecture, "parameters": shape.parameter_count(), "format": GROW_FORMAT,
        "hidden_copies": plan.hidden_copies, "hidden_constants": list(plan.hidden_constants),
        "rms_norm_eps": plan.rms_norm_eps, "query_head_slots": list(plan.q_slots),
        "kv_head_sources": list(plan.kv_sources), "float32_tensors": [],
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        weight_map = _write_shards(plan, state, store_dtype, tmp, summary, progress)
        _write_metadata(tmp, small_dir, grown_config(plan, small_config), weight_map, summary)
        _make_readable(tmp)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _make_readable(directory: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; give the checkpoint the usual ones (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for file in directory.iterdir():
        file.chmod(0o666 & ~umask)


def _read_config(small_dir: Path) -> dict:
    try:
        return json.loads((small_dir / "config.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{small_dir}: no config.json (is this a checkpoint directory?)") from None


def _write_shards(plan, state, store_dtype, tmp: Path, summary: dict, progress: bool) -> dict[str, str]:
    names = grown_names(plan)
    total = 2 * plan.shape.parameter_count() if store_dtype != torch.float32 else 4 * plan.shape.parameter_count()
    bar = tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=not progress,
               desc=f"growing {Path(summary['grown_from']).name} into {plan.shape.name}", mininterval=2.0)
    shards, current, current_bytes = [], {}, 0
    with bar:
        for name, tensor in grown_tensors(plan, state):
            stored = tensor.to(store_dtype)
            if not torch.equal(stored.to(tensor.dtype), tensor):
                stored = tensor.to(torch.float32)
                summary["float32_tensors"].append(name)
            current[name] = stored.contiguous()
            current_bytes += stored.numel() * stored.element_size()
            bar.update(stored.numel() * stored.element_size())
            if current_bytes >= SHARD_BYTES:
                shards.append(_save_shard(current, tmp, len(shards)))
                current, current_bytes = {}, 0
        if current:
            shards.append(_save_shard(current, tmp, len(shards)))
    assert sum(len(s) for _, s in shards) == len(names)
    if len(shards) == 1:
        os.rename(tmp / shards[0][0], tmp / "model.safetensors")
        return {}
    weight_map = {}
    for i, (file, shard_names) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        os.rename(tmp / file, tmp / final)
        weight_map.update(dict.fromkeys(shard_names, final))
    return weight_map


def _save_shard(tensors: dict[str, torch.Tensor], tmp: Path, index: int) -> tuple[str, list[str]]:
    file = f"shard-{index}.safetensors"
    save_file(tensors, str(tmp / file), metadata={"format": "pt"})
    return file, list(tensors)


def _write_metadata(tmp: Path, small_dir: Path, config: dict, weight_map: dict, summary: dict) -> None:
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if weight_map:
        total = sum((tmp / f).stat().st_size for f in set(weight_map.values()))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for item in small_dir.iterdir():   # tokenizer, generation config, licenses: everything but weights
        if item.is_file() and item.name != "config.json" and not item.name.endswith(WEIGHT_SUFFIXES) \
                and item.name != "model.safetensors.index.json":
            shutil.copy2(item, tmp / item.name)
    (tmp / "grown.json").write_text(json.dumps(summary, indent=2) + "\n")


def split_grown_name(name: str) -> tuple[str, str] | None:
    """'SMALL@SHAPE' -> (SMALL, SHAPE); None when the name has no '@'."""
    small, sep, shape = str(name).rpartition("@")
    return (small, shape) if sep and small and shape else None


def resolve_grown(small_dir: Path, shape_name: str, progress: bool = True) -> Path:
    """The cached grown checkpoint of `small_dir` in `shape_name`, written on first use.

    Keyed by the small checkpoint's contents (config and weights) and GROW_FORMAT, never its path."""
    shape = get_shape(shape_name)
    key = _content_key(small_dir, shape.name)
    path = grown_cache_dir() / f"{small_dir.name}@{shape.name}-{key}"
    if (path / "config.json").exists():
        return path
    print(f"anydraft: writing {small_dir.name}@{shape.name} (first use, {shape.parameter_count() / 1e9:.2f}B "
          f"parameters) to {path}", file=sys.stderr)
    try:
        grow_checkpoint(small_dir, shape.name, path, progress=progress)
    except (FileExistsError, OSError):
        if (path / "config.json").exists():   # another process finished the same checkpoint first
            return path
        raise
    return path


def _content_key(small_dir: Path, shape_name: str) -> str:
    digest = hashlib.sha256(f"anydraft-grown-v{GROW_FORMAT}:{shape_name}:".encode())
    for file in sorted(small_dir.iterdir()):   # all of it: the grown directory copies the tokenizer too
        if file.is_file():
            digest.update(file.name.encode())
            with file.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]
