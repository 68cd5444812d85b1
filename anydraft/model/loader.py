"""Finding and loading checkpoints: builtin names, HF directories, sharded safetensors, d2t tables."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig, UnsupportedModelError
from ..checkpoints.grown_checkpoint import resolve_grown, split_grown_name
from .llama import CausalLM, rope_inv_freq
from ..checkpoints.shapes import SHAPES

BUILTIN_MODELS = ("qwen3-target", "qwen3-draft", "smollm2-target", "smollm2-draft",
                  # SentencePiece (Mistral v0.1 tokenizer): cross-family pairs with the byte-level BPE ones
                  "mistral-target", "mistral-draft",
                  # speculators-format drafters for qwen3-target (EAGLE-3, DSpark; -full: no d2t, the target's head)
                  "qwen3-eagle3", "qwen3-eagle3-full", "qwen3-dspark", "qwen3-dspark-full")
DEFAULT_TARGET, DEFAULT_DRAFT = "qwen3-target", "smollm2-draft"
D2T_KEYS = ("d2t", "t2d")


MODELS_DIR_ENV = "ANYDRAFT_MODELS_DIR"


def builtin_models_dir() -> Path:
    """Where the builtin checkpoints live: $ANYDRAFT_MODELS_DIR, else the models/ folder of the checkout this
    package runs from (an editable install or a checkout: the package sits beside it)."""
    configured = os.environ.get(MODELS_DIR_ENV)
    return Path(configured) if configured else Path(__file__).resolve().parent.parent.parent / "models"


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A checkpoint directory, one of the builtin names, or `SMALL@SHAPE`: SMALL (a builtin name or a
    directory) grown into a real architecture's shape (checkpoints/shapes.py), written to a cache on first use."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if str(name_or_path) in BUILTIN_MODELS:
        builtin = builtin_models_dir() / str(name_or_path)
        if builtin.is_dir():
            return builtin
        raise FileNotFoundError(
            f"builtin model {name_or_path!r} not found at {builtin}. The builtin checkpoints ship in the models/ "
            f"folder of the anydraft repository, not in the wheel: install from a checkout (pip install -e .), "
            f"or set {MODELS_DIR_ENV} to a folder holding them (e.g. {MODELS_DIR_ENV}=/path/to/anydraft/models)")
    grown = split_grown_name(str(name_or_path))
    if grown is not None:
        small, shape = grown
        return resolve_grown(resolve_model_path(small), shape)
    raise FileNotFoundError(f"{name_or_path}: not a checkpoint directory nor a builtin model "
                            f"({', '.join(BUILTIN_MODELS)}), nor SMALL@SHAPE with a shape of "
                            f"{', '.join(SHAPES)}")


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise UnsupportedModelError(f"{index}: not a valid safetensors index ({e})") from None
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    files = [f for f in files if f.name != "d2t.safetensors"]
    if not files:
        raise UnsupportedModelError(f"{path}: no *.safetensors weights (only safetensors checkpoints are supported)")
    return files


def has_d2t_table(path: Path) -> bool:
    """Whether a checkpoint ships d2t/t2d tables (d2t.safetensors or keys of its weights), without loading it."""
    if (path / "d2t.safetensors").exists():
        return True
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            if any(key in D2T_KEYS for key in f.keys()):
                return True
    return False


def iter_weights(path: Path):
    """(name, tensor) of every weight of a checkpoint (d2t tables included), one tensor at a time."""
    files = list(_weight_files(path))
    for file in files:
        if not file.exists():
            raise UnsupportedModelError(f"{file}: listed in the index but missing")
    if (path / "d2t.safetensors").exists():
        files.append(path / "d2t.safetensors")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    return dict(iter_weights(path))


def _head_rows(path: Path, default: int) -> int:
    """Rows of the checkpoint's lm_head (read from the file header), else `default`."""
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.removeprefix("module.") == "lm_head.weight":
                    return f.get_slice(key).get_shape()[0]
    return default


def load_model(name_or_path: str | Path, dtype: torch.dtype, device: torch.device) -> tuple[CausalLM, dict]:
    """Build the module and load weights. Returns (model, extras) where extras holds d2t/t2d if present.
    The module is allocated once in the dtype asked and each weight is copied into it as it is read, so loading
    holds about one copy of the weights (not the checkpoint's tensors beside the module's)."""
    path = resolve_model_path(name_or_path)
    cfg = ModelConfig.from_file(path / "config.json")
    with torch.device("meta"):
        model = CausalLM(cfg)
    head_rows = _head_rows(path, cfg.vocab_size)
    if head_rows != cfg.vocab_size:
        # Reduced-vocab draft head (speculators convention): N output rows, mapped to target ids by d2t.
        model.lm_head = torch.nn.Linear(cfg.hidden_size, head_rows, bias=False, device="meta")
    model = model.to(dtype=dtype).to_empty(device=device)
    model._inv_freq = rope_inv_freq(cfg).to(device)  # built under the meta device above; recompute for real
    targets = model.state_dict()
    extras, loaded, unexpected = {}, set(), []
    with torch.no_grad():
        for key, tensor in iter_weights(path):
            if key in D2T_KEYS:
                extras[key] = tensor
                continue
            name = key.removeprefix("module.")
            if name not in targets:
                unexpected.append(name)
            elif targets[name].shape != tensor.shape:
                raise UnsupportedModelError(f"{path}: {name} has shape {tuple(tensor.shape)}, {cfg.architecture} "
                                            f"with this config.json wants {tuple(targets[name].shape)}")
            else:
                targets[name].copy_(tensor)
                loaded.add(name)
    missing = [k for k in targets if k not in loaded]
    if cfg.tie_word_embeddings and "lm_head.weight" in missing:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing.remove("lm_head.weight")
    if missing or unexpected:
        raise UnsupportedModelError(f"{path}: weights do not match {cfg.architecture} "
                                    f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    model.path = path
    return model, extras

