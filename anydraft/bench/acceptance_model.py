"""Expected tokens per target forward from per-position acceptance rates: a chain of k drafts along a text, and the
best tree of n drafted tokens in Sequoia's positional model (bench/acceptance_bound.py)."""
from __future__ import annotations

import heapq

import torch


def chain_lengths(accept: torch.Tensor,  # [T] per-position acceptance probability (or 0/1)
                  k: int) -> float:
    """Mean over start positions of sum_{j=0..k} prod_{i<j} accept[t+i] (positions past the end count 0)."""
    padded = torch.cat([accept.double(), torch.zeros(k, dtype=torch.float64)])
    total = torch.ones(len(accept), dtype=torch.float64)
    running = torch.ones(len(accept), dtype=torch.float64)
    for i in range(k):
        running = running * padded[i:i + len(accept)]
        total += running
    return float(total.mean())


def tree_length(rank_accept: list[float], num_nodes: int) -> float:
    """1 + the largest sum of path products over a tree of num_nodes drafted nodes, where a node's r-th child is
    accepted with rank_accept[r] (Sequoia's positional model; rates non-increasing in r). Greedy on the frontier is
    optimal: a child is never worth more than its parent or its better-ranked sibling."""
    if any(later > earlier for earlier, later in zip(rank_accept, rank_accept[1:])):
        raise ValueError(f"rank_accept must not increase with the rank, got {rank_accept}")
    frontier = [(-rank_accept[0], 1.0, 0)]   # (-value, parent value, rank)
    total = 0.0
    for _ in range(num_nodes):
        negative, parent, rank = heapq.heappop(frontier)
        value = -negative
        total += value
        heapq.heappush(frontier, (-value * rank_accept[0], value, 0))            # its best child
        if rank + 1 < len(rank_accept):
            heapq.heappush(frontier, (-parent * rank_accept[rank + 1], parent, rank + 1))   # its next sibling
    return 1.0 + total
