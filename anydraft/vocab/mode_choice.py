"""vocab_mode="auto": the one rule that picks identity, d2t, TLI or SLEM for a target/draft pair, and says why.

The rule, in order:
1. d2t      when the draft ships a d2t table (a reduced head made for this target's vocabulary: speculators,
            FR-Spec heads); the table is the draft's own statement of how its rows map.
2. identity when both tokenizers are the same vocabulary (same tokens, same ids): nothing to map.
3. TLI or SLEM by corpus coverage. TLI confines the draft to the byte-compared intersection, which binds in
   two ways: a target token outside the intersection can never be proposed (the accepted run stops there),
   and a draft token outside it forces the draft off its own tokenization (it must spell the text in
   smaller pieces it was not trained on). SLEM lets the draft write freely and re-tokenizes its text with the
   target's tokenizer, so neither binds, at the price of host work each step. Coverage
       c = (share of the target's tokenization of the corpus inside the intersection)
         × (share of the draft's tokenization of the corpus inside the intersection)
   estimates the share of positions where TLI's restriction does not bind (the two sides taken as
   independent). SLEM when c < SLEM_COVERAGE_THRESHOLD, else TLI.

Why 0.95: if a draft accepts with per-position rate a unrestricted, TLI accepts about c·a, and the expected tokens
of a step drafting k is AL(a, k) = 1 + a + ... + a^k. At the shipped pairs' per-position acceptance (a ≈ 0.85;
bench/results/2026-11-29-s5/eval_*.json: 0.88 / 0.79 / 0.73 cumulative at k = 3) and k = 5, c = 0.95 costs TLI ≈
10% of its AL (modeled_tli_al_loss): below that SLEM's extra host work (re-tokenizing the draft's text every step)
is likely to pay for itself, above it TLI, which also serves sampling, keeps its edge. The threshold is a model,
not a measurement: `anydraft advise` measures the AL the chosen mode reaches.

When auto picks SLEM it also cuts the draft's head (slem_head_size): to the smallest power of two that keeps
SLEM_HEAD_COVERAGE of the draft's own tokenization of the same corpus (vocab/frequency.py), when that is smaller
than the draft's vocabulary. A draft writes few distinct tokens in a domain, and a large-vocabulary draft's head
is most of its forward (qwen3-draft: 151936 rows × 192 against one 192-wide layer); the cut changes proposals only
where the draft's favourite falls outside it, never the output. Measured on mistral-target + qwen3-draft, GSM8K
(bench/results/2026-11-30-slem/): qwen3's 99% size there is 7372, so 8192 rows: the same AL as the whole head at
fixed k = 5 (3.15), draft time per step ~6× lower. An explicit draft_vocab_size overrides the rule.

The corpus decides, so auto needs the operator's in-domain text (vocab_mode_corpus).
On GSM8K train, qwen3 <-> smollm2 gives c ≈ 0.966 (TLI) and qwen3 <-> mistral c ≈ 0.940 (SLEM); on a few
paragraphs mixing prose, code, tabs and CJK the same pairs give 0.898 and 0.879. No built-in text can stand
for every domain, so without a corpus auto keeps TLI (it serves greedy and sampling requests alike) and says
that coverage was not measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .bridge import VocabBridge

SLEM_COVERAGE_THRESHOLD = 0.95
SLEM_HEAD_COVERAGE = 0.99   # share of the draft's own corpus tokens auto's SLEM head keeps
TYPICAL_ACCEPTANCE = 0.85   # per-position acceptance of the shipped cross-vocabulary pairs (GSM8K, bench/results/2026-11-29-s5/)
TYPICAL_K = 5               # the default num_speculative_tokens


@dataclass(frozen=True)
class TliCoverage:
    """How much of a corpus TLI's intersection covers, on each side."""
    target_side: float   # share of the target's tokens of the corpus that are in the intersection
    draft_side: float    # share of the draft's tokens of the corpus that are in the intersection
    corpus: str          # what was measured (a file path or "built-in probe text")

    @property
    def combined(self) -> float:
        return self.target_side * self.draft_side

    def to_dict(self) -> dict:
        return {**asdict(self), "combined": self.combined}


def tli_coverage(bridge: VocabBridge,
                 target_counts: torch.Tensor,   # [V_target_rows] occurrences of each target id in the corpus
                 draft_counts: torch.Tensor,    # [V_draft_rows] occurrences of each draft id in the corpus
                 corpus: str) -> TliCoverage:
    """Coverage of a corpus by the intersection of a (non-identity) bridge, from per-id token counts."""
    if bridge.is_identity:
        return TliCoverage(1.0, 1.0, corpus)
    target_in = bridge.target_to_draft >= 0                     # [V_target_rows]
    draft_in = bridge.draft_in_intersection                     # [V_draft_rows]
    target_total, draft_total = int(target_counts.sum()), int(draft_counts.sum())
    if not target_total or not draft_total:
        raise ValueError(f"corpus {corpus} tokenizes to no tokens; give in-domain text to measure coverage on")
    return TliCoverage(int(target_counts[target_in].sum()) / target_total,
                       int(draft_counts[draft_in].sum()) / draft_total, corpus)


def modeled_acceptance_length(per_position_acceptance: float, k: int) -> float:
    """1 + a + a^2 + ... + a^k: expected tokens of a step drafting k, acceptance a at every position."""
    return sum(per_position_acceptance ** i for i in range(k + 1))


def modeled_tli_al_loss(coverage: float, acceptance: float = TYPICAL_ACCEPTANCE, k: int = TYPICAL_K) -> float:
    """Share of the unrestricted AL that TLI loses when only a `coverage` share of positions is proposable."""
    return 1 - modeled_acceptance_length(coverage * acceptance, k) / modeled_acceptance_length(acceptance, k)


def choose_vocab_mode(same_vocabulary: bool, has_d2t: bool, coverage: TliCoverage | None,
                      threshold: float = SLEM_COVERAGE_THRESHOLD) -> tuple[str, str]:
    """(mode, reason): the mode auto picks for a pair and one sentence saying why (see the module docstring)."""
    if has_d2t:
        return "d2t", "the draft ships a d2t table (a reduced head mapped to the target's vocabulary)"
    if same_vocabulary:
        return "identity", "draft and target have the same vocabulary (same tokens, same ids)"
    if coverage is None:
        return "tli", ("different vocabularies; no in-domain corpus given (vocab_mode_corpus), so coverage was not "
                       "measured: TLI, the default across vocabularies (`anydraft advise` measures it)")
    c = coverage.combined
    measured = (f"intersection covers {100 * c:.1f}% of {coverage.corpus} (target side "
                f"{100 * coverage.target_side:.1f}% × draft side {100 * coverage.draft_side:.1f}%)")
    loss = f"modeled TLI AL loss {100 * modeled_tli_al_loss(c):.1f}%"
    if c < threshold:
        return "slem", f"{measured}, below {100 * threshold:g}% ({loss}): SLEM lets the draft write freely"
    return "tli", f"{measured}, at least {100 * threshold:g}% ({loss}): TLI"


def slem_head_size(rows_for_coverage: int | None, num_token_rows: int) -> int | None:
    """Head rows auto gives a SLEM draft: rows_for_coverage (the top-N cut keeping SLEM_HEAD_COVERAGE of the draft's
    own tokenization of the corpus: frequency.coverage_report) rounded up to a power of two; None (the whole head)
    when that is not smaller than the draft's vocabulary or the corpus gave no such N."""
    if not rows_for_coverage:
        return None
    size = 1 << (rows_for_coverage - 1).bit_length()
    return size if size < num_token_rows else None
