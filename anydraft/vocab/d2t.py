"""Reduced draft-head tables in the speculators (EAGLE-3) convention: d2t offsets and the t2d mask.

`d2t[i]` is an offset: target_id = i + d2t[i] for draft row i < N; `t2d` is a bool mask over the
target vocabulary with exactly N trues, at those target ids. The mapping is strictly increasing.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..atomic_file import save_safetensors_atomically


class D2TError(ValueError):
    """A d2t/t2d table that does not describe a valid reduced vocabulary."""


def count_target_tokens(target_ids: Iterable[int] | torch.Tensor, target_vocab: int) -> torch.Tensor:
    """[V_target] int64 occurrence counts of target ids in a corpus."""
    target_ids = torch.as_tensor(target_ids if isinstance(target_ids, torch.Tensor) else list(target_ids),
                                 dtype=torch.long).flatten()  # [N_corpus]
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= target_vocab):
        raise D2TError(f"corpus target ids must lie in [0, {target_vocab}): found "
                       f"{int(target_ids.min())}..{int(target_ids.max())}")
    return torch.bincount(target_ids, minlength=target_vocab)


def build_d2t(target_token_counts: torch.Tensor | Sequence[int], num_draft_tokens: int, target_vocab: int,
              always_include: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the `num_draft_tokens` most frequent target ids (ties -> lower id), plus `always_include`
    (e.g. eos) whatever their count. Returns d2t [N] int64 offsets and t2d [V_target] bool."""
    counts = torch.as_tensor(target_token_counts, dtype=torch.float64).flatten().clone()  # [V_target]
    if counts.numel() != target_vocab:
        raise D2TError(f"target_token_counts has {counts.numel()} entries, expected target_vocab={target_vocab}")
    if not 0 < num_draft_tokens <= target_vocab:
        raise D2TError(f"num_draft_tokens must be in [1, {target_vocab}], got {num_draft_tokens}")
    forced = sorted(set(int(t) for t in always_include))
    if forced and not (0 <= forced[0] and forced[-1] < target_vocab):
        raise D2TError(f"always_include ids must lie in [0, {target_vocab}): {forced}")
    if len(forced) > num_draft_tokens:
        raise D2TError(f"always_include has {len(forced)} ids, more than num_draft_tokens={num_draft_tokens}")
    counts[forced] = float("inf")
    # A stable descending sort keeps equal counts in id order, so ties go to the lower id.
    order = torch.sort(counts, descending=True, stable=True).indices  # [V_target]
    kept_target_ids = torch.sort(order[:num_draft_tokens]).values    # [N] strictly increasing
    d2t = kept_target_ids - torch.arange(num_draft_tokens, dtype=torch.long)  # [N]
    t2d = torch.zeros(target_vocab, dtype=torch.bool)  # [V_target]
    t2d[kept_target_ids] = True
    return d2t, t2d


def build_d2t_from_ids(target_ids: Iterable[int] | torch.Tensor, num_draft_tokens: int, target_vocab: int,
                       always_include: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """build_d2t over the token counts of a corpus of target ids."""
    return build_d2t(count_target_tokens(target_ids, target_vocab), num_draft_tokens, target_vocab, always_include)


def validate_d2t(d2t: torch.Tensor, t2d: torch.Tensor, target_vocab: int, source: str = "<in memory>") -> None:
    """Raise D2TError naming `source` and the first bad index unless (d2t, t2d) is consistent."""
    if d2t.dim() != 1 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise D2TError(f"{source}: d2t must be a 1-D integer tensor, got {tuple(d2t.shape)} {d2t.dtype}")
    if t2d.dim() != 1 or t2d.dtype != torch.bool:
        raise D2TError(f"{source}: t2d must be a 1-D bool tensor, got {tuple(t2d.shape)} {t2d.dtype}")
    if t2d.numel() != target_vocab:
        raise D2TError(f"{source}: t2d has length {t2d.numel()}, expected target_vocab={target_vocab}")
    num_draft = d2t.numel()
    if not 0 < num_draft <= target_vocab:
        raise D2TError(f"{source}: d2t has length {num_draft}, expected 1..{target_vocab}")
    target_ids = torch.arange(num_draft, dtype=torch.long) + d2t.long()  # [N]
    out_of_range = torch.nonzero((target_ids < 0) | (target_ids >= target_vocab)).flatten()
    if out_of_range.numel():
        i = int(out_of_range[0])
        raise D2TError(f"{source}: d2t[{i}]={int(d2t[i])} maps draft id {i} to target id {int(target_ids[i])}, "
                       f"outside [0, {target_vocab})")
    not_increasing = torch.nonzero(target_ids[1:] <= target_ids[:-1]).flatten()
    if not_increasing.numel():
        i = int(not_increasing[0]) + 1
        raise D2TError(f"{source}: d2t is not strictly increasing at index {i} (target id {int(target_ids[i])} "
                       f"after {int(target_ids[i - 1])}), so the mapping is not injective")
    if int(t2d.sum()) != num_draft:
        mask_ids = torch.nonzero(t2d).flatten()
        common = min(len(mask_ids), num_draft)
        diff = torch.nonzero(mask_ids[:common] != target_ids[:common]).flatten()
        i = int(diff[0]) if diff.numel() else common
        raise D2TError(f"{source}: t2d has {int(t2d.sum())} trues but d2t has {num_draft} entries "
                       f"(first disagreement at draft index {i})")
    missing = torch.nonzero(~t2d[target_ids]).flatten()
    if missing.numel():
        i = int(missing[0])
        raise D2TError(f"{source}: t2d[{int(target_ids[i])}] is False but d2t maps draft id {i} there")


def save_d2t(path: str | Path, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Write both tables to one safetensors file atomically (temp file + os.replace)."""
    path = Path(path)
    validate_d2t(d2t, t2d, t2d.numel(), source=str(path))
    save_safetensors_atomically(path, {"d2t": d2t.long().contiguous(), "t2d": t2d.contiguous()})


def load_d2t(path: str | Path, target_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read and validate (d2t [N] int64, t2d [V_target] bool)."""
    path = Path(path)
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise D2TError(f"{path}: cannot read d2t tables ({e})") from e
    missing = [name for name in ("d2t", "t2d") if name not in tensors]
    if missing:
        raise D2TError(f"{path}: missing tensor(s) {missing}; found {sorted(tensors)}")
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    validate_d2t(d2t, t2d, target_vocab, source=str(path))
    return d2t.long(), t2d
