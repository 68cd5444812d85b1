"""Log-probabilities of chosen tokens and their top-n alternatives, from the target's logits (pure tensor rules).

The values are vLLM's default `raw_logprobs`: log_softmax of the model's raw logits, before temperature, top-k or
top-p, so a sampled request reports the same numbers as a greedy one for the same text. They come from the logits
of the forward that verified the tokens, so speculation changes none of them. Computed in float32 (float64 for
float64 logits) over the tokenizer's tokens only: head rows past them (vocabulary padding) never appear.
Top-n: largest first, the lowest id on ties. Rank: 1 + the number of tokens with a larger logprob (vLLM's).
Both are read off one topk of a few more candidates than asked (full passes over the vocabulary only for rows whose
answer lies outside them). Everything stays on the device (on a CPU a row's need for a full pass is read on the
host, which costs no sync there); `pack` puts it in one float64 tensor for the step's one host transfer. Where the
native extension is given, bf16 logits take its kernel instead (csrc/row_logprobs.cpp): the same rules, row by
row, without writing the log_softmax; values within float32 rounding of this path's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    """Per position: the chosen token's logprob and rank, and the top-n (n may be 0)."""
    logprob: torch.Tensor       # [...] float
    rank: torch.Tensor          # [...] long, >= 1
    top_ids: torch.Tensor       # [..., n] long
    top_logprobs: torch.Tensor  # [..., n] float


