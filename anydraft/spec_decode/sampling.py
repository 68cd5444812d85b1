"""Turning logits into probabilities and drawing tokens under per-row request settings.

Everything here is a pure tensor function: randomness comes in as explicit uniforms (drawn per row by
`RowRandom`), so a seeded request reproduces whatever its batch-mates are. A token costs one uniform (inverse
CDF), not one random number per vocabulary entry: over a 150k vocabulary the draws would cost more than the
softmax and the output head together.
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from ..tensors import greedy_argmax


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def safe_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where -inf gives exactly 0 and a row of only -inf gives all zeros (not NaN)."""
    # torch's fused kernel (one pass for the max, one for exp and sum, one to normalize) is 2x faster on CPU than
    # the same steps as separate ops; it gives NaN only for a row without a finite logit (then every entry is
    # NaN), whose mass is 0. On CPU a look at each row's first entry is free and spares the fix-up pass.
    probs = torch.softmax(logits, dim=-1)
    if probs.device.type == "cpu" and not probs[..., 0].isnan().any():
        return probs
    return probs.nan_to_num_(nan=0.0)


# The logits a top-k / top-p cut is first looked for among (torch.topk), instead of sorting the vocabulary: on a
# 152k vocabulary the sort cost 2.8 ms a decode step at batch 1 (more than the logits), the selection ~0.2 ms. Where
# a row's cut lies beyond them (top_k larger, a nucleus wider, ties past them), 64 times as many are selected, and
# only past those the whole vocabulary is sorted (a flat distribution at top-p 0.9 keeps thousands of tokens; the
# sort of 16 rows of 152k float64 logits took 29 ms).
TOP_SELECTED = 256
TOP_SELECTED_WIDE = 64 * TOP_SELECTED


def _mask_top_k_top_p(scaled_logits: torch.Tensor,   # [B, S, V]
                      top_k: torch.Tensor | None,    # [B]
                      top_p: torch.Tensor | None,    # [B]
                      ) -> torch.Tensor:             # [B, S, V]
    """Set logits outside each row's top-k / top-p set to -inf (top-k first, then top-p on what is left).

    Both cuts become a threshold on the logit value, so tokens tied at the boundary are all kept and
    the result does not depend on how the sort orders ties.
    """
    return scaled_logits.masked_fill(scaled_logits < cutoff_of(scaled_logits, top_k, top_p), float("-inf"))


