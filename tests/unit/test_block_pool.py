"""The block pool and the paged KV cache's block bookkeeping, no model: allocation, sharing, the prefix cache's hash
chain (verified against collisions), LRU eviction, rollback across a block boundary, copy on write."""
from __future__ import annotations

import pytest
import torch

from anydraft.model.block_pool import NULL_BLOCK, BlockPool
from anydraft.model.kv_cache import BLOCK_TOKENS, CacheFull, KVCache

BS = BLOCK_TOKENS


def small_cache(num_blocks: int, max_batch: int = 3, max_len: int = 8 * BS) -> KVCache:
    return KVCache(num_layers=2, max_batch=max_batch, max_len=max_len, num_kv_heads=1, head_dim=4,
                   dtype=torch.float32, device="cpu", num_blocks=num_blocks)


def write(cache: KVCache, row: int, num_tokens: int, value: float = 1.0) -> None:
    """What a forward does to the cache: reserve, write k/v at the new slots, advance."""
    win = cache.window([row], num_tokens)
    k = torch.full((1, num_tokens, 1, 4), value)
    for layer in range(2):
        cache.write_and_read(layer, win, k, k)
    cache.advance([row], num_tokens)


def test_take_and_release_count_references_and_never_hand_out_the_null_block():
    pool = BlockPool(6, BS)
    blocks = pool.take(5)
    assert NULL_BLOCK not in blocks and len(set(blocks)) == 5 and pool.num_free == 0
    with pytest.raises(MemoryError):
        pool.take(1)
    pool.share(blocks[0])   # a second holder (a fork)
    pool.release(blocks)
    assert pool.num_free == 4 and pool.refs[blocks[0]] == 1
    pool.release([blocks[0]])
    assert pool.num_free == 5
    with pytest.raises(ValueError, match="released more often"):
        pool.release([blocks[0]])


def test_match_follows_the_chain_of_every_block_before():
    pool = BlockPool(8, BS)
    a, b = list(range(BS)), list(range(100, 100 + BS))
    blocks = pool.take(2)
    pool.publish(blocks, a + b)
    assert pool.match(a + b + [7], 3 * BS) == blocks
    assert pool.match(a + [5] * BS, 2 * BS) == blocks[:1]          # the second block's tokens differ
    assert pool.match(b + b, 2 * BS) == []                         # b's block is cached after a, not first
    assert pool.match(a + b, BS + BS - 1) == blocks[:1]            # max_tokens counts whole blocks only


def test_a_hash_collision_cannot_give_a_wrong_block(monkeypatch):
    monkeypatch.setattr(BlockPool, "chain_hash", staticmethod(lambda parent, tokens: 42))
    pool = BlockPool(8, BS)
    block = pool.take(1)
    pool.publish(block, list(range(BS)))
    assert pool.match(list(range(1, BS + 1)), BS) == []   # same hash, other tokens: compared, not trusted
    assert pool.match(list(range(BS)), BS) == block


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_freed_first():
    pool = BlockPool(4, BS)
    first, second, third = pool.take(3)
    pool.publish([first], [1] * BS)
    pool.publish([second], [2] * BS)
    pool.release([first])
    pool.release([second])
    assert pool.match([1] * BS, BS) == [first] and pool.match([2] * BS, BS) == [second]   # still cached
    assert pool.take(1) == [first]                 # the least recently freed goes first
    assert pool.match([1] * BS, BS) == [] and pool.match([2] * BS, BS) == [second]
    pool.release([third])                          # nothing cached in it: handed out before any cached block
    assert pool.take(2) == [third, second]


def test_rollback_churn_hands_out_spare_blocks_and_keeps_the_prefix_cache():
    """A step that reserves a block for its drafts and gives it back on rejection takes a spare block each time,
    not the least recently freed cached one: a finished request's prefix survives any number of such steps."""
    pool = BlockPool(4, BS)
    prefix, held = pool.take(2)
    pool.publish([prefix], [1] * BS)
    pool.release([prefix])                         # the request ended: its prefix stays cached
    for _ in range(5):
        (block,) = pool.take(1)                    # a verification crosses into a new block...
        assert block != prefix
        pool.release([block])                      # ...and its drafts are rejected
    assert pool.match([1] * BS, BS) == [prefix] and pool.num_free == 2


def test_rollback_across_a_block_boundary_frees_the_block_no_longer_used():
    cache = small_cache(8)
    write(cache, 0, BS + 4)
    assert cache.held[0] == 2 and cache.pool.num_free == 5
    cache.rewind([0], [3])                          # still in the second block
    assert cache.held[0] == 2 and cache.pool.num_free == 5
    cache.rewind([0], [2])                          # back to BS - 1 entries: the second block goes
    assert cache.length(0) == BS - 1 and cache.held[0] == 1 and cache.pool.num_free == 6
    assert cache.block_table[0, 1].item() == NULL_BLOCK
    cache.reset(0)
    assert cache.pool.num_free == 7 and cache.tables[0] == []


def test_reserve_is_all_or_nothing():
    cache = small_cache(4)                          # 3 usable blocks
    write(cache, 0, BS)
    with pytest.raises(CacheFull, match="free tokens"):
        cache.reserve([1, 2], [BS, 2 * BS])         # 3 blocks wanted, 2 free
    assert cache.held[1] == cache.held[2] == 0 and cache.pool.num_free == 2
    cache.reserve([1, 2], [BS, BS])
    assert cache.pool.num_free == 0


def test_a_prefix_hit_shares_blocks_and_a_write_into_a_shared_block_copies_it():
    cache = small_cache(10)
    tokens = list(range(3 * BS))
    write(cache, 0, 2 * BS + 3, value=1.0)
    cache.publish(0, tokens)
    hit = cache.attach_prefix(1, tokens, len(tokens) - 1)
    assert hit == 2 * BS and cache.tables[1] == cache.tables[0][:2]
    assert cache.pool.stats.hit_tokens == 2 * BS and cache.pool.stats.queried_tokens == len(tokens)
    shared = cache.tables[0][1]
    cache.truncate(1, BS + 4)                       # row 1 rolls back into the shared second block ...
    write(cache, 1, 4, value=7.0)                   # ... and writes there: its own copy, row 0's block intact
    assert cache.tables[1][1] != shared and cache.tables[1][0] == cache.tables[0][0]
    k0, _ = cache.entries(0)
    k1, _ = cache.entries(1)
    assert torch.equal(k1[:, :BS + 4], k0[:, :BS + 4])                 # the copy kept what came before
    assert torch.all(k1[:, BS + 4:] == 7.0) and torch.all(k0 == 1.0)
    cache.reset(0)
    cache.reset(1)
    assert cache.pool.num_free == 9


def test_a_cached_block_rewritten_by_its_only_holder_leaves_the_prefix_cache():
    cache = small_cache(6)
    tokens = list(range(2 * BS))
    write(cache, 0, 2 * BS)
    cache.publish(0, tokens)
    cache.truncate(0, BS + 2)
    write(cache, 0, 1, value=5.0)                   # the second block no longer holds tokens[BS:2 * BS]
    cache.reset(0)
    assert cache.attach_prefix(1, tokens + [0], 2 * BS) == BS


def test_prefix_caching_off_finds_and_caches_nothing():
    cache = small_cache(6)
    cache.prefix_caching = False
    write(cache, 0, BS)
    cache.publish(0, list(range(BS)))
    cache.reset(0)
    assert cache.attach_prefix(1, list(range(BS)) + [1], BS) == 0 and not cache.pool.cached
