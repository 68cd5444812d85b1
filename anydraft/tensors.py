"""Small tensor rules that the model and speculative-decoding layers share: moving host values to the
device without a sync, and the greedy argmax (lowest id on ties)."""
from __future__ import annotations

import torch


def host_to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of host values on `device` without waiting for the device (torch.tensor(..., device=cuda)
    synchronizes the stream; the step allows one host sync, in Engine._fetch_to_host)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


_ARGMAX_CHUNK = 256


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:   # [..., V] -> [...] long
    """argmax over the vocabulary, first index on ties (as torch.argmax), NaN counting as largest.

    On CPU torch's argmax kernel is ~10x slower than its max reduction over a 150k vocabulary, so large
    vocabularies go in two passes: the max of each chunk of 256, then argmax inside the winning chunk.
    Half-precision logits are widened first (exact; float32 reductions are the fast ones on CPU).
    """
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    vocab = logits.shape[-1]
    if logits.device.type != "cpu" or vocab < 16 * _ARGMAX_CHUNK:
        return logits.argmax(dim=-1)
    logits = logits.contiguous()   # the chunk view needs it (a no-op for the widened copy)
    num_full = vocab // _ARGMAX_CHUNK
    chunk_max = logits[..., :num_full * _ARGMAX_CHUNK].unflatten(-1, (num_full, _ARGMAX_CHUNK)).amax(-1)
    if num_full * _ARGMAX_CHUNK < vocab:   # a shorter last chunk
        chunk_max = torch.cat([chunk_max, logits[..., num_full * _ARGMAX_CHUNK:].amax(-1, keepdim=True)], dim=-1)
    start = chunk_max.argmax(dim=-1) * _ARGMAX_CHUNK                                      # [...]
    # Indices of the winning chunk; past the vocabulary they repeat the last id, which cannot win a tie
    # against an earlier equal value.
    offsets = torch.arange(_ARGMAX_CHUNK, device=logits.device)
    index = (start[..., None] + offsets).clamp(max=vocab - 1)                           # [..., C]
    return start + torch.gather(logits, -1, index).argmax(dim=-1)