def cutoff_of(scaled_logits: torch.Tensor,   # [B, S, V]
              top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:   # [B, S, 1]
    """The smallest scaled logit each row keeps (cutoff_from_top), from the fewest largest logits that decide it."""
    vocab_size = scaled_logits.shape[-1]
    log_mass = None   # the vocabulary's, computed once for every selection tried
    if top_p is not None and (top_k is None or not bool((top_k > 0).all())):
        log_mass = torch.logsumexp(scaled_logits, dim=-1, keepdim=True)
    for selected in (TOP_SELECTED, TOP_SELECTED_WIDE):
        if selected < vocab_size:
            cutoff = cutoff_from_top(scaled_logits.topk(selected, dim=-1).values, top_k, top_p, vocab_size, log_mass)
            if cutoff is not None:
                return cutoff
    return cutoff_from_top(scaled_logits.sort(dim=-1, descending=True).values, top_k, top_p, vocab_size)


def cutoff_from_top(top: torch.Tensor,   # [B, S, M] the M largest scaled logits of each row, descending
                    top_k: torch.Tensor | None, top_p: torch.Tensor | None,   # [B] each, as logits_to_probs
                    vocab_size: int,
                    log_mass: torch.Tensor | None = None,   # [B, S, 1] logsumexp of all: top-p rows without top-k
                    ) -> torch.Tensor | None:               # [B, S, 1]
    """The cut of every row (cutoff_and_decided), or None where the M largest do not decide it for some row (the
    caller then passes all V of them, sorted)."""
    cutoff, decided = cutoff_and_decided(top, top_k, top_p, vocab_size, log_mass)
    return cutoff if decided is None or bool(decided.all()) else None


def cutoff_and_decided(top: torch.Tensor,   # [B, S, M] the M largest scaled logits of each row, descending
                       top_k: torch.Tensor | None, top_p: torch.Tensor | None,   # [B] each, as logits_to_probs
                       vocab_size: int,
                       log_mass: torch.Tensor | None = None,   # [B, S, 1] logsumexp of all: top-p rows without top-k
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:   # [B, S, 1] each
    """The smallest scaled logit each row keeps: the k-th largest (top-k), then the last of the smallest prefix of
    the sorted distribution left whose mass reaches top_p (the mass strictly before a kept token is < top_p); and
    where the M largest decide it (None: all of them are given, M = V). An undecided row's cut is meaningless."""
    batch, seq, _ = top.shape
    selected = top.shape[-1]
    partial = selected < vocab_size
    decided = torch.ones(batch, seq, 1, dtype=torch.bool, device=top.device) if partial else None
    cutoff = torch.full((batch, seq, 1), float("-inf"), dtype=top.dtype, device=top.device)
    limited = torch.zeros(batch, 1, 1, dtype=torch.bool, device=top.device)   # rows with a top-k cut
    if top_k is not None:
        limited = (top_k > 0).view(batch, 1, 1)
        k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), selected).long().view(batch, 1, 1)
        if partial:
            decided &= k <= selected
        # A row without a top-k cut keeps every token: its k-th logit is -inf (a top-p row beside top-k rows is
        # then decided here too, not by a sort of the vocabulary).
        kth_logit = top.gather(-1, (k.clamp(max=selected) - 1).expand(batch, seq, 1))
        kth_logit = kth_logit.masked_fill(~limited, float("-inf"))
        # Tokens tied with the k-th past the selection would count in the mass top-p divides by.
        if partial and top_p is not None:
            decided &= ~(limited & (top[..., -1:] >= kth_logit))
        top = top.masked_fill(top < kth_logit, float("-inf"))
        cutoff = kth_logit
    if top_p is not None:
        top_p_b = top_p.to(top.dtype).view(batch, 1, 1)
        # The mass is over what top-k left: the kept selection where a row has a top-k cut, else the vocabulary.
        kept_mass = torch.logsumexp(top, dim=-1, keepdim=True)
        if partial and not bool(limited.all()):   # the vocabulary's mass for rows without a top-k cut
            log_mass = torch.where(limited, kept_mass, log_mass)
        else:
            log_mass = kept_mass
        sorted_probs = (top - log_mass).exp().nan_to_num_(nan=0.0)                  # [B, S, M]
        mass_before = torch.nn.functional.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
        num_kept = (mass_before < top_p_b).sum(dim=-1, keepdim=True).clamp(min=1)
        if partial:   # the nucleus may go on past them
            decided &= ~((num_kept == selected) & (top_p_b < 1.0))
        top_p_logit = top.gather(-1, num_kept - 1)
        top_p_logit = torch.where(top_p_b >= 1.0, float("-inf"), top_p_logit)
        cutoff = torch.maximum(cutoff, top_p_logit)
    return cutoff, decided


def logits_to_probs(logits: torch.Tensor,                # [B, S, V]
                    temperature: torch.Tensor,           # [B] 0 = greedy
                    top_k: torch.Tensor | None = None,   # [B] 0 or -1 = off; None = off for every row
                    top_p: torch.Tensor | None = None,   # [B] 1.0 = off; None = off for every row
                    any_greedy: bool = True,             # False: the caller knows no row is greedy
                    ) -> torch.Tensor:                   # [B, S, V] float32 (float64 for float64 input)
    """Probabilities each row samples from: temperature, then top-k, then top-p, renormalized.

    Rows with temperature 0 get a one-hot of the argmax of the raw logits, so greedy and sampled rows
    can share a batch and one verification path. -inf logits get probability exactly 0.
    Passing None for top_k / top_p skips the vocabulary sort when no row in the batch uses it, and
    any_greedy=False (a host fact: `SamplingBatch.any_greedy`) skips the one-hot pass.
    """
    compute_dtype = _compute_dtype(logits.dtype)
    batch = logits.shape[0]
    temperature = temperature.to(device=logits.device, dtype=compute_dtype)
    greedy_ids = greedy_argmax(logits)[..., None] if any_greedy else None   # of the raw logits: [B, S, 1]
    # Greedy rows divide by 1: their probabilities are replaced by the one-hot below anyway.
    safe_temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    # Widened into a fresh buffer, then divided in place (a mixed bf16 / float32 division is slower on CPU).
    scaled_logits = logits.to(compute_dtype, copy=True).div_(safe_temperature.view(batch, 1, 1))
    if top_k is not None or top_p is not None:
        scaled_logits = _mask_top_k_top_p(
            scaled_logits,
            None if top_k is None else top_k.to(logits.device),
            None if top_p is None else top_p.to(logits.device))
    probs = safe_softmax(scaled_logits)
    if greedy_ids is None:
        return probs
    greedy = (temperature <= 0).view(batch, 1, 1)
    # Greedy rows: zero everywhere, then 1 at the argmax; sampled rows write their own value back there.
    at_argmax = torch.where(greedy, 1.0, probs.gather(-1, greedy_ids))
    return probs.masked_fill_(greedy, 0.0).scatter_(-1, greedy_ids, at_argmax)


