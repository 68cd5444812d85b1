"""vocab_mode="auto"'s rule (vocab/mode_choice.py) on constructed inputs favouring each mode, and the coverage it
reads off a bridge and token counts."""
from __future__ import annotations

import pytest
import torch

from anydraft.vocab.bridge import BridgeStats, VocabBridge
from anydraft.vocab.mode_choice import (SLEM_COVERAGE_THRESHOLD, TliCoverage, choose_vocab_mode,
                                        modeled_acceptance_length, modeled_tli_al_loss, slem_head_size,
                                        tli_coverage)

HIGH = TliCoverage(target_side=0.99, draft_side=0.995, corpus="in-domain.jsonl")
LOW = TliCoverage(target_side=0.97, draft_side=0.90, corpus="in-domain.jsonl")


def test_d2t_when_the_draft_ships_a_table_whatever_else_holds():
    for same, coverage in ((True, None), (True, HIGH), (False, LOW)):
        mode, reason = choose_vocab_mode(same_vocabulary=same, has_d2t=True, coverage=coverage)
        assert mode == "d2t" and "d2t table" in reason


def test_identity_for_the_same_vocabulary():
    mode, reason = choose_vocab_mode(same_vocabulary=True, has_d2t=False, coverage=None)
    assert mode == "identity" and "same vocabulary" in reason


def test_tli_when_the_intersection_covers_the_corpus():
    mode, reason = choose_vocab_mode(same_vocabulary=False, has_d2t=False, coverage=HIGH)
    assert mode == "tli"
    assert "98.5%" in reason and "in-domain.jsonl" in reason   # 0.99 * 0.995, and which corpus


def test_slem_when_the_intersection_misses_much_of_the_corpus():
    mode, reason = choose_vocab_mode(same_vocabulary=False, has_d2t=False, coverage=LOW)
    assert mode == "slem"
    assert "87.3%" in reason and "below 95%" in reason          # 0.97 * 0.90


def test_the_weaker_side_alone_can_call_for_slem():
    """High draft-side coverage does not hide a target side TLI cannot propose (and the other way round)."""
    for coverage in (TliCoverage(0.92, 1.0, "c"), TliCoverage(1.0, 0.92, "c")):
        assert choose_vocab_mode(False, False, coverage)[0] == "slem"


def test_threshold_is_inclusive_for_tli_and_configurable():
    at = TliCoverage(1.0, SLEM_COVERAGE_THRESHOLD, "c")
    assert choose_vocab_mode(False, False, at)[0] == "tli"
    assert choose_vocab_mode(False, False, at, threshold=0.96)[0] == "slem"


def test_no_corpus_keeps_tli_and_says_coverage_was_not_measured():
    mode, reason = choose_vocab_mode(same_vocabulary=False, has_d2t=False, coverage=None)
    assert mode == "tli" and "not measured" in reason


def test_threshold_matches_its_stated_al_loss():
    """The docstring's justification: at the threshold TLI loses about 10% of the unrestricted AL (a = 0.85,
    k = 5); more coverage, less loss."""
    assert modeled_acceptance_length(0.5, 2) == pytest.approx(1.75)
    assert modeled_tli_al_loss(SLEM_COVERAGE_THRESHOLD) == pytest.approx(0.10, abs=0.01)
    assert modeled_tli_al_loss(1.0) == 0.0
    assert modeled_tli_al_loss(0.9) > modeled_tli_al_loss(0.95) > modeled_tli_al_loss(0.99) > 0


def _bridge(draft_to_target: list[int], target_rows: int) -> VocabBridge:
    d2t = torch.tensor(draft_to_target)
    t2d = torch.full((target_rows,), -1, dtype=torch.long)
    t2d[d2t[d2t >= 0]] = torch.nonzero(d2t >= 0).flatten()
    stats = BridgeStats(target_rows, len(d2t), target_rows, len(d2t), int((d2t >= 0).sum()), 0, 0.0, 0.0)
    return VocabBridge(target_rows, len(d2t), False, d2t, t2d, d2t >= 0, stats)


def test_coverage_counts_occurrences_on_each_side():
    # draft ids 0, 1 map to target ids 2, 0; draft id 2 and target id 1 are outside the intersection
    bridge = _bridge([2, 0, -1], target_rows=3)
    target_counts = torch.tensor([6, 2, 2])     # ids 0 and 2 inside: 8 of 10
    draft_counts = torch.tensor([1, 2, 1])      # ids 0 and 1 inside: 3 of 4
    coverage = tli_coverage(bridge, target_counts, draft_counts, "c")
    assert (coverage.target_side, coverage.draft_side) == (0.8, 0.75)
    assert coverage.combined == pytest.approx(0.6)
    with pytest.raises(ValueError, match="no tokens"):
        tli_coverage(bridge, torch.zeros(3, dtype=torch.long), draft_counts, "empty.txt")


@pytest.mark.parametrize("rows_for_coverage, num_token_rows, expected", [
    (7372, 151669, 8192),    # qwen3's own tokens of GSM8K train: 99% in 7372 rows
    (4096, 151669, 4096),    # a power of two already
    (1, 32000, 1),
    (20000, 32000, None),    # 32768 is not a cut of a 32000-token vocabulary: keep the whole head
    (None, 32000, None),     # the corpus gave no such size
])
def test_slem_head_size_rounds_the_99pct_cut_up_to_a_power_of_two(rows_for_coverage, num_token_rows, expected):
    assert slem_head_size(rows_for_coverage, num_token_rows) == expected
