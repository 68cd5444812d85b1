"""The paged KV cache: a pool of fixed-size blocks, per-row block tables and lengths; rollback and prefix reuse.

A row is a sequence's handle (a request's slot); its entries live in the blocks of its table, position p in
block table[p // BLOCK_TOKENS] at offset p % BLOCK_TOKENS. Attention reads through the table in both paths (the
native kernels take it as an index tensor, the PyTorch path gathers by flat slot), keys in position order, so a
block boundary changes no logit. Blocks are reserved before a forward writes (`reserve`; the scheduler asks for
them, and `window`/`host_positions` check them), and whole blocks past a row's length are freed by every rollback.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .block_pool import NULL_BLOCK, BlockPool

BLOCK_TOKENS = 16   # tokens per block: the native attention's key group, so blocks keep its reduction order


class CacheFull(MemoryError):
    """The block pool cannot hold the tokens a forward would write (the scheduler preempts before this)."""


@dataclass
class CacheWindow:
    """What every layer of the PyTorch path needs for one forward over S new tokens of some rows."""
    positions: torch.Tensor     # [B, S] absolute positions of the new tokens
    mask: torch.Tensor | None   # [B, 1, S, T] additive, in the cache's dtype: 0 = key visible, -inf = hidden
    num_keys: int               # T
    # None where no KVCache is read (training's own caches): then only positions, mask and num_keys are.
    write_slots: torch.Tensor | None = None   # [B, S] flat slot (block * BLOCK_TOKENS + offset) of each new k/v
    read_slots: torch.Tensor | None = None    # [B, T] flat slot of each key position 0..T-1 of each row


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_TOKENS)


class KVCache:
    """K and V per layer as [num_blocks, BLOCK_TOKENS, H_kv, D]; `lengths` (host ints) says how many entries of each
    row are valid. Entries past a row's length are stale: masked out and overwritten by the next write.

    num_blocks None: enough for every row at max_len (the most a caller can ask of this cache)."""

    def __init__(self, num_layers: int, max_batch: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, num_blocks: int | None = None,
                 prefix_caching: bool = True):
        self.max_blocks_per_row = blocks_for(max_len)
        if num_blocks is None:
            num_blocks = max_batch * self.max_blocks_per_row + 1
        self.pool = BlockPool(num_blocks, BLOCK_TOKENS)
        shape = (num_layers, num_blocks, BLOCK_TOKENS, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_batch = max_batch
        self.prefix_caching = prefix_caching   # off: attach_prefix finds nothing and publish caches nothing
        self.max_len = max_len
        self.device = torch.device(device)
        self.lengths = [0] * max_batch    # host-side: known without a device sync
        self.tables: list[list[int]] = [[] for _ in range(max_batch)]
        self.held = [0] * max_batch      # len(tables[row]), kept so that per-row work makes no call
        # Leading blocks of each row that may be shared or cached (a prefix hit, a publish): a write there must copy
        # or forget its block first. Past them a row's blocks are its own, so a decode step needs no check per block.
        self.guarded = [0] * max_batch
        self._columns = list(range(self.max_blocks_per_row))
        # The tables as one host tensor for the native kernels (NULL_BLOCK past a row's blocks).
        self.block_table = torch.full((max_batch, self.max_blocks_per_row), NULL_BLOCK, dtype=torch.long)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V of one token over all layers."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def num_tokens(self) -> int:
        """Tokens the pool holds when full."""
        return self.pool.usable_blocks * BLOCK_TOKENS

    def free_tokens(self) -> int:
        return self.pool.num_free * BLOCK_TOKENS

    def length(self, row: int) -> int:
        return self.lengths[row]

    def entries(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The row's valid keys and values, [L, length, H_kv, D] each (a copy; for checks and tools)."""
        n = self.lengths[row]
        blocks = torch.tensor(self.tables[row][:blocks_for(n)], dtype=torch.long, device=self.device)
        flat = lambda t: t[:, blocks].flatten(1, 2)[:, :n]   # noqa: E731
        return flat(self.k), flat(self.v)

    # -- blocks -----------------------------------------------------------------------------------------------
    # No Python call per row in the common path (a step's host work must not grow with the batch): per-row work is
    # list arithmetic, and the pool and the block table are called once per forward whatever the rows.
    def _growth(self, rows: list[int], ends: list[int]) -> tuple[int, list[tuple[int, int]]]:
        """Blocks the rows' tables must grow by to reach `ends`, and the rows that write into guarded blocks."""
        grow, slow, held, guarded, lengths, max_len = 0, [], self.held, self.guarded, self.lengths, self.max_len
        for row, end in zip(rows, ends):
            if end > max_len:
                raise ValueError(f"sequence would reach {end} tokens, past the cache's max_len {max_len}; "
                                 f"raise max_model_len or shorten the prompt / max_tokens")
            extra = -(-end // BLOCK_TOKENS) - held[row]
            if extra > 0:
                grow += extra
            if lengths[row] // BLOCK_TOKENS < guarded[row]:
                slow += [(row, end)]
        return grow, slow

    def _rewritten(self, row: int, end: int) -> range:
        """Indices of the row's existing blocks that writing positions [length, end) changes."""
        return range(self.lengths[row] // BLOCK_TOKENS, min(self.held[row], blocks_for(end)))

    def _copies(self, slow: list[tuple[int, int]]) -> int:
        return sum(self.pool.is_shared(self.tables[row][i]) for row, end in slow for i in self._rewritten(row, end))

    def try_reserve(self, rows: list[int], ends: list[int]) -> bool:
        """reserve(), or False, changing nothing, where the pool is short."""
        try:
            self.reserve(rows, ends)
        except CacheFull:
            return False
        return True

    def reserve(self, rows: list[int], ends: list[int]) -> None:
        """Make each row able to write positions [length, end): new blocks past its table, and its own copy of a
        block it shares (copy on write); a cached block it alone holds leaves the prefix cache (it will change).
        All or nothing: raises CacheFull, changing nothing, where the pool is short."""
        grow, slow = self._growth(rows, ends)
        if grow + (self._copies(slow) if slow else 0) > self.pool.num_free:
            raise CacheFull(f"the KV cache has {self.free_tokens()} free tokens, too few for this forward; "
                            f"give it more memory (--kv-cache-memory) or lower max_num_seqs")
        for row, end in slow:
            self._own_blocks(row, end)
        fresh = self.pool.take(grow)
        tables, held, columns = self.tables, self.held, self._columns
        at, index_rows, index_columns = 0, [], []
        for row, end in zip(rows, ends):
            blocks = -(-end // BLOCK_TOKENS)
            extra = blocks - held[row]
            if extra > 0:
                tables[row] += fresh[at:at + extra]
                index_rows += [row] * extra
                index_columns += columns[held[row]:blocks]
                held[row] = blocks
                at += extra
        self._set_table(index_rows, index_columns, fresh)

    def _set_table(self, rows: list[int], columns: list[int], blocks: list[int] | int) -> None:
        values = torch.tensor(blocks, dtype=torch.long) if isinstance(blocks, list) else blocks
        self.block_table[torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long)] = values

    def _own_blocks(self, row: int, end: int) -> None:
        """Copy the shared blocks the row is about to write, and take its own cached ones out of the prefix cache."""
        table = self.tables[row]
        for i in self._rewritten(row, end):
            block = table[i]
            if self.pool.is_shared(block):
                fresh = self.pool.allocate()
                self.k[:, fresh] = self.k[:, block]
                self.v[:, fresh] = self.v[:, block]
                table[i] = fresh
                self.block_table[row, i] = fresh
                self.pool.release([block])
            elif self.pool.is_cached(block):
                self.pool.forget(block)
        self.guarded[row] = self.lengths[row] // BLOCK_TOKENS

    def _trim(self, rows: list[int]) -> None:
        """Free the rows' blocks past their lengths."""
        tables, held, guarded, lengths, columns = self.tables, self.held, self.guarded, self.lengths, self._columns
        freed, index_rows, index_columns = [], [], []
        for row in rows:
            keep = -(-lengths[row] // BLOCK_TOKENS)
            extra = held[row] - keep
            if extra > 0:
                table = tables[row]
                freed += table[keep:]
                del table[keep:]
                index_rows += [row] * extra
                index_columns += columns[keep:held[row]]
                held[row] = keep
                if guarded[row] > keep:
                    guarded[row] = keep
        self.pool.release(freed)
        self._set_table(index_rows, index_columns, NULL_BLOCK)

    # -- lengths and rollback --------------------------------------------------------------------------------------
    def rewind(self, rows: list[int], num_tokens: list[int]) -> None:
        """Forget the last num_tokens[i] entries of rows[i]; blocks no longer used go back to the pool."""
        lengths = self.lengths
        for row, n in zip(rows, num_tokens):
            if n < 0 or n > lengths[row]:
                raise ValueError(f"cannot rewind row {row} by {n}: it holds {lengths[row]} entries")
        for row, n in zip(rows, num_tokens):
            lengths[row] -= n
        self._trim(rows)

    def truncate(self, row: int, length: int) -> None:
        """Keep only the first `length` entries of a row."""
        self.rewind([row], [self.lengths[row] - length])

    def keep_at_most(self, rows: list[int], lengths: list[int]) -> None:
        """Keep at most lengths[i] entries of rows[i] (a row already shorter keeps its own)."""
        held = self.lengths
        for row, length in zip(rows, lengths):
            if length < 0:
                raise ValueError(f"cannot keep {length} entries of row {row}")
            if length < held[row]:
                held[row] = length
        self._trim(rows)

    def reset(self, row: int) -> None:
        """Empty the row and give its blocks back (cached ones stay cached until evicted)."""
        self.lengths[row] = 0
        self._trim([row])
        self.guarded[row] = 0

    def room(self, row: int) -> int:
        """How many more tokens the row can take within max_len."""
        return self.max_len - self.lengths[row]

    # -- prefix reuse ------------------------------------------------------------------------------------------
    def attach_prefix(self, row: int, token_ids: list[int], max_tokens: int, count: bool = True) -> int:
        """Start an empty row with the longest cached prefix of token_ids (full blocks, at most max_tokens tokens);
        returns its length in tokens. The row then writes from there (prefilling only the rest). count=False: the
        caller counts the lookup in the pool's stats itself (it may yet undo the attach)."""
        if self.lengths[row] or self.tables[row]:
            raise ValueError(f"row {row} holds {self.lengths[row]} entries; reset it before attaching a prefix")
        if not self.prefix_caching:
            return 0
        blocks = self.pool.match(token_ids, min(max_tokens, len(token_ids)))
        for block in blocks:
            self.pool.share(block)
        if blocks:
            self.tables[row] = list(blocks)
            self._set_table([row] * len(blocks), self._columns[:len(blocks)], blocks)
        self.held[row] = self.guarded[row] = len(blocks)
        self.lengths[row] = len(blocks) * BLOCK_TOKENS
        if count:
            self.pool.count_lookup(len(token_ids), self.lengths[row])
        return self.lengths[row]

    def publish(self, row: int, token_ids: list[int]) -> None:
        """Offer the row's full blocks to later sequences: the row holds token_ids[:length] (the caller's word)."""
        if not self.prefix_caching:
            return
        n = min(self.lengths[row], len(token_ids))
        self.pool.publish(self.tables[row][:n // BLOCK_TOKENS], token_ids[:n])
        self.guarded[row] = max(self.guarded[row], n // BLOCK_TOKENS)

    # -- forwards ------------------------------------------------------------------------------------------------
    def _ends(self, rows: list[int], num_new: int, num_real: list[int] | None) -> list[int]:
        lengths = self.lengths
        if num_real is None:
            return [lengths[r] + num_new for r in rows]
        return [lengths[r] + n for r, n in zip(rows, num_real)]

    def _check_reserved(self, rows: list[int], ends: list[int]) -> None:
        """Reserve what a caller has not (a forward outside the scheduler: drafts, calibration, tools); a no-op
        on rows whose blocks are in place, but it also takes a block being rewritten out of the prefix cache."""
        self.reserve(rows, ends)

    def host_positions(self, rows: list[int], num_new: int, num_real: list[int] | None = None) -> list[int]:
        """Position of each of num_new new tokens per row, row-major [B * S], as host ints (what the native body
        takes with `block_table`); the blocks for the real ones are reserved."""
        self._check_reserved(rows, self._ends(rows, num_new, num_real))
        offsets = range(num_new)
        return [self.lengths[r] + s for r in rows for s in offsets]

    def window(self, rows: list[int], num_new: int, num_real: list[int] | None = None) -> CacheWindow:
        """Positions, slots and mask for appending num_new tokens to each row (PyTorch path).

        num_real[b] < num_new: row b is right-padded; its padding writes to the null block."""
        ends = self._ends(rows, num_new, num_real)
        self._check_reserved(rows, ends)
        lengths = [self.lengths[r] for r in rows]
        num_keys = max(max(ends), 1)
        width = blocks_for(num_keys)
        rows_t = torch.tensor(rows, dtype=torch.long)
        table = self.block_table[rows_t, :width]                                               # [B, blocks]
        read_slots = (table[:, :, None] * BLOCK_TOKENS + torch.arange(BLOCK_TOKENS)).flatten(1)[:, :num_keys]
        positions = torch.tensor(lengths, dtype=torch.long)[:, None] + torch.arange(num_new)[None, :]   # [B, S]
        real = positions < torch.tensor(ends, dtype=torch.long)[:, None]
        write_slots = torch.where(real, read_slots.gather(1, positions.clamp(max=num_keys - 1)), NULL_BLOCK)
        key_pos = torch.arange(num_keys)
        visible = (key_pos[None, None, :] <= positions[:, :, None])[:, None]                    # [B, 1, S, T]
        # Additive once per forward: attention would turn a bool mask into this very tensor in every layer.
        mask = torch.zeros(visible.shape, dtype=self.k.dtype).masked_fill_(~visible, float("-inf"))
        dev = self.device
        return CacheWindow(positions=positions.to(dev, non_blocking=True),
                           write_slots=write_slots.to(dev, non_blocking=True),
                           read_slots=read_slots.to(dev, non_blocking=True),
                           mask=mask.to(dev, non_blocking=True), num_keys=num_keys)

    def advance(self, rows: list[int], num_new: list[int] | int) -> None:
        """Count the tokens a forward wrote (rows may keep fewer than were written: padding)."""
        counts = [num_new] * len(rows) if isinstance(num_new, int) else num_new
        for r, n in zip(rows, counts):
            self.lengths[r] += n

    def write_and_read(self, layer: int, win: CacheWindow, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store k/v [B, S, H_kv, D] of the new tokens; return keys/values [B, T, H_kv, D] to attend over."""
        k_flat = self.k[layer].flatten(0, 1)   # [num_blocks * BLOCK_TOKENS, H_kv, D], a view
        v_flat = self.v[layer].flatten(0, 1)
        k_flat[win.write_slots] = k_new.to(k_flat.dtype)
        v_flat[win.write_slots] = v_new.to(v_flat.dtype)
        return k_flat[win.read_slots], v_flat[win.read_slots]


def pool_blocks(memory_bytes: int, bytes_per_token: int) -> int:
    """Blocks (the null block included) that memory_bytes of K and V hold."""
    return math.floor(memory_bytes / (bytes_per_token * BLOCK_TOKENS)) + 1
