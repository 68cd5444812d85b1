"""Top-k / top-p draws on the native head: the cut logits_to_probs makes, then Gumbel-max over what it keeps.

A request with a top-k cut keeps at most k tokens, so its draw needs only the head's k largest exact logits
(NativeHead.top, screened like the greedy token) instead of every logit, a sort and a softmax over the vocabulary. A
nucleus without a top-k cut (top-p alone) is a share of the whole mass: the head's largest logits and its bounds on
the rest's mass (the rows it computed exactly; those plus the int8 screen's bounds of the rows it left out) give the
vocabulary's log-mass to within bounds, and where both ends keep the same tokens, so does the exact mass. Either way
the cut is the one logits_to_probs makes (sampling.cutoff_and_decided: top-k, then top-p on what is left, ties at the
boundary kept), and the draw is argmax over the kept tokens of logit / T + the noise the native sampling head gives
each id under the step's key: a Gumbel-max restricted to the kept set, so exactly the cut softmax, and keyed like
every native draw (a seeded request draws the same tokens whatever k and batch; coupled drafts still apply). A
position the selection does not decide (a cut past it, ties with its last logit that may go on past it, mass bounds
too far apart) tries a wider selection, then draws by the same rule over every logit; the others still draw from the
selection. A coupled draft proposes among its own largest logits, under the same cut, approximately (propose_coupled).
"""
from __future__ import annotations

import torch

from .sampling import TOP_SELECTED, cutoff_and_decided, cutoff_of

TIE_ROOM = 32
# The nucleus is looked for among this many largest logits (and TIE_ROOM more) where no row has a top-k cut: the head
# computes exactly the rows its screen cannot rule out of them, so a larger selection computes many more rows (at 288,
# most of a 152k head), while the rows past it count in the mass bounds anyway. A nucleus past it takes every logit.
NUCLEUS_SELECTED = 32
# Positions the first selection does not decide try this many (every logit past them): the logits and a cut over the
# whole vocabulary cost several head screens (~6 ms a row on the shipped qwen3 head), so one undecided position of a
# k + 1-token verification made drafting a loss under top-p.
WIDE_SELECTED = TOP_SELECTED + TIE_ROOM
# A coupled draft without a top-k cut draws among this many of its largest logits: on the shipped pair at T 0.7 the
# draw among its 32 largest was the exact draw over every row at 198 of 200 draft positions (scratch).
PROPOSAL_SELECTED = 32
# Room on each side of the log-mass bound: the exact path sums the vocabulary in float64 (rounding ~1e-15), and a
# cut decided 1e-9 apart from either end is decided for every rounding of the sum in between.
MASS_ROOM = 1e-9


def selection_size(top_k_max: int, num_rows: int) -> int:
    """How many of the largest logits a draw selects first: the largest top-k cut where every row has one
    (SamplingBatch.top_k_max, up to TOP_SELECTED), else NUCLEUS_SELECTED; room for ties."""
    return min((min(top_k_max, TOP_SELECTED) or NUCLEUS_SELECTED) + TIE_ROOM, num_rows)


def draw_truncated(runner, hidden: torch.Tensor,   # [B, S, hidden]
                   temperature: torch.Tensor,     # [B] > 0
                   keys: torch.Tensor,            # [B, S] int64 noise keys (sampling.draw_keys)
                   top_k: torch.Tensor | None,    # [B] 0 = no cut; None: no row cuts by top-k
                   top_p: torch.Tensor | None,    # [B]; None: no row cuts by top-p
                   top_k_max: int,                # host: SamplingBatch.top_k_max
                   selected: int | None = None,   # host: how many largest logits to select (selection_size)
                   ) -> torch.Tensor:             # [B, S] head rows
    """Each position's token drawn from softmax(logits / T) cut to the row's top-k / top-p set (see the module):
    from the largest logits where they decide the cut; the positions they do not, from the WIDE_SELECTED largest
    (a wider nucleus, tighter mass bounds), and past those from every logit."""
    batch, seq, width = hidden.shape
    num_rows = runner.num_token_rows
    selected = selection_size(top_k_max, num_rows) if selected is None else min(selected, num_rows)
    # The rest's mass only where a row divides by the vocabulary's: top-p without top-k.
    needs_mass = top_p is not None and top_k_max == 0
    values, rows, rest_mass = runner.native_head.top(hidden, num_rows, selected,
                                                     _per_position(temperature, seq) if needs_mass else None)
    scaled = values.double() / temperature.to(torch.float64).view(batch, 1, 1)        # [B, S, M]
    cutoff, decided = cutoff_within_mass_bound(scaled, top_k, top_p, num_rows, rest_mass)   # [B, S, 1] each
    noise = runner.native_head.noise(keys.reshape(-1), rows.reshape(batch * seq, -1)).view_as(scaled)
    perturbed = (scaled + noise).masked_fill(scaled < cutoff, float("-inf"))           # [B, S, M]
    drawn = rows.gather(-1, perturbed.argmax(dim=-1, keepdim=True)).squeeze(-1)        # [B, S]
    if decided is None:   # the selection is every row
        return drawn
    # Ties with the smallest selected logit may go on past the selection: the cut keeps them all.
    undecided = (~decided | (scaled[..., -1:] >= cutoff)).view(-1)                      # [B * S]
    if bool(undecided.any()):
        at = undecided.nonzero().squeeze(-1)                                            # [N]

        def per_position(row_values: torch.Tensor | None) -> torch.Tensor | None:   # [B] -> [N]
            return None if row_values is None else _per_position(row_values, seq)[at]
        again = (hidden.reshape(-1, 1, width)[at], per_position(temperature), keys.reshape(-1, 1)[at],
                 per_position(top_k), per_position(top_p))
        drawn.view(-1)[at] = (draw_truncated(runner, *again, top_k_max, WIDE_SELECTED) if selected < WIDE_SELECTED
                              else _draw_over_all_logits(runner, *again)).view(-1)
    return drawn


