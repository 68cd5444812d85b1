"""Loading a speculators-format drafter (EAGLE-3, DSpark) for a given target, checking what the format promises.

Weights: model.safetensors (or an index), with the d2t / t2d tables when the draft vocabulary is reduced.
A checkpoint may omit `embed_tokens.weight` and `lm_head.weight` (speculators then takes the verifier's):
the draft then shares the target's tensors (a reduced head: the target's rows at t2d).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..vocab.d2t import D2TError, validate_d2t
from .eagle3 import Eagle3Draft
from .llama import CausalLM, rope_inv_freq
from .loader import _weight_files
from .speculators_config import SpeculatorsConfig, SpeculatorsFormatError


@dataclass
class SpeculatorsDraft:
    config: SpeculatorsConfig
    module: torch.nn.Module            # Eagle3Draft | DSparkDraft, eval, no grad
    head_to_target: torch.Tensor | None  # [N] target id of each head row (i + d2t[i]); None = full vocabulary
    shared_with_target: list[str]      # tensors taken from the target (not in the checkpoint)


def _read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    tensors, origin = {}, {}
    for file in _weight_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    tensors[key], origin[key] = f.get_tensor(key), file
        except (OSError, SafetensorError) as e:
            raise SpeculatorsFormatError(f"{file}: cannot read ({e})") from None
    return tensors, origin


def _vocab_tables(cfg: SpeculatorsConfig, tensors: dict, origin: dict, target_vocab_rows: int) -> torch.Tensor | None:
    """head_to_target [N] from d2t, after checking it against t2d and the config; None for a full vocabulary."""
    if not cfg.reduced_vocab:
        return None   # speculators ignores tables a full-vocabulary draft may carry: identity, nothing to map
    missing = [name for name in ("d2t", "t2d") if name not in tensors]
    if missing:
        raise SpeculatorsFormatError(f"{cfg.path.parent}: draft_vocab_size {cfg.draft_vocab_size} < the verifier's "
                                     f"{cfg.layer.vocab_size} rows, so the weights need d2t and t2d; missing {missing}")
    d2t, t2d = tensors.pop("d2t"), tensors.pop("t2d")
    source = str(origin["d2t"])
    if t2d.dim() != 1 or t2d.numel() != target_vocab_rows:
        raise SpeculatorsFormatError(f"{origin['t2d']}: t2d has shape {tuple(t2d.shape)}, expected "
                                     f"[{target_vocab_rows}] (one flag per target vocabulary row)")
    if int(t2d.bool().sum()) != cfg.draft_vocab_size:
        raise SpeculatorsFormatError(f"{origin['t2d']}: t2d has {int(t2d.bool().sum())} true entries, but "
                                     f"draft_vocab_size in {cfg.path} is {cfg.draft_vocab_size}")
    if d2t.dim() != 1 or d2t.numel() != cfg.draft_vocab_size:
        raise SpeculatorsFormatError(f"{source}: d2t has shape {tuple(d2t.shape)}, expected [draft_vocab_size="
                                     f"{cfg.draft_vocab_size}]")
    try:
        validate_d2t(d2t.long() if not d2t.is_floating_point() else d2t, t2d.bool(), target_vocab_rows, source=source)
    except D2TError as e:
        raise SpeculatorsFormatError(str(e)) from None
    return torch.arange(cfg.draft_vocab_size) + d2t.long()


def load_speculators_draft(path: Path, target: CausalLM, target_head_weight: torch.Tensor,
                           dtype: torch.dtype, device: torch.device) -> SpeculatorsDraft:
    """The drafter at `path` for this target (its embedding and head weights may be shared)."""
    path = Path(path)
    cfg = SpeculatorsConfig.from_file(path / "config.json")
    cfg.check_target(target.cfg)
    tensors, origin = _read_tensors(path)
    tensors = {k.removeprefix("model."): v for k, v in tensors.items()}
    head_to_target = _vocab_tables(cfg, tensors, origin, target.cfg.vocab_size)
    for unused in ("d2t", "t2d", "verifier_lm_head.weight", "verifier_norm.weight"):
        tensors.pop(unused, None)
    shared = {}   # taken from the target: assigned, not copied
    if "embed_tokens.weight" not in tensors:
        shared["embed_tokens.weight"] = target.model.embed_tokens.weight
    if "lm_head.weight" not in tensors:
        shared["lm_head.weight"] = (target_head_weight if head_to_target is None
                                    else target_head_weight[head_to_target.to(target_head_weight.device)])
    head_rows = {**tensors, **shared}["lm_head.weight"].shape[0]
    if head_rows != cfg.draft_vocab_size:
        raise SpeculatorsFormatError(f"{origin.get('lm_head.weight', path)}: lm_head.weight has {head_rows} rows, "
                                     f"but draft_vocab_size in {cfg.path} is {cfg.draft_vocab_size}")
    with torch.device("meta"):
        if cfg.kind == "eagle3":
            module = Eagle3Draft(cfg.layer, len(cfg.aux_layer_ids), cfg.target_hidden_size, head_rows,
                                 cfg.norm_before_residual, cfg.norm_output)
        else:
            from .dspark import DSparkDraft
            module = DSparkDraft(cfg.layer, len(cfg.aux_layer_ids), cfg.target_hidden_size, head_rows,
                                 cfg.block_size, cfg.markov_rank, target.cfg.vocab_size)
    module = module.to_empty(device=device)
    module._inv_freq = rope_inv_freq(cfg.layer)
    expected = dict(module.state_dict())
    wrong_shape = [f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
                   for k, v in {**tensors, **shared}.items()
                   if k in expected and v.shape != expected[k].shape]
    if wrong_shape:
        raise SpeculatorsFormatError(f"{path}: weights do not match the config: {wrong_shape[:3]}")
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if k not in shared]
    if missing or unexpected:
        raise SpeculatorsFormatError(f"{path}: weights do not match a {cfg.kind} draft (missing {missing[:5]}, "
                                     f"unexpected {unexpected[:5]})")
    for name, weight in shared.items():
        owner = module.get_submodule(name.rsplit(".", 1)[0])
        owner.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    module = module.to(dtype=dtype).eval().requires_grad_(False)
    module._inv_freq = rope_inv_freq(cfg.layer)
    return SpeculatorsDraft(cfg, module, head_to_target, [name.split(".")[0] for name in shared])
