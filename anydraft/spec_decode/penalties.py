"""Penalties and logit bias on the target's logits, at every position a step verifies.

vLLM's (and OpenAI's) definitions, in vLLM's order: the bias is added, then repetition (a seen token's logit divided
by the penalty where positive, multiplied where negative; seen = in the prompt or the output so far), then
frequency and presence (the logit minus frequency x count minus presence x [count > 0], counting output tokens).

Inside a speculative step position i follows the drafts before it, so its counts are the output's counts plus those
of drafts 0..i-1: a draft accepted at position i changes what position i+1 sees, exactly as in the target alone.
Only the draft tokens' own logits differ between positions, so the per-position part is [B, k+1, k] values (the
drafts' logits at each position), scattered over one penalized copy of the logits; never a [B, k+1, V] of counts.
Pure tensor functions; `penalty_batch` builds the inputs from the requests' host lists (one transfer each).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tensors import host_to_device


@dataclass
class PenaltyBatch:
    """The penalized rows of a batch and what their penalties read (all on the logits' device)."""
    rows: torch.Tensor            # [R] long: the batch rows with a penalty or a bias
    output_counts: torch.Tensor   # [R, V] float: times each target id occurs in the row's output so far
    prompt_seen: torch.Tensor     # [R, V] bool: the target ids of the row's prompt
    presence: torch.Tensor        # [R] float64 (the request's values; cast to the logits' precision when applied)
    frequency: torch.Tensor       # [R] float64
    repetition: torch.Tensor      # [R] float64 > 0, 1 = off
    bias: torch.Tensor | None     # [R, V] float64 added to the logits; None when no row has one


def penalty_batch(requests: list, vocab_rows: int, device: torch.device) -> PenaltyBatch | None:
    """The batch's penalties, or None when no request has one (the common case costs one pass over the params)."""
    index = [i for i, r in enumerate(requests) if r.params.penalized]
    if not index:
        return None
    chosen = [requests[i] for i in index]
    params = [r.params for r in chosen]

    def flat(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:   # (row of each id, the ids) [N] each
        rows = [j for j, ids in enumerate(lists) for _ in ids]
        return (host_to_device(rows, device, torch.long), host_to_device([t for ids in lists for t in ids], device,
                                                                         torch.long))

    output_counts = torch.zeros(len(chosen), vocab_rows, device=device)
    output_counts.index_put_(flat([r.output_target_ids for r in chosen]),
                             torch.ones((), device=device), accumulate=True)
    prompt_seen = torch.zeros(len(chosen), vocab_rows, dtype=torch.bool, device=device)
    if any(p.repetition_penalty != 1.0 for p in params):   # only repetition reads the prompt
        prompt_seen[flat([r.prompt_target_ids for r in chosen])] = True
    bias = None
    if any(p.logit_bias for p in params):
        bias = torch.zeros(len(chosen), vocab_rows, dtype=torch.float64, device=device)
        biased = [sorted((p.logit_bias or {}).items()) for p in params]
        rows, ids = flat([[target_id for target_id, _ in pairs] for pairs in biased])
        bias[rows, ids] = host_to_device([value for pairs in biased for _, value in pairs], device, torch.float64)
    return PenaltyBatch(rows=host_to_device(index, device, torch.long), output_counts=output_counts,
                        prompt_seen=prompt_seen,
                        presence=host_to_device([p.presence_penalty for p in params], device, torch.float64),
                        frequency=host_to_device([p.frequency_penalty for p in params], device, torch.float64),
                        repetition=host_to_device([p.repetition_penalty for p in params], device, torch.float64),
                        bias=bias)


def _penalize_values(logits: torch.Tensor,       # [R, ...] biased logits of some tokens
                     counts: torch.Tensor,       # [R, ...] their output counts at that position
                     prompt_seen: torch.Tensor,  # [R, ...] bool
                     batch: PenaltyBatch) -> torch.Tensor:
    """Repetition, then frequency and presence, on values laid out row-first (the one formula both passes use)."""
    shape = (-1,) + (1,) * (logits.dim() - 1)
    repetition = batch.repetition.to(logits.dtype).view(shape)
    seen = prompt_seen | (counts > 0)
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, scaled, logits)
    return (logits - batch.frequency.to(logits.dtype).view(shape) * counts
            - batch.presence.to(logits.dtype).view(shape) * (counts > 0).to(logits.dtype))


def penalize(logits: torch.Tensor,                        # [B, S, V_target] raw, S = drafts + 1
             batch: PenaltyBatch | None,
             draft_target_ids: torch.Tensor | None = None,  # [B, S-1] the drafts position i follows 0..i-1 of
             ) -> torch.Tensor:                           # [B, S, V_target] float32 (float64 for float64 input)
    """The logits the target samples (or takes the argmax of) at each position; the input where batch is None.
    Rows outside batch.rows are unchanged; a new tensor where any row is penalized (the raw logits stay, for logprobs).
    Drafts past a row's own count may be anything: they change only positions verification does not read."""
    if batch is None:
        return logits
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = logits.to(compute, copy=True)
    chosen = out[batch.rows]                                                           # [R, S, V]
    if batch.bias is not None:
        chosen += batch.bias[:, None, :].to(compute)
    biased = chosen.clone() if draft_target_ids is not None and draft_target_ids.shape[1] else None
    counts = batch.output_counts.to(compute)[:, None, :]                               # [R, 1, V]
    chosen = _penalize_values(chosen, counts, batch.prompt_seen[:, None, :], batch)
    if biased is not None:   # the drafts' own logits, with each position's counts of the drafts before it
        drafts = draft_target_ids.to(out.device).long()[batch.rows]                     # [R, k]
        num_positions, k = chosen.shape[1], drafts.shape[1]
        same = (drafts[:, :, None] == drafts[:, None, :]).to(compute)                   # [R, k, k]: j, j'
        before = (torch.arange(k, device=out.device)[None, :]
                  < torch.arange(num_positions, device=out.device)[:, None]).to(compute)   # [S, k]: j' < i
        draft_counts = (batch.output_counts.to(compute).gather(1, drafts)[:, None, :]
                        + torch.einsum("rjm,im->rij", same, before))                    # [R, S, k]
        at = drafts[:, None, :].expand(-1, num_positions, -1)                            # [R, S, k]
        values = _penalize_values(biased.gather(2, at), draft_counts,
                                  batch.prompt_seen.gather(1, drafts)[:, None, :].expand_as(at), batch)
        chosen.scatter_(2, at, values)   # a draft repeated within the step: the same value at both places
    out[batch.rows] = chosen
    return out
