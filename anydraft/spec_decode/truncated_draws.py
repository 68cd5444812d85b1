"""Top-k / top-p draws on the native head: the cut logits_to_probs makes, then Gumbel-max over what it keeps.

A request with a top-k cut keeps at most k tokens, so where every row has one its draw needs only the head's k
largest exact logits (NativeHead.top, screened like the greedy token) instead of every logit, a sort and a softmax
over the vocabulary. Other cuts (top-p alone: the nucleus is a share of the whole mass) take every logit from the
native head. Either way the cut is the one logits_to_probs makes (sampling.cutoff_from_top: top-k, then top-p on
what is left, ties at the boundary kept), and the draw is argmax over the kept tokens of logit / T + the noise the
native sampling head gives each id under the step's key: a Gumbel-max restricted to the kept set, so exactly the
cut softmax, and keyed like every native draw (a seeded request draws the same tokens whatever k and batch; coupled
drafts still apply). Where ties with the last selected logit may go on past the selection, every logit is taken.
"""
from __future__ import annotations

import torch

from .sampling import TOP_SELECTED, cutoff_from_top, cutoff_of

TIE_ROOM = 32


def draws_from_top(top_k_max: int) -> bool:
    """Whether draws with these cuts go through the k largest logits: every row has a top-k cut, at most
    TOP_SELECTED (SamplingBatch.top_k_max; 0 = some row has none)."""
    return 0 < top_k_max <= TOP_SELECTED


def draw_truncated(runner, hidden: torch.Tensor,   # [B, S, hidden]
                   temperature: torch.Tensor,     # [B] > 0
                   keys: torch.Tensor,            # [B, S] int64 noise keys (sampling.draw_keys)
                   top_k: torch.Tensor | None,    # [B] 0 = no cut; None: no row cuts by top-k
                   top_p: torch.Tensor | None,    # [B]; None: no row cuts by top-p
                   top_k_max: int,                # host: SamplingBatch.top_k_max
                   ) -> torch.Tensor:             # [B, S] head rows
    """Each position's token drawn from softmax(logits / T) cut to the row's top-k / top-p set (see the module)."""
    if not draws_from_top(top_k_max):
        return _draw_over_all_logits(runner, hidden, temperature, keys, top_k, top_p)
    batch, seq = hidden.shape[:2]
    num_rows = runner.num_token_rows
    # Past the largest cut, room for ties with it (bf16 logits tie often: 8 bits of mantissa), which the cut keeps.
    selected = min(top_k_max + TIE_ROOM, num_rows)
    values, rows = runner.native_head.top(hidden, num_rows, selected)                 # [B, S, k+1] each
    scaled = values.double() / temperature.to(torch.float64).view(batch, 1, 1)        # [B, S, k+1]
    cutoff = cutoff_from_top(scaled, top_k, top_p, num_rows)                          # [B, S, 1]
    if cutoff is None or (selected < num_rows and bool((scaled[..., -1:] >= cutoff).any())):
        return _draw_over_all_logits(runner, hidden, temperature, keys, top_k, top_p)
    noise = runner.native_head.noise(keys.reshape(-1), rows.reshape(batch * seq, -1)).view_as(scaled)
    perturbed = (scaled + noise).masked_fill(scaled < cutoff, float("-inf"))           # [B, S, k+1]
    return rows.gather(-1, perturbed.argmax(dim=-1, keepdim=True)).squeeze(-1)


def _draw_over_all_logits(runner, hidden: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor,
                          top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:   # [B, S]
    """The same rule over every logit (a cut the k largest cannot decide: top-p alone, ties past them): the kept
    set is a prefix of the rows by logit, so the native sampling head draws over the rows reaching its smallest
    logit (the floor), with the same noise."""
    batch, seq = hidden.shape[:2]
    logits = runner.logits(hidden)                                                      # [B, S, V] bf16
    scaled = logits.double() / temperature.to(torch.float64).view(batch, 1, 1)
    cutoff = cutoff_of(scaled, top_k, top_p)                                           # [B, S, 1]
    floors = logits.float().masked_fill(scaled < cutoff, float("inf")).amin(dim=-1)    # [B, S]
    return runner.sample_ids(hidden, temperature, keys, floors=floors)