def propose_coupled(runner, hidden: torch.Tensor,   # [B, S, hidden] a draft's
                    temperature: torch.Tensor,     # [B] > 0
                    keys: torch.Tensor,            # [B, S] int64 the target's noise keys
                    top_k: torch.Tensor | None, top_p: torch.Tensor | None,   # [B] each, as draw_truncated
                    top_k_max: int,
                    noise_ids: torch.Tensor | None,   # [head rows] the target id whose noise each row draws with
                    ) -> torch.Tensor:             # [B, S] head rows
    """A coupled draft's token: Gumbel-max with the target's noise over its own largest logits that the request's cut
    keeps (NativeHead.propose; top-p taken within them). A proposal only has to equal the target's draw often, not
    follow the softmax or the cut exactly: the target's own draw decides what is emitted. The exact sampling head
    costs a draft token twice the greedy one (it bounds the noise of every block it cannot rule out), and the draft's
    full softmax proposed tokens the target's cut never keeps."""
    seq = hidden.shape[1]
    selected = min(min(top_k_max, TOP_SELECTED) or PROPOSAL_SELECTED, runner.num_token_rows)
    return runner.native_head.propose(hidden, runner.num_token_rows, selected, _per_position(temperature, seq),
                                      keys.reshape(-1), noise_ids, _per_position(top_k, seq),
                                      _per_position(top_p, seq))


def _per_position(row_values: torch.Tensor | None, seq: int) -> torch.Tensor | None:   # [B] -> [B * S]
    """A per-row setting for each of a row's S positions (the heads take one per activation row)."""
    return row_values if row_values is None or seq == 1 else row_values.repeat_interleave(seq)


def cutoff_within_mass_bound(scaled: torch.Tensor,   # [B, S, M] the M largest scaled logits, descending
                             top_k: torch.Tensor | None, top_p: torch.Tensor | None,   # [B] each
                             num_rows: int,
                             rest_log_mass: torch.Tensor | None,   # [B, S, 2] bounds (lower, upper) on the log-mass
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:   # [B, S, 1] each   of the other rows
    """Each row's cut and whether the selection decides it (sampling.cutoff_and_decided), where a row without a
    top-k cut divides by the vocabulary's mass, known only between the selection's own plus the rest's lower bound
    and the selection's plus the rest's upper bound: a larger mass keeps a longer prefix, so where both ends keep the
    same one, the exact mass does too. rest_log_mass None: no row divides by the vocabulary's mass (or the selection
    is every row)."""
    selection_mass = torch.logsumexp(scaled, dim=-1, keepdim=True)                       # [B, S, 1]
    if rest_log_mass is None or top_p is None:
        return cutoff_and_decided(scaled, top_k, top_p, num_rows, selection_mass)
    batch, seq, _ = scaled.shape
    room = torch.tensor([-MASS_ROOM, MASS_ROOM], dtype=scaled.dtype, device=scaled.device)
    ends = torch.logaddexp(selection_mass, rest_log_mass) + room                          # [B, S, 2]
    # Both ends in one pass: the rows twice over, the lower ends first.

    def twice(row_values: torch.Tensor | None) -> torch.Tensor | None:   # [B] -> [2B]
        return None if row_values is None else row_values.repeat(2)
    cutoffs, decided = cutoff_and_decided(scaled.repeat(2, 1, 1), twice(top_k), twice(top_p), num_rows,
                                          ends.movedim(-1, 0).reshape(2 * batch, seq, 1))   # [2B, S, 1] each
    low, high = cutoffs.chunk(2)
    if decided is None:   # the selection is every row: its mass is the vocabulary's, both ends agree
        return low, None
    decided_low, decided_high = decided.chunk(2)
    return low, decided_low & decided_high & (low == high)


def _draw_over_all_logits(runner, hidden: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor,
                          top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:   # [B, S]
    """The same rule over every logit (a cut the k largest cannot decide: top-p alone, ties past them): the kept
    set is a prefix of the rows by logit, so the native sampling head draws over the rows reaching its smallest
    logit (the floor), with the same noise. Rows without any cut (beside cut rows in a batch) draw from the full
    softmax as they would alone, without the logits, where no cut row is among them."""
    batch, seq = hidden.shape[:2]
    uncut = torch.ones(batch, dtype=torch.bool, device=hidden.device)
    if top_k is not None:
        uncut &= top_k <= 0
    if top_p is not None:
        uncut &= top_p >= 1.0
    if bool(uncut.all()):
        return runner.sample_ids(hidden, temperature, keys)
    logits = runner.logits(hidden)                                                      # [B, S, V] bf16
    scaled = logits.double() / temperature.to(torch.float64).view(batch, 1, 1)
    cutoff = cutoff_of(scaled, top_k, top_p)                                           # [B, S, 1]
    floors = logits.float().masked_fill(scaled < cutoff, float("inf")).amin(dim=-1)    # [B, S]
    return runner.sample_ids(hidden, temperature, keys, floors=floors)
