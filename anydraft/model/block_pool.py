"""The block pool: fixed-size KV blocks, their reference counts, and the prefix cache over full blocks.

No tensors here: the pool hands out block ids; KVCache maps them to storage. A full block may be published
under the hash of its tokens and of every block before it (its chain); a later sequence starting with the same
tokens reuses it. A block whose last reference is dropped keeps its contents and hash on the free queue until it
is handed out again, least recently freed first (LRU eviction), as vLLM's automatic prefix caching does. Free
blocks that hold nothing cached (never published: a partial last block, slots a rejected draft gave back) are
handed out before any cached one, so rollback churn does not evict the prefix cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

NULL_BLOCK = 0   # never handed out: the write target of a padded batch's padding (the PyTorch path)


@dataclass
class PrefixStats:
    """Prefix-cache lookups, in tokens (as vLLM counts them): queried = prompt tokens looked up, hit = found."""
    queried_tokens: int = 0
    hit_tokens: int = 0
    queries: int = 0
    hits: int = 0   # lookups that found at least one block


class BlockPool:
    """Block ids 1..num_blocks-1 (0 is the null block); `spare` holds free blocks with nothing cached, handed out
    first; `free` the free cached ones in eviction order, oldest first."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks (one is the null block), got {num_blocks}; "
                             f"give the KV cache more memory")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        # A dict keeps insertion order: the free queue, oldest first, with O(1) removal of a block a hit revives.
        self.spare: dict[int, None] = dict.fromkeys(range(1, num_blocks))
        self.free: dict[int, None] = {}
        self.cached: dict[int, int] = {}               # chain hash -> block
        self.block_key: dict[int, tuple] = {}          # block -> (parent block or -1, its tokens), while cached
        self.block_hash: dict[int, int] = {}           # block -> chain hash, while cached
        self.stats = PrefixStats()

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached free blocks count: they are evicted on demand)."""
        return len(self.spare) + len(self.free)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    def usage(self) -> float:
        """Fraction of usable blocks referenced by some sequence (vLLM's kv_cache_usage)."""
        return 1.0 - self.num_free / self.usable_blocks

    def take(self, n: int) -> list[int]:
        """n fresh blocks with one reference each: spare ones first, then cached ones least recently freed first
        (evicting their contents). No call per block: a step's host work does not grow with the blocks it crosses
        into."""
        if n > self.num_free:
            raise MemoryError(f"KV block pool has {self.num_free} free blocks, {n} wanted")
        spare = list(islice(self.spare, n))
        blocks = spare + list(islice(self.free, n - len(spare)))
        free, refs, block_hash, cached, block_key = self.free, self.refs, self.block_hash, self.cached, self.block_key
        spares = self.spare
        for block in spare:
            del spares[block]
        for block in blocks[len(spare):]:
            del free[block]
        for block in blocks:
            refs[block] = 1
            if block in block_hash:
                del cached[block_hash[block]]
                del block_hash[block]
                del block_key[block]
        return blocks

    def allocate(self) -> int:
        """A fresh block with one reference; evicts the least recently freed cached block."""
        return self.take(1)[0]

    def share(self, block: int) -> None:
        """One more reference to a block (a prefix hit, or a fork)."""
        if self.refs[block] == 0:   # a free block: a prefix hit revives a cached one
            del (self.free if block in self.free else self.spare)[block]
        self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; unreferenced ones go to the free queue (cached) or to the spares.
        Given a sequence's blocks in order, its tail goes first, so its tail is evicted first and its head (shared
        by more prompts) last."""
        refs, free, spare, block_hash = self.refs, self.free, self.spare, self.block_hash
        for block in reversed(blocks):
            if refs[block] <= 0:
                raise ValueError(f"block {block} released more often than referenced")
            refs[block] -= 1
            if refs[block] == 0:
                (free if block in block_hash else spare)[block] = None

    def is_shared(self, block: int) -> bool:
        return self.refs[block] > 1

    def is_cached(self, block: int) -> bool:
        return block in self.block_hash

    # -- prefix cache ----------------------------------------------------------------------------------------
    @staticmethod
    def chain_hash(parent_hash: int, tokens: tuple) -> int:
        return hash((parent_hash, tokens))

    def match(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """The cached blocks holding the longest prefix of token_ids in full blocks, at most max_tokens tokens.
        Each block's tokens and parent are compared, not only the hash: a collision cannot give a wrong block."""
        bs = self.block_size
        blocks: list[int] = []
        parent_hash, parent = 0, -1
        for start in range(0, max_tokens - bs + 1, bs):
            tokens = tuple(token_ids[start:start + bs])
            h = self.chain_hash(parent_hash, tokens)
            block = self.cached.get(h)
            if block is None or self.block_key.get(block) != (parent, tokens):
                break
            blocks.append(block)
            parent_hash, parent = h, block
        return blocks

    def count_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        """One prefix lookup for the metrics: a sequence's tokens, and how many of them were found cached."""
        self.stats.queries += 1
        self.stats.queried_tokens += queried_tokens
        self.stats.hit_tokens += hit_tokens
        self.stats.hits += hit_tokens > 0

    def publish(self, blocks: list[int], token_ids: list[int]) -> None:
        """Cache a sequence's full blocks: blocks[i] holds token_ids[i*bs:(i+1)*bs] after every block before it.
        Blocks cached already (a prefix hit) keep their entry; a chain whose hash is held by another block stops
        there (the same tokens are cached in that one)."""
        bs = self.block_size
        parent_hash, parent = 0, -1
        for i, block in enumerate(blocks[:len(token_ids) // bs]):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            h = self.chain_hash(parent_hash, tokens)
            if self.block_hash.get(block) != h:
                if block in self.block_hash:     # cached under other tokens: stale, the block was rewritten
                    self._uncache(block)
                holder = self.cached.get(h)
                if holder is not None and holder != block:
                    return
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_key[block] = (parent, tokens)
            parent_hash, parent = h, block

    def forget(self, block: int) -> None:
        """The block is about to be rewritten by its only holder: it no longer holds what its hash says."""
        self._uncache(block)

    def _uncache(self, block: int) -> None:
        h = self.block_hash.pop(block, None)
        if h is not None:
            del self.cached[h]
            del self.block_key[block]
