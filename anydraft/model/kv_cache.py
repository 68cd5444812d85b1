"""Static preallocated KV cache with per-row lengths; rollback is `rewind`."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CacheWindow:
    """What every layer needs for one forward over S new tokens of some cache rows (built once per forward)."""
    rows: torch.Tensor | None   # [B] slot indices on device; None = all slots, in order
    positions: torch.Tensor     # [B, S] absolute positions of the new tokens
    mask: torch.Tensor          # [B, 1, S, T] additive, in the cache's dtype: 0 = key visible, -inf = hidden
    num_keys: int               # T = max(length) + S over the rows
    single_row: tuple[int, int] | None = None   # (row, start) when B = 1 and nothing is padded: plain slicing


class KVCache:
    """K and V per layer as [B_max, L_max, H_kv, D]; `lengths` (host ints) says how many entries are valid.

    Entries past a row's length are stale: they are masked out of attention and overwritten by the next
    write, so rewinding is only lowering the length.

    One extra slot per row past max_len takes the padding of right-padded batches: a row whose real tokens
    end near max_len can share a forward with a row that has more new tokens, its padding lands there.
    """

    def __init__(self, num_layers: int, max_batch: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, max_batch, max_len + 1, num_kv_heads, head_dim)   # + the padding slot
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_batch = max_batch
        self.max_len = max_len
        self.device = torch.device(device)
        self.lengths = [0] * max_batch  # host-side: known without a device sync

    def length(self, row: int) -> int:
        return self.lengths[row]

    def rewind(self, rows: list[int], num_tokens: list[int]) -> None:
        """Forget the last num_tokens[i] entries of rows[i]."""
        for row, n in zip(rows, num_tokens):
            if n < 0 or n > self.lengths[row]:
                raise ValueError(f"cannot rewind row {row} by {n}: it holds {self.lengths[row]} entries")
            self.lengths[row] -= n

    def truncate(self, row: int, length: int) -> None:
        """Keep only the first `length` entries of a row."""
        self.rewind([row], [self.lengths[row] - length])

    def keep_at_most(self, rows: list[int], lengths: list[int]) -> None:
        """Keep at most lengths[i] entries of rows[i] (a row already shorter keeps its own): a batch of truncations
        in one call, none per row."""
        held = self.lengths
        for row, length in zip(rows, lengths):
            if length < 0:
                raise ValueError(f"cannot keep {length} entries of row {row}")
            if length < held[row]:
                held[row] = length

    def reset(self, row: int) -> None:
        self.lengths[row] = 0

    def room(self, row: int) -> int:
        """How many more tokens the row can take."""
        return self.max_len - self.lengths[row]

    def _lengths_checked(self, row_list: list[int], num_new: int, num_real: list[int] | None) -> list[int]:
        lengths = [self.lengths[r] for r in row_list]
        real_end = (max(lengths) + num_new if num_real is None
                    else max([length + n for length, n in zip(lengths, num_real)]))
        if real_end > self.max_len:
            raise ValueError(f"sequence would reach {real_end} tokens, past the cache's max_len {self.max_len}; "
                             f"raise max_model_len or shorten the prompt / max_tokens")
        return lengths

    def host_positions(self, rows: list[int], num_new: int, num_real: list[int] | None = None) -> list[int]:
        """Cache index (= position) of each of num_new new tokens per row, row-major [B * S], as host ints.

        What the native body takes instead of a CacheWindow; padding past max_len goes to the padding slot."""
        lengths = self._lengths_checked(rows, num_new, num_real)
        offsets = range(num_new)
        if max(lengths) + num_new <= self.max_len:   # no padding reaches past max_len: no clamp (no call a token)
            return [length + s for length in lengths for s in offsets]
        return [min(length + s, self.max_len) for length in lengths for s in offsets]

    def window(self, rows: list[int] | None, num_new: int, num_real: list[int] | None = None) -> CacheWindow:
        """Positions and mask for appending num_new tokens to each of `rows` (None = every slot).

        num_real[b] < num_new: row b is right-padded; its padding may run past max_len (into the padding slot).
        """
        row_list = list(range(self.max_batch)) if rows is None else rows
        lengths = self._lengths_checked(row_list, num_new, num_real)
        end = min(max(lengths) + num_new, self.max_len + 1)
        lengths_t = torch.tensor(lengths, dtype=torch.long).to(self.device, non_blocking=True)
        positions = lengths_t[:, None] + torch.arange(num_new, device=self.device)[None, :]   # [B, S]
        positions = positions.clamp(max=self.max_len)  # padding past max_len all goes to the padding slot
        key_pos = torch.arange(end, device=self.device)
        visible = (key_pos[None, None, :] <= positions[:, :, None])[:, None]                    # [B, 1, S, T]
        # Additive once per forward: attention would turn a bool mask into this very tensor in every layer.
        mask = torch.zeros(visible.shape, dtype=self.k.dtype, device=self.device).masked_fill_(~visible, float("-inf"))
        rows_t = None if rows is None else torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)
        # Batch 1 (the latency case) writes and reads by slicing: no index_put, no gathered copy of the cache.
        single = (row_list[0], lengths[0]) if len(row_list) == 1 and lengths[0] + num_new <= self.max_len else None
        return CacheWindow(rows=rows_t, positions=positions, mask=mask, num_keys=end, single_row=single)

    def advance(self, rows: list[int] | None, num_new: list[int] | int) -> None:
        """Count the tokens a forward wrote (rows may keep fewer than were written: padding)."""
        row_list = list(range(self.max_batch)) if rows is None else rows
        counts = [num_new] * len(row_list) if isinstance(num_new, int) else num_new
        for r, n in zip(row_list, counts):
            self.lengths[r] += n

    def write_and_read(self, layer: int, win: CacheWindow, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store k/v [B, S, H_kv, D] of the new tokens; return keys/values [B, T, H_kv, D] to attend over."""
        k_layer, v_layer = self.k[layer], self.v[layer]
        if win.single_row is not None:
            row, start = win.single_row
            k_layer[row, start:start + k_new.shape[1]] = k_new[0]
            v_layer[row, start:start + v_new.shape[1]] = v_new[0]
            return k_layer[row:row + 1, :win.num_keys], v_layer[row:row + 1, :win.num_keys]
        if win.rows is None:
            batch = torch.arange(self.max_batch, device=self.device)[:, None]
            k_layer[batch, win.positions] = k_new
            v_layer[batch, win.positions] = v_new
            return k_layer[:, :win.num_keys], v_layer[:, :win.num_keys]
        k_layer[win.rows[:, None], win.positions] = k_new
        v_layer[win.rows[:, None], win.positions] = v_new
        return k_layer[win.rows, :win.num_keys], v_layer[win.rows, :win.num_keys]
