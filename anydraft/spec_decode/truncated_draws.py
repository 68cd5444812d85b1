"""Top-k / top-p draws on the native head: the kept set from the head's k largest logits, then Gumbel-max over it.

A request with a top-k cut keeps at most k tokens, so its draw needs only the head's k largest exact logits
(NativeHead.top, screened like the greedy token) instead of every logit, a sort and a softmax over the vocabulary.
The cut is the one logits_to_probs makes (sampling.cutoff_from_top: top-k, then top-p on what is left, ties at the
boundary kept), and the draw is argmax over the kept tokens of logit / T + the noise the native sampling head gives
each id under the step's key: a Gumbel-max restricted to the kept set, so exactly the truncated softmax, and keyed
like every native draw (a seeded request draws the same tokens whatever k and batch; coupled drafts still apply).
Where ties with the last selected logit may go on past the selection, the same rule runs over all the logits.
"""
from __future__ import annotations

import torch

from .sampling import TOP_SELECTED, cutoff_from_top

TIE_ROOM = 32


def draws_natively(top_k_max: int) -> bool:
    """Whether draws with these cuts go through the k largest logits: every row has a top-k cut, at most
    TOP_SELECTED (SamplingBatch.top_k_max; 0 = some row has none)."""
    return 0 < top_k_max <= TOP_SELECTED


def draw_truncated(runner, hidden: torch.Tensor,   # [B, S, hidden]
                   temperature: torch.Tensor,     # [B] > 0
                   keys: torch.Tensor,            # [B, S] int64 noise keys (sampling.draw_keys)
                   top_k: torch.Tensor,           # [B] >= 1
                   top_p: torch.Tensor | None,    # [B]; None: no row cuts by top-p
                   top_k_max: int,                # host: top_k.max()
                   ) -> torch.Tensor:             # [B, S] head rows
    """Each position's token drawn from softmax(logits / T) cut to the row's top-k / top-p set (see the module)."""
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
                          top_k: torch.Tensor, top_p: torch.Tensor | None) -> torch.Tensor:   # [B, S]
    """The same rule and noise over every logit (the selection did not decide a cut: ties past it)."""
    batch, seq = hidden.shape[:2]
    logits = runner.logits(hidden).double()                                            # [B, S, V]
    scaled = logits / temperature.to(torch.float64).view(batch, 1, 1)
    vocab_size = scaled.shape[-1]
    cutoff = cutoff_from_top(scaled.sort(dim=-1, descending=True).values, top_k, top_p, vocab_size)
    out = torch.empty(batch * seq, dtype=torch.long)
    flat, flat_cutoff, flat_keys = scaled.view(batch * seq, -1), cutoff.view(-1), keys.reshape(-1)
    for i in range(batch * seq):   # rare: a few rows, each over its kept ids only
        kept = torch.nonzero(flat[i] >= flat_cutoff[i]).view(1, -1)                   # [1, n]
        noise = runner.native_head.noise(flat_keys[i:i + 1], kept)                     # [1, n]
        out[i] = kept[0, (flat[i, kept[0]] + noise[0]).argmax()]
    return out.view(batch, seq).to(hidden.device)
