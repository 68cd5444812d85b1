"""The output head on the native kernels (csrc/greedy_head.cpp): bf16 logits computed the same way for every
row, and their exact greedy argmax screened by an int8 copy of the head.

Greedy decoding needs only the argmax, and on CPU the head is a memory-bound read of every row (qwen3: 58 MB).
The screen reads an int8 copy (half the bytes) with int8 activations, so each row's score is an exact integer;
with per-row bounds on what the two quantizations can hide, only rows whose bound reaches the best exact logit
are computed in full. The argmax is that of `logits()`, ties to the lowest index: nothing is approximate.
A row whose screen leaves more than 1/64 of the head standing (degenerate activations: one huge outlier, as a
repeated token gives) takes all its logits from the logits() kernel instead, which reads the head once for all
such rows of the batch.
`sample()` draws from softmax(logits() / T) the same way (csrc/sampling_head.cpp): exact Gumbel-max, the int8
screen bounding each row's perturbed value, with counter-based noise keyed per row.
"""
from __future__ import annotations

import torch

SCREEN_WIDTH = 64   # VNNI takes 64 int8 at a time: the hidden size must be a multiple
SCREEN_BUILD_ROWS = 4096   # head rows quantized at once when the screen is built (float64 copies of that many)


def _given(values: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """An optional per-row input as the kernels take it: empty for None."""
    return torch.empty(0, dtype=dtype) if values is None else values.to(dtype)


def _round_up(values: torch.Tensor) -> torch.Tensor:
    """float64 -> the float32 at or above each value, so a bound built from it never falls short."""
    down = values.float()
    return torch.where(down.double() < values, torch.nextafter(down, torch.full_like(down, float("inf"))), down)


class NativeHead:
    """logits(hidden) and greedy(hidden) for one head weight [N, K] (bf16, kept by reference)."""

    def __init__(self, weight: torch.Tensor, extension):
        if weight.dtype != torch.bfloat16 or weight.shape[1] % SCREEN_WIDTH:
            raise ValueError(f"native head needs a bf16 weight with a multiple of {SCREEN_WIDTH} columns, "
                             f"got {tuple(weight.shape)} {weight.dtype}")
        self.extension = extension
        self.weight = weight.detach().contiguous()
        rows, width = self.weight.shape
        padded = -(-rows // 16) * 16
        # Summation error of a K-term fp32 dot product in any order (linear.h: AMX tiles or 16 lanes + a tree):
        # at most K - 1 roundings of 2^-24 each of sum |w_k h_k| <= ||w|| ||h||; x4 for the score's own roundings
        # and margin.
        rounding = 4 * (width + 4) * 2.0 ** -24
        q = torch.zeros(padded, width, dtype=torch.int8)
        scale = torch.ones(padded, dtype=torch.float32)      # padding rows: scale 1, q 0, no slack
        norm_q = torch.zeros(padded, dtype=torch.float64)
        norm_h = torch.zeros(padded, dtype=torch.float64)
        for start in range(0, rows, SCREEN_BUILD_ROWS):   # row by row in effect; chunks bound the float64 copies
            end = min(start + SCREEN_BUILD_ROWS, rows)
            exact = self.weight[start:end].double()                                  # bf16 values, exactly
            row_max = exact.abs().amax(dim=1)
            chunk_scale = torch.where(row_max > 0, row_max / 127, torch.ones_like(row_max)).float()
            chunk_q = (exact / chunk_scale.double()[:, None]).round().clamp_(-127, 127).to(torch.int8)
            quantized = chunk_scale.double()[:, None] * chunk_q.double()
            q[start:end], scale[start:end] = chunk_q, chunk_scale
            norm_q[start:end] = quantized.norm(dim=1)
            norm_h[start:end] = (exact - quantized).norm(dim=1) + rounding * exact.norm(dim=1)
        # [N16/16, K/4, 16, 4]: one 64-byte vector holds 4 columns of 16 rows (see greedy_head.cpp)
        self.q_blocks = q.view(padded // 16, 16, width // 4, 4).permute(0, 2, 1, 3).contiguous()
        self.row_scale = scale
        self.q_sum = q.sum(dim=1, dtype=torch.int32)
        self.slack_q = _round_up(norm_q)
        self.slack_h = _round_up(norm_h)

    @property
    def rows(self) -> int:
        return self.weight.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:   # [..., K] -> [..., N] bf16
        return self.extension.head_logits(hidden, self.weight)

    def greedy(self, hidden: torch.Tensor, num_rows: int) -> torch.Tensor:   # [..., K] -> [...] long
        """argmax over rows [0, num_rows) of logits(hidden), lowest index on ties."""
        return self.greedy_with_report(hidden, num_rows)[0]

    def greedy_with_report(self, hidden: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """greedy(), and [...] bool: which rows the screen left too wide, so that all their logits were computed
        (by the logits() kernel, reading the head once for all such rows; same values, same argmax)."""
        return self.extension.greedy_head(hidden, self.weight, self.q_blocks, self.row_scale, self.q_sum,
                                          self.slack_q, self.slack_h, num_rows)

    def sample(self, hidden: torch.Tensor,            # [..., K] bf16
               num_rows: int,
               temperature: torch.Tensor,             # [prod(...)] > 0, one per row of hidden
               keys: torch.Tensor,                    # [prod(...)] int64: each row's noise key (see draw_keys)
               noise_ids: torch.Tensor | None = None,  # [>= num_rows] int64 noise counter per head row; None = n
               floors: torch.Tensor | None = None,     # [prod(...)] float: only rows whose logit reaches it; None
               ) -> torch.Tensor:                     # [...] long
        """A token per row drawn exactly from softmax(logits()[..., :num_rows] / T) by Gumbel-max, with the noise of
        head row n a fixed function of (key, noise_ids[n]): the same key and hidden state give the same token in any
        batch, and two heads given the same key draw with the same noise for the same id (coupled draws). With
        floors, the softmax over the rows whose logit is at least the row's floor (a cut that keeps a prefix)."""
        return self.extension.sampling_head(hidden, self.weight, self.q_blocks, self.row_scale, self.q_sum,
                                            self.slack_q, self.slack_h, num_rows,
                                            1.0 / temperature.to(torch.float64), keys, _given(noise_ids, torch.long),
                                            _given(floors, torch.float32))

    def top(self, hidden: torch.Tensor, num_rows: int, k: int, temperature: torch.Tensor | None = None,   # [M]
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The k largest of logits(hidden)[..., :num_rows] and their rows ([..., k] float holding bf16 values,
        [..., k] long), the larger first, the lower row on ties: what a top-k cut keeps, screened as greedy(). Given
        each activation row's temperature, also [..., 2] float64: bounds (lower, upper) on the log of the sum of
        exp(logit / T) over the other rows below num_rows (the rows computed exactly; those plus the screen's bounds
        of the rows it left out)."""
        inv_temperature = (torch.empty(0, dtype=torch.float64) if temperature is None
                           else 1.0 / temperature.to(torch.float64))
        values, rows, tail = self.extension.top_head(hidden, self.weight, self.q_blocks, self.row_scale, self.q_sum,
                                                     self.slack_q, self.slack_h, num_rows, k, inv_temperature)
        return values, rows, (None if temperature is None else tail)

    def propose(self, hidden: torch.Tensor,            # [..., K] bf16 a draft's
                num_rows: int, selected: int,
                temperature: torch.Tensor,             # [M] > 0, one per row of hidden
                keys: torch.Tensor,                    # [M] int64: the target's noise key of each row
                noise_ids: torch.Tensor | None = None,  # [>= num_rows] int64 target id per head row; None = n
                top_k: torch.Tensor | None = None,     # [M] int64, <= 0 = no cut; None: no row cuts
                top_p: torch.Tensor | None = None,     # [M]; None: no row cuts
                ) -> torch.Tensor:                     # [...] long head rows
        """A coupled draft's token (csrc/proposal_head.cpp): the Gumbel-max with sample()'s noise of each row's id over
        the `selected` largest logits that the row's cut keeps (the first top_k, then top-p within them): approximate,
        as a proposal may be, for the price of top()."""
        return self.extension.proposal_head(hidden, self.weight, self.q_blocks, self.row_scale, self.q_sum,
                                            self.slack_q, self.slack_h, num_rows, selected,
                                            1.0 / temperature.to(torch.float64), keys, _given(noise_ids, torch.long),
                                            _given(top_k, torch.long), _given(top_p, torch.float64))

    def noise(self, keys: torch.Tensor,   # [M] int64
              ids: torch.Tensor,          # [M, n] int64 noise ids
              ) -> torch.Tensor:          # [M, n] float64
        """The noise sample() draws id ids[m, i] with under keys[m]: a draw among chosen rows (argmax of
        logit / T + noise over them) is the same Gumbel-max, restricted to them."""
        return self.extension.head_noise(keys, ids)