_CDF_CHUNK = 256


def sample_from_probs(probs: torch.Tensor,      # [..., V] (unnormalized is fine)
                      uniforms: torch.Tensor,   # [...] U[0, 1), float64 for full resolution
                      ) -> torch.Tensor:        # [...] long
    """Draw one token per row by inverse CDF: the first token whose cumulative mass exceeds u * total.

    P(i) = probs[i] / sum(probs) up to float64 rounding: sums run in float64, so a token's share is off by
    about V * 2^-53 of the total at most (a float32 cumulative sum would lose tail tokens of mass < 2^-24).
    Zero-probability tokens are never drawn. A large vocabulary goes in two levels, as `greedy_argmax` does:
    the chunk of 256 tokens holding u * total (from the chunks' sums, a fast reduction), then the token in it
    (a cumulative sum over its 256 only); one float64 cumulative sum over 150k entries costs more than the
    softmax before it.
    """
    vocab = probs.shape[-1]
    threshold = uniforms.to(device=probs.device, dtype=torch.float64)[..., None]          # [..., 1]
    if probs.device.type != "cpu" or vocab < 16 * _CDF_CHUNK:
        cdf = probs.to(torch.float64).cumsum(dim=-1)                                      # [..., V]
        drawn = torch.searchsorted(cdf, threshold * cdf[..., -1:], right=True).squeeze(-1)
        return drawn.clamp_(max=vocab - 1)   # an all-zero row (no mass to draw) gives its last index
    probs = probs.contiguous()
    num_full = vocab // _CDF_CHUNK
    chunk_mass = probs[..., :num_full * _CDF_CHUNK].unflatten(-1, (num_full, _CDF_CHUNK)).sum(-1, dtype=torch.float64)
    if num_full * _CDF_CHUNK < vocab:   # a shorter last chunk
        chunk_mass = torch.cat([chunk_mass, probs[..., num_full * _CDF_CHUNK:].sum(-1, keepdim=True,
                                                                                  dtype=torch.float64)], dim=-1)
    chunk_cdf = chunk_mass.cumsum(dim=-1)                                                  # [..., C]
    threshold = threshold * chunk_cdf[..., -1:]                                           # [..., 1]
    chunk = torch.searchsorted(chunk_cdf, threshold, right=True).clamp_(max=chunk_cdf.shape[-1] - 1)   # [..., 1]
    # Mass before the chosen chunk: threshold - it >= 0 exactly, since chunk_cdf[chunk - 1] <= threshold.
    before = torch.where(chunk > 0, chunk_cdf.gather(-1, (chunk - 1).clamp_(min=0)), 0.0)
    offsets = torch.arange(_CDF_CHUNK, device=probs.device)
    index = chunk * _CDF_CHUNK + offsets                                                  # [..., 256]
    inside = index < vocab
    local = torch.where(inside, probs.gather(-1, index.clamp(max=vocab - 1)), 0).to(torch.float64)
    local_cdf = local.cumsum(dim=-1)                                                      # [..., 256]
    position = torch.searchsorted(local_cdf, threshold - before, right=True)             # [..., 1]
    # The chunk's own cumulative sum may round a hair below its reduced sum: stay on its last token with mass.
    last_with_mass = torch.where(local > 0, offsets, 0).amax(dim=-1, keepdim=True)
    return (chunk * _CDF_CHUNK + torch.minimum(position, last_with_mass)).squeeze(-1)


