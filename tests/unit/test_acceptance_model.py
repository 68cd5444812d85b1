"""The acceptance arithmetic of bench/acceptance_bound.py (anydraft/bench/acceptance_model.py) on hand-made rates:
a chain's expected tokens per forward along a text, and the best tree against every tree, enumerated."""
from __future__ import annotations

import math

import pytest
import torch

from anydraft.bench.acceptance_model import chain_lengths, tree_length


def test_a_chain_counts_the_accepted_prefix_from_every_position():
    # from position 0: 1 + 0.5 + 0.5 * 0.5; from position 1: 1 + 0.5 (nothing past the text's end)
    assert chain_lengths(torch.tensor([0.5, 0.5]), 2) == pytest.approx((1.75 + 1.5) / 2)
    # greedy agreement (0/1): a run of matches stops at the first miss
    assert chain_lengths(torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 3) == pytest.approx(
        (3 + 2 + 1 + 4 + 4 + 3 + 2) / 7)
    assert chain_lengths(torch.zeros(5), 4) == 1.0


def test_a_tree_of_one_rank_is_a_chain():
    assert tree_length([0.6], 5) == pytest.approx(sum(0.6 ** i for i in range(6)))


def _best_by_enumeration(rates: list[float], num_nodes: int) -> float:
    """Every tree of num_nodes nodes closed under parent and better-ranked sibling (a node is its ranks from the root),
    the best sum of path products."""
    def value(node):
        return math.prod(rates[r] for r in node)
    best = 0.0
    frontier_trees = {frozenset()}
    for _ in range(num_nodes):
        grown = set()
        for tree in frontier_trees:
            for parent in [()] + list(tree):
                for rank in range(len(rates)):
                    node = parent + (rank,)
                    if node not in tree and (rank == 0 or parent + (rank - 1,) in tree):
                        grown.add(tree | {node})
        frontier_trees = grown
    for tree in frontier_trees:
        best = max(best, sum(value(node) for node in tree))
    return 1.0 + best


@pytest.mark.parametrize("rates", [[0.68, 0.15, 0.05], [0.9, 0.05, 0.04], [0.4, 0.3, 0.3]])
@pytest.mark.parametrize("num_nodes", [1, 3, 5, 6])
def test_the_frontier_tree_is_the_best_of_every_tree(rates, num_nodes):
    assert tree_length(rates, num_nodes) == pytest.approx(_best_by_enumeration(rates, num_nodes))


def test_rates_that_rise_with_the_rank_are_refused():
    with pytest.raises(ValueError, match="must not increase"):
        tree_length([0.2, 0.5], 3)


def test_enumeration_finds_more_than_a_chain():
    """Control for the test above: the brute force sees branching trees (two children of the root, then one below
    the first), worth more here than the chain of three."""
    rates = [0.5, 0.4]
    assert _best_by_enumeration(rates, 3) == pytest.approx(1 + 0.5 + 0.4 + 0.25)
    assert _best_by_enumeration(rates, 3) > 1 + 0.5 + 0.25 + 0.125
