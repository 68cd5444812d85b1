"""Turning logits into probabilities and drawing tokens under per-row request settings.

Everything here is a pure tensor function: randomness comes in as explicit noise tensors
(drawn per row by `RowRandom`), so a seeded request reproduces whatever its batch-mates are.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..tensors import greedy_argmax


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def safe_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where -inf gives exactly 0 and a row of only -inf gives all zeros (not NaN)."""
    row_max = logits.amax(dim=-1, keepdim=True)
    # An all -inf row would make (-inf) - (-inf) = NaN; shifting it by 0 keeps every exp at 0.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = (logits - row_max).exp()
    return exp / exp.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(exp.dtype).tiny)


def _mask_top_k_top_p(scaled_logits: torch.Tensor,   # [B, S, V]
                      top_k: torch.Tensor | None,    # [B]
                      top_p: torch.Tensor | None,    # [B]
                      ) -> torch.Tensor:             # [B, S, V]
    """Set logits outside each row's top-k / top-p set to -inf (top-k first, then top-p on what is left).

    Both cuts become a threshold on the logit value, so tokens tied at the boundary are all kept and
    the result does not depend on how the sort orders ties.
    """
    batch, seq, vocab_size = scaled_logits.shape
    sorted_logits = scaled_logits.sort(dim=-1, descending=True).values          # [B, S, V]
    cutoff = torch.full((batch, seq, 1), float("-inf"), dtype=scaled_logits.dtype,
                        device=scaled_logits.device)                            # keep logits >= cutoff
    if top_k is not None:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), vocab_size).long()
        kth_logit = sorted_logits.gather(-1, (k - 1).view(batch, 1, 1).expand(batch, seq, 1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_logit, float("-inf"))
        cutoff = kth_logit
    if top_p is not None:
        top_p_b = top_p.to(scaled_logits.dtype).view(batch, 1, 1)
        sorted_probs = safe_softmax(sorted_logits)
        # Keep token i while the mass strictly before it is < top_p: the smallest prefix reaching top_p.
        mass_before = torch.nn.functional.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
        num_kept = (mass_before < top_p_b).sum(dim=-1, keepdim=True).clamp(min=1)
        top_p_logit = sorted_logits.gather(-1, num_kept - 1)
        top_p_logit = torch.where(top_p_b >= 1.0, float("-inf"), top_p_logit)
        cutoff = torch.maximum(cutoff, top_p_logit)
    return scaled_logits.masked_fill(scaled_logits < cutoff, float("-inf"))


def logits_to_probs(logits: torch.Tensor,                # [B, S, V]
                    temperature: torch.Tensor,           # [B] 0 = greedy
                    top_k: torch.Tensor | None = None,   # [B] 0 or -1 = off; None = off for every row
                    top_p: torch.Tensor | None = None,   # [B] 1.0 = off; None = off for every row
                    ) -> torch.Tensor:                   # [B, S, V] float32 (float64 for float64 input)
    """Probabilities each row samples from: temperature, then top-k, then top-p, renormalized.

    Rows with temperature 0 get a one-hot of the argmax of the raw logits, so greedy and sampled rows
    can share a batch and one verification path. -inf logits get probability exactly 0.
    Passing None for top_k / top_p skips the vocabulary sort when no row in the batch uses it.
    """
    compute_dtype = _compute_dtype(logits.dtype)
    logits = logits.to(compute_dtype)
    batch = logits.shape[0]
    temperature = temperature.to(device=logits.device, dtype=compute_dtype)
    # Greedy rows divide by 1: their probabilities are replaced by the one-hot below anyway.
    safe_temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled_logits = logits / safe_temperature.view(batch, 1, 1)
    if top_k is not None or top_p is not None:
        scaled_logits = _mask_top_k_top_p(
            scaled_logits,
            None if top_k is None else top_k.to(logits.device),
            None if top_p is None else top_p.to(logits.device))
    probs = safe_softmax(scaled_logits)
    greedy_probs = torch.zeros_like(probs).scatter_(-1, greedy_argmax(logits)[..., None], 1.0)
    return torch.where((temperature <= 0).view(batch, 1, 1), greedy_probs, probs)


def sample_from_probs(probs: torch.Tensor,          # [..., V] (unnormalized is fine)
                      exponentials: torch.Tensor,   # [..., V] i.i.d. Exp(1)
                      ) -> torch.Tensor:            # [...] long
    """Draw one token per row by the exponential race argmax(probs / E), which is exactly ~ probs.

    P(argmax = i) = probs[i] / sum(probs), since min_j E_j / probs_j is exponential with rate sum(probs).
    Zero-probability tokens are never drawn; E is clamped above 0 so 0 / 0 cannot produce a NaN winner.
    """
    tiny = torch.finfo(exponentials.dtype).tiny
    return (probs / exponentials.clamp_min(tiny)).argmax(dim=-1)


class RowRandom:
    """The random stream of one request: a torch.Generator on the device, seeded from the request.

    Every draw for a row comes from its own generator, so a seeded request gets the same noise (and so
    the same output, for the same models, k and device) regardless of which requests share its batch.
    """

    def __init__(self, seed: int | None, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()  # non-deterministic seed for unseeded requests
        else:
            self.generator.manual_seed(seed)

    def uniform(self, k: int) -> torch.Tensor:                       # [k] in [0, 1)
        return torch.rand(k, generator=self.generator, device=self.device)

    def exponential(self, n: int, vocab_size: int) -> torch.Tensor:  # [n, vocab_size] Exp(1)
        return torch.empty(n, vocab_size, device=self.device).exponential_(generator=self.generator)


def draw_exponentials(row_randoms: Sequence[RowRandom | None], num: int, vocab_size: int,
                      device: torch.device | str) -> torch.Tensor:   # [B, num, vocab_size]
    """The one greedy-vs-sampling noise rule: row i draws `num` Exp(1) vectors from row_randoms[i]; a None entry
    is a greedy row (one-hot probs), which draws nothing and gets ones, so `sample_from_probs` returns its
    argmax. Greedy rows of a mixed batch thus spend no draw over the vocabulary."""
    exponentials = torch.ones(len(row_randoms), num, vocab_size)
    for row, row_random in enumerate(row_randoms):
        if row_random is not None:
            exponentials[row] = row_random.exponential(num, vocab_size)
    return exponentials.to(device, non_blocking=True)


def draw_noise(row_randoms: Sequence[RowRandom | None], k: int, vocab_size: int,
               device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise for one verification step: (uniforms # [B, k], exponentials # [B, vocab_size]).

    One Exp(1) vector per row, not one per position: a row draws a single token per step (recovered or
    bonus), and over a 150k vocabulary these draws are the costliest part of a sampling step on CPU.
    Row i's noise comes only from row_randoms[i]'s generator (see RowRandom). A None entry is a greedy row
    (`draw_exponentials`' rule): uniforms 0 and exponentials 1 make `verify_sampling` accept exactly when the
    draft token is the target argmax and emit the argmax otherwise.
    """
    uniforms = torch.zeros(len(row_randoms), k)
    for row, row_random in enumerate(row_randoms):
        if row_random is not None:
            uniforms[row] = row_random.uniform(k)
    return uniforms.to(device, non_blocking=True), draw_exponentials(row_randoms, 1, vocab_size, device)[:, 0]