_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _splitmix64(state: int) -> int:
    """splitmix64's output function on a 64-bit state (taken modulo 2**64): a bijection whose outputs for states
    one gamma apart pass as independent 64-bit draws. Python ints: a step needs a few keys a row, and in place
    (after a forward has filled the caches) this costs ~10 us where the same in numpy cost 50-90 us."""
    z = state & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class RowRandom:
    """The random stream of one request: a torch.Generator on the device, seeded from the request, and the base of
    its counter-based noise keys (`draw_keys`).

    Every draw for a row comes from its own generator or keys, so a seeded request gets the same noise (and so
    the same output, for the same models and device) regardless of which requests share its batch.
    """

    def __init__(self, seed: int | None, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()  # non-deterministic seed for unseeded requests
            self.noise_base = secrets.randbits(64)
        else:   # a 64-bit seed, signed or not (torch reads it modulo 2**64 too)
            self.generator.manual_seed(seed)
            # On the host, from the seed alone: the keys of a token position need no draw from the stream.
            self.noise_base = _splitmix64(seed)

    def uniform(self, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:   # [k] in [0, 1)
        return torch.rand(k, generator=self.generator, device=self.device, dtype=dtype)


def draw_uniforms(row_randoms: Sequence[RowRandom | None], num: int,
                  device: torch.device | str) -> torch.Tensor:   # [B, num] float64
    """The one greedy-vs-sampling noise rule for drawing tokens: row i draws `num` float64 uniforms (one per
    token it samples, see `sample_from_probs`) from row_randoms[i]; a None entry is a greedy row (one-hot
    probs), which draws nothing and gets 0, which `sample_from_probs` turns into its argmax."""
    uniforms = torch.zeros(len(row_randoms), num, dtype=torch.float64)
    for row, row_random in enumerate(row_randoms):
        if row_random is not None:
            uniforms[row] = row_random.uniform(num, torch.float64)
    return uniforms.to(device, non_blocking=True)


def draw_keys(row_randoms: Sequence[RowRandom], positions: Sequence[int], num: int,
              device: torch.device | str) -> torch.Tensor:   # [B, num] int64
    """Row i's noise keys (int64, every bit random) for its output positions positions[i] .. positions[i] + num - 1:
    splitmix64's output number `position + 1` from the row's noise_base. A native sampling head (NativeHead.sample)
    derives the noise of every vocabulary entry from one key, and a token's key depends on its request and output
    position only, not on how many tokens a step drafted: the tokens a seeded request samples are the same with any
    k (adaptive's choices follow the load), any batch and any draft, and equal the target alone's. Every row samples
    (no None entries)."""
    keys = [[_splitmix64(row.noise_base + n * _GOLDEN_GAMMA) for n in range(first + 1, first + num + 1)]
            for row, first in zip(row_randoms, positions)]
    signed = [[key - (1 << 64) if key >> 63 else key for key in row] for row in keys]   # int64's bits
    return torch.tensor(signed, dtype=torch.long).reshape(len(row_randoms), num).to(device, non_blocking=True)


def draw_noise(row_randoms: Sequence[RowRandom | None], k: int,
               device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise for one verification step: (accept uniforms # [B, k], token uniforms # [B] float64).

    One token uniform per row, not one per position: a row draws a single token per step (recovered or
    bonus), from an independent uniform. Row i's noise comes only from row_randoms[i]'s generator (see
    RowRandom). A None entry is a greedy row: uniforms 0 make `verify_sampling` accept exactly when the
    draft token is the target argmax and emit the argmax otherwise.
    """
    uniforms = torch.zeros(len(row_randoms), k)
    for row, row_random in enumerate(row_randoms):
        if row_random is not None:
            uniforms[row] = row_random.uniform(k)
    return uniforms.to(device, non_blocking=True), draw_uniforms(row_randoms, 1, device)[:, 0]
