"""Deciding how many drafted tokens the target accepts, and which token the target adds after them.

Pure tensor functions, vectorized over the batch and over k, with no host sync: the engine reads
`num_accepted` / `output_ids` once per step elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from anydraft.spec_decode.sampling import sample_from_probs


@dataclass
class VerifyOutput:
    """Result of verifying k drafted tokens per row (all tensors on the input's device)."""
    num_accepted: torch.Tensor  # [B] long, 0..k
    output_ids: torch.Tensor    # [B, k+1] long target ids: accepted drafts, then next_ids, then -1 padding
    next_ids: torch.Tensor      # [B] long target id of the recovered (a rejection) or bonus (all accepted) token


def _accepted_prefix_length(accepted: torch.Tensor,  # [B, k] bool, per position
                            ) -> torch.Tensor:       # [B] long
    """Number of leading True: a position counts only if every earlier one was accepted too."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def _assemble_output(draft_target_ids: torch.Tensor,  # [B, k]
                     num_accepted: torch.Tensor,      # [B]
                     next_ids: torch.Tensor,          # [B]
                     ) -> VerifyOutput:
    positions = torch.arange(draft_target_ids.shape[1] + 1, device=draft_target_ids.device)  # [k+1]
    drafts_then_next = torch.cat([draft_target_ids.long(), next_ids[:, None]], dim=1)        # [B, k+1]
    n = num_accepted[:, None]
    output_ids = torch.where(positions < n, drafts_then_next,
                             torch.where(positions == n, next_ids[:, None], -1))
    return VerifyOutput(num_accepted=num_accepted, output_ids=output_ids, next_ids=next_ids)


def _drafted(accepted: torch.Tensor,                   # [B, k] bool
             num_draft_tokens: torch.Tensor | None,     # [B] long, drafts that count per row; None = all k
             ) -> torch.Tensor:                         # [B, k] bool
    """Ragged proposals: a row's positions past its own count are never accepted (they were padding)."""
    if num_draft_tokens is None:
        return accepted
    positions = torch.arange(accepted.shape[1], device=accepted.device)
    return accepted & (positions < num_draft_tokens[:, None])


def verify_greedy(target_argmax: torch.Tensor,     # [B, k+1] target's greedy token at each position
                  draft_target_ids: torch.Tensor,  # [B, k] drafted tokens in target ids
                  num_draft_tokens: torch.Tensor | None = None,  # [B] drafts per row (ragged); None = k each
                  ) -> VerifyOutput:
    """Accept while the target argmax equals the drafted token; then emit the target argmax.

    target_argmax[:, i] is the target's greedy token after the i-th drafted token (position 0: after the
    last verified token), so position num_accepted gives the recovered or, when all k match, bonus token.
    It is the argmax of the target logits (`greedy_argmax`, or `ModelRunner.greedy_ids`, which need not
    compute them all); greedy verification depends on nothing else.
    """
    num_drafted = draft_target_ids.shape[1]
    if num_drafted == 0:   # a plain target step: its one token is the target's
        return VerifyOutput(torch.zeros_like(target_argmax[:, 0]), target_argmax[:, :1], target_argmax[:, 0])
    num_accepted = _accepted_prefix_length(_drafted(target_argmax[:, :num_drafted] == draft_target_ids,
                                                    num_draft_tokens))
    next_ids = target_argmax.gather(1, num_accepted[:, None]).squeeze(1)           # [B]
    # An accepted draft equals the target's token there, so the output is the target's own tokens up to and
    # including position num_accepted (the recovered or bonus token): fewer tensor ops than assembling drafts and
    # next_ids (each op costs microseconds of host time in a step).
    positions = torch.arange(num_drafted + 1, device=target_argmax.device)          # [k+1]
    output_ids = target_argmax.long().masked_fill(positions > num_accepted[:, None], -1)   # [B, k+1]
    return VerifyOutput(num_accepted=num_accepted, output_ids=output_ids, next_ids=next_ids)


def verify_sampling(target_probs: torch.Tensor,      # [B, k+1, V_target] p, after temperature/top-k/top-p
                    draft_probs: torch.Tensor,       # [B, k, N] q over the draft's columns (see column_to_target)
                    draft_target_ids: torch.Tensor,  # [B, k] drafted tokens in target ids, x_i ~ q_i
                    uniforms: torch.Tensor,          # [B, k] U[0, 1)
                    token_uniforms: torch.Tensor,    # [B] U[0, 1) float64, for the one token drawn per row
                    num_draft_tokens: torch.Tensor | None = None,  # [B] drafts per row (ragged); None = k each
                    draft_columns: torch.Tensor | None = None,     # [B, k] column of x_i in q; None = x_i itself
                    column_to_target: torch.Tensor | None = None,  # [N] target id of each column; None = identity
                    ) -> VerifyOutput:
    """Standard speculative rejection sampling; every emitted token is distributed exactly as p.

    Accept x_i when u_i < p_i(x_i) / q_i(x_i). At the first rejection draw the recovered token from
    normalize(max(p_i - q_i, 0)); when all k are accepted draw the bonus token from p_k.
    q may be zero outside an intersection of vocabularies: p's mass there is only reachable through
    the residual, which is what keeps the output exact. Such a q comes over the draft's own columns (its
    head rows) with `column_to_target` mapping them (injectively) into the target vocabulary, so it is never
    spread over [B, k, V_target]; q is 0 at every target id no column maps to.
    Greedy rows fit too: with one-hot p (see logits_to_probs) this accepts iff x_i is the argmax.
    A row draws one token (recovered or bonus) per step, so one uniform per row serves whichever
    position that is: it is independent of the uniforms that chose the position.
    Ragged rows (num_draft_tokens[i] < k) stop at their own count: the token after their last draft is drawn
    from p there (no draft at that position, q = 0), as for a row that drafted exactly that many.
    """
    batch, num_drafted = draft_target_ids.shape
    ids = draft_target_ids.long()[:, :, None]                                       # [B, k, 1]
    columns = ids if draft_columns is None else draft_columns.long()[:, :, None]     # [B, k, 1]
    target_prob_drafted = target_probs[:, :num_drafted].gather(-1, ids).squeeze(-1)  # [B, k]
    draft_prob_drafted = draft_probs.gather(-1, columns).squeeze(-1)                  # [B, k]
    # u < p/q written as u*q < p: no division, and q(x) = 0 (never proposed by a correct caller)
    # accepts iff p(x) > 0, matching min(1, p/q) = 1; p(x) = q(x) = 0 rejects.
    accepted = uniforms.to(draft_prob_drafted.dtype) * draft_prob_drafted < target_prob_drafted
    num_accepted = _accepted_prefix_length(_drafted(accepted, num_draft_tokens))     # [B]
    row_drafted = (torch.full_like(num_accepted, num_drafted) if num_draft_tokens is None
                   else num_draft_tokens.to(num_accepted.device))                      # [B]

    if num_drafted == 0:   # a plain target step: its one token is drawn from p at the one position
        return _assemble_output(draft_target_ids, num_accepted, sample_from_probs(target_probs[:, 0], token_uniforms))
    vocab_size = target_probs.shape[-1]
    at_next = num_accepted.view(batch, 1, 1)                                          # [B, 1, 1]
    target_prob_next = target_probs.gather(1, at_next.expand(batch, 1, vocab_size)).squeeze(1)   # [B, V]
    # Position k has no draft: q is 0 there, so the residual is p itself (the bonus distribution).
    at_draft = at_next.clamp(max=num_drafted - 1).expand(batch, 1, draft_probs.shape[-1])
    draft_prob_next = draft_probs.gather(1, at_draft).squeeze(1)                     # [B, N]
    draft_prob_next = draft_prob_next * (num_accepted < row_drafted)[:, None]
    if column_to_target is None:
        residual = target_prob_next - draft_prob_next
    else:   # p + (-q) at the mapped ids is p - q exactly; elsewhere q = 0 and p stays
        residual = target_prob_next.scatter_add(-1, column_to_target.expand(batch, -1), -draft_prob_next)
    residual = residual.clamp_min_(0)
    # An all-zero residual means p == q numerically: rejection then had probability ~0, fall back to p.
    has_residual = residual.sum(dim=-1, keepdim=True) > 0
    next_probs = torch.where(has_residual, residual, target_prob_next)
    # Inverse CDF needs no normalization: the residual is drawn from as it is.
    next_ids = sample_from_probs(next_probs, token_uniforms)
    return _assemble_output(draft_target_ids, num_accepted, next_ids)
