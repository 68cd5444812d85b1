"""The Proposer protocol: the one seam through which draft strategies plug into the engine step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..model.captured_states import CapturedStates


@dataclass
class SamplingBatch:
    """Per-row sampling settings of the running rows (None in place of this = every row greedy)."""
    temperature: torch.Tensor   # [B]
    top_k: torch.Tensor | None  # [B] long, 0 = off; None = no row truncates (skips the vocabulary sort)
    top_p: torch.Tensor | None  # [B]; None = no row truncates
    randoms: list               # [B] RowRandom, one seeded stream per request; None for a greedy row
    # [B, k+1] int64: the step's noise keys per row and position when its draws are coupled (TargetStep.couple): the
    # target draws its token at position i with key i (ModelRunner.sample_ids), a coupling proposer its i-th draft
    # with the same key, and verification accepts a draft iff it equals the target's draw. None: rejection sampling.
    keys: torch.Tensor | None = None
    top_k_max: int = 0   # host: the largest top_k where every row has a top-k cut; 0 where some row has none

    @property
    def sampled(self) -> list[bool]:
        """[B] host: whether each row samples (a greedy row has no stream)."""
        return [r is not None for r in self.randoms]

    @property
    def any_greedy(self) -> bool:
        """Whether some row is greedy (host fact: logits_to_probs skips its one-hot pass when none is)."""
        return any(r is None for r in self.randoms)

    def rows(self, index: list[int]) -> "SamplingBatch":
        """The settings, streams and noise keys of the rows at `index` (host ints), every per-row field taken
        (top_k_max kept: still a bound on their top-k cuts)."""
        at = torch.tensor(index, device=self.temperature.device)

        def take(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values[at]
        return SamplingBatch(temperature=self.temperature[at], top_k=take(self.top_k), top_p=take(self.top_p),
                             randoms=[self.randoms[i] for i in index], keys=take(self.keys), top_k_max=self.top_k_max)

    @property
    def untruncated(self) -> bool:
        """Every row samples from its full softmax(logits / T): no greedy row, no top-k / top-p (host fact). Then
        a native sampling head can draw the tokens without the probabilities (ModelRunner.sample_ids)."""
        return self.top_k is None and self.top_p is None and not self.any_greedy


@dataclass
class Proposal:
    draft_target_ids: torch.Tensor          # [B, k] proposals already in TARGET ids
    draft_probs: torch.Tensor | None        # [B, k, N] draft distribution q over its columns; None if greedy
    # Columns: by default N = V_target_rows and column j is target id j. A draft whose support is a part of the
    # target vocabulary (TLI, d2t) keeps q over its own head rows instead of a [B, k, V_target] scatter:
    draft_columns: torch.Tensor | None = None      # [B, k] column of each proposal in draft_probs
    column_to_target: torch.Tensor | None = None   # [N] target id of each column (injective)
    # [B] host ints: row i proposes only its first num_draft_tokens[i] ids (0..k; the rest is padding), as SLEM
    # does when a text spells fewer target tokens than k. None = every row proposes all k.
    num_draft_tokens: list[int] | None = None


def empty_proposal(batch: int, target_vocab_rows: int, sampling: bool, device: torch.device) -> Proposal:
    """No proposals: the step verifies nothing and emits the target's own next token."""
    probs = torch.empty((batch, 0, target_vocab_rows), device=device) if sampling else None
    return Proposal(torch.empty((batch, 0), dtype=torch.long, device=device), probs)


class Proposer(Protocol):
    """Proposes k target tokens per row and keeps its own state in step with the target's accepted text.

    A proposer that cannot keep sampling lossless sets `sampling_refusal` (a message saying what to change): the
    engine then refuses requests with temperature > 0. One whose drafts can use the step's noise keys
    (SamplingBatch.keys) sets `couples_draws` True."""

    num_speculative_tokens: int
    # Seconds the last proposal spent after its first draft forward (its further forwards and heads): adaptive k prices
    # a proposal as its first forward, with the work a proposal does once, plus draft_forwards(k) - 1 such forwards.
    later_draft_seconds: float

    def add_request(self, row: int, prompt_text: str, prompt_target_ids: list[int]) -> None:
        """A request took cache row `row`; its prompt is known both as text and as target ids."""

    def propose(self, rows: list[int], sampling: SamplingBatch | None, num_tokens: int | None = None,
                target_states: list[CapturedStates] | None = None) -> Proposal:
        """num_tokens proposals (default num_speculative_tokens; 0 = none, a plain target step) for each of
        `rows` (no host sync inside). target_states: the target hidden states its forwards captured since the last
        proposal (ModelRunner.take_hidden_states), which a hidden-state draft reads; a draft that reads text
        ignores them."""

    def draft_forwards(self, num_tokens: int) -> int:
        """Draft forwards a proposal of num_tokens costs (adaptive k's cost model scales the measured cost of
        one by this): num_tokens for a draft that writes one token per forward, 1 for one that writes a block."""

    def unread_tokens(self, rows: list[int]) -> int:
        """Target tokens of text the next proposal for `rows` reads once, beyond a drafting step's own (the prompts of
        rows that joined): adaptive k prices reading them. 0 for a proposer that reads in observe."""

    def observe(self, rows: list[int], num_accepted: list[int], new_target_ids: list[list[int]]) -> None:
        """new_target_ids[i]: the tokens appended to row i's target sequence since the last call. After
        verification: the num_accepted[i] accepted proposals, then the recovered or bonus token. After
        add_request: the first token, from the target's prompt forward (num_accepted 0, nothing proposed)."""

    def remove_request(self, row: int) -> None:
        """The request left; its row may be reused."""


def draft_runner(proposer):
    """The draft model's ModelRunner where the proposer runs one with a KV cache of its own (draft model, SLEM),
    else None (no draft; hidden-state drafters keep their caches inside)."""
    return getattr(proposer, "runner", None)


class NoDraftProposer:
    """Proposes nothing (k = 0): the step then degenerates to target-alone decoding, same code path."""

    num_speculative_tokens = 0
    later_draft_seconds = 0.0

    def __init__(self, device: torch.device, target_vocab_rows: int):
        self.device = device
        self.target_vocab_rows = target_vocab_rows

    def add_request(self, row, prompt_text, prompt_target_ids):
        pass

    def draft_forwards(self, num_tokens):
        return 0

    def unread_tokens(self, rows):
        return 0

    def propose(self, rows, sampling, num_tokens=None, target_states=None):
        return empty_proposal(len(rows), self.target_vocab_rows, sampling is not None, self.device)

    def observe(self, rows, num_accepted, new_target_ids):
        pass

    def remove_request(self, row):
        pass