def raw_logprobs(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:   # [..., V] -> [..., vocab_size]
    """log_softmax of the raw logits over the first vocab_size rows (float32; float64 stays float64)."""
    logits = logits[..., :vocab_size]
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.log_softmax(logits.to(dtype), dim=-1)


EXTRA_CANDIDATES = 16   # topk takes this many more than asked: ties at the n-th value are settled among them


def top_n(logprobs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:   # [..., V] -> [..., n] x2
    """The n largest values and their ids, largest first, the lowest id first among equal values."""
    values, ids, _ = _candidates(logprobs, n)
    return _settle_ties(logprobs, values, ids, n)


def _host_reads_free(t: torch.Tensor) -> bool:
    """Whether reading a value of t on the host costs no device sync (a CPU tensor): then rows that need a full pass
    over the vocabulary are picked out on the host; elsewhere every row takes it (cheap on an accelerator)."""
    return t.device.type == "cpu"


def _candidates(logprobs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """topk's m = n + EXTRA_CANDIDATES largest (at least 1; at most the vocabulary), sorted, ties in no set order."""
    m = min(max(n, 1) + EXTRA_CANDIDATES, logprobs.shape[-1])
    values, ids = logprobs.topk(m, dim=-1)
    return values, ids, m


def _by_value_then_id(values: torch.Tensor, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n of (value desc, id asc): sorted by id, then stably by value."""
    by_id = ids.argsort(dim=-1, stable=True)
    values, ids = values.gather(-1, by_id), ids.gather(-1, by_id)
    by_value = values.argsort(dim=-1, descending=True, stable=True)[..., :n]
    return values.gather(-1, by_value), ids.gather(-1, by_value)


def _settle_ties(logprobs: torch.Tensor, values: torch.Tensor, ids: torch.Tensor, n: int):
    """The exact top-n from topk's candidates. Every value above the n-th is among them; so is every value equal to
    it unless the last candidate equals it too (more ties than candidates: a degenerate row, uniform logits). Those
    rows choose again among all ids holding the n-th value, the lowest first (one pass over the vocabulary): on a
    CPU only where a row needs it (reading the answer costs no device sync there), elsewhere for all rows."""
    if n == 0:
        return values[..., :0], ids[..., :0]
    vocab = logprobs.shape[-1]
    fast = _by_value_then_id(values, ids, n)
    if values.shape[-1] == vocab:   # every id is a candidate
        return fast
    nth = values[..., n - 1:n]
    crowded = (values[..., -1:] == nth)[..., 0]                                                # [...]
    if _host_reads_free(logprobs) and not bool(crowded.any()):
        return fast
    positions = torch.arange(vocab, device=logprobs.device)
    at_nth = torch.where(logprobs == nth, positions, vocab).topk(n, dim=-1, largest=False).values   # lowest ids
    above = values[..., :n] > nth
    needed = n - above.sum(-1, keepdim=True)                                                  # [..., 1]
    tie_ok = (torch.arange(n, device=logprobs.device) < needed) & (at_nth < vocab)
    neg_inf = torch.tensor(float("-inf"), dtype=values.dtype, device=values.device)
    cand_values = torch.cat([torch.where(above, values[..., :n], neg_inf), torch.where(tie_ok, nth, neg_inf)], -1)
    cand_ids = torch.cat([torch.where(above, ids[..., :n], vocab), torch.where(tie_ok, at_nth, vocab)], -1)
    # Unused slots (-inf, id vocab) sort last; a row with fewer than n finite values keeps -inf entries of the
    # lowest ids holding them.
    slow_values, slow_ids = _by_value_then_id(cand_values, cand_ids, n)
    slow_ids = slow_ids.clamp(max=vocab - 1)
    keep = crowded[..., None]
    return torch.where(keep, slow_values, fast[0]), torch.where(keep, slow_ids, fast[1])


def _ranks(logprobs: torch.Tensor, chosen: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """1 + how many values exceed the chosen one [..., 1] -> [...]. Where the chosen value reaches the last candidate
    every larger value is a candidate, so counting those is exact; other rows (a sampled unlikely token) count over
    the vocabulary: on a CPU only those rows, elsewhere all."""
    fast = (values > chosen).sum(-1) + 1
    inside = (chosen >= values[..., -1:])[..., 0]
    if _host_reads_free(logprobs):
        if bool(inside.all()):
            return fast
        outside = (~inside).nonzero(as_tuple=True)
        fast[outside] = (logprobs[outside] > chosen[outside]).sum(-1) + 1
        return fast
    return torch.where(inside, fast, (logprobs > chosen).sum(-1) + 1)


def token_logprobs(logits: torch.Tensor,     # [..., V] raw logits
                   token_ids: torch.Tensor,  # [...] chosen ids (negative = none there: its entry is meaningless)
                   num_top: int, vocab_size: int, kernel=None) -> TokenLogprobs:
    """kernel: the native extension (ModelRunner.logprob_kernel) or None; with it, bf16 logits on the CPU are read
    row by row without writing their log_softmax (csrc/row_logprobs.cpp: the same rules, its own summation order)."""
    if kernel is not None and logits.dtype == torch.bfloat16 and logits.device.type == "cpu":
        return _native_token_logprobs(kernel, logits, token_ids, num_top, vocab_size)
    logprobs = raw_logprobs(logits, vocab_size)
    chosen = logprobs.gather(-1, token_ids.long().clamp(0, vocab_size - 1)[..., None])           # [..., 1]
    values, ids, _ = _candidates(logprobs, num_top)
    top_values, top_ids = _settle_ties(logprobs, values, ids, num_top)
    return TokenLogprobs(chosen[..., 0], _ranks(logprobs, chosen, values), top_ids, top_values)


def _native_token_logprobs(kernel, logits: torch.Tensor, token_ids: torch.Tensor, num_top: int,
                           vocab_size: int) -> TokenLogprobs:
    rows = logits.reshape(-1, logits.shape[-1]).contiguous()                                  # [R, V]
    chosen = token_ids.reshape(-1).long().clamp(max=vocab_size - 1)   # [R]; negative: skipped (no token there)
    logprob, rank, top_ids, top_values = kernel.row_logprobs(rows, chosen, vocab_size, num_top,
                                                             max(num_top, 1) + EXTRA_CANDIDATES)
    shape = logits.shape[:-1]
    return TokenLogprobs(logprob.view(shape), rank.view(shape), top_ids.view(*shape, num_top),
                         top_values.view(*shape, num_top))


def pack(out: TokenLogprobs) -> torch.Tensor:   # [..., 2 + 2n] float64: logprob, rank, top ids, top logprobs
    """One tensor for the host transfer: float64 holds float32 values and ids below 2**53 exactly."""
    return torch.cat([out.logprob[..., None].double(), out.rank[..., None].double(), out.top_ids.double(),
                      out.top_logprobs.double()], dim=-1)


def unpack(values: list[float], num_top: int) -> tuple[float, int, list[tuple[int, float]]]:
    """One position of `pack` (as a host list) -> (logprob, rank, [(id, logprob)] of its first num_top).
    The packed width may be larger than num_top (the step's largest n); a row keeps its own."""
    n = (len(values) - 2) // 2
    return values[0], int(values[1]), [(int(values[2 + i]), values[2 + n + i]) for i in range(num_top)]
