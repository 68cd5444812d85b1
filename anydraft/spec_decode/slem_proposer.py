"""SlemProposer: string-level exact match. The draft writes k tokens freely in its own vocabulary; their text,
tokenized by the target's tokenizer, is what the target verifies (greedy only).

Per step and row: the draft's k + 1 ids -> their bytes -> the target ids of that text that can no longer change
(vocab/slem_window.py), at most k, possibly none: the proposal is ragged (Proposal.num_draft_tokens).
After verification the draft keeps those of its own written tokens that the accepted text spells whole, and
re-syncs the rest of the text (vocab/resync.py), so it reads the target's text in its own tokenization.
Reading the draft's ids on the host is a second sync per step: tokenizing text cannot happen on the device.
With draft_vocab_size the draft writes only the N ids its own tokenization of a corpus uses most (its head reads
N rows, not the whole vocabulary: a large-vocabulary draft's head is most of its cost); the target still
verifies the text, so the output is unchanged.
"""
from __future__ import annotations

import torch

from ..model.captured_states import CapturedStates
from ..model.runner import ModelRunner
from ..tensors import host_to_device
from ..tokenizer import Tokenizer
from ..vocab.bridge import VocabBridge
from ..vocab.resync import DraftResync
from ..vocab.slem_window import SlemWindow
from ..vocab.token_bytes import TokenKind
from .draft_proposer import DraftModelProposer
from .draft_vocab import DraftVocab, ResyncContextSync
from .proposer import Proposal, SamplingBatch, empty_proposal

SAMPLING_REFUSAL = ("vocab_mode 'slem' decodes greedily only; send temperature=0, or use vocab_mode 'tli' "
                    "to sample")
PAD_PROPOSAL = 0   # target id in a row's unused proposal slots (never accepted: past the row's count)


class SlemProposer:
    sampling_refusal = SAMPLING_REFUSAL   # read by the engine when a request asks for temperature > 0

    def __init__(self, writer: DraftModelProposer, resync: DraftResync, window: SlemWindow,
                 draft_tokenizer: Tokenizer, draft_special_to_target: dict[int, int], target_vocab_rows: int):
        self.writer = writer             # the draft model and its per-row state (draft ids, KV cache)
        self.resync = resync
        self.window = window
        self.num_speculative_tokens = writer.num_speculative_tokens
        self.device = writer.device
        self.target_vocab_rows = target_vocab_rows
        table = draft_tokenizer.token_table
        self._draft_bytes = table.token_bytes                                          # [V_draft_tokens]
        self._draft_no_text = frozenset(table.ids_of_kinds(TokenKind.SPECIAL, TokenKind.MISSING))
        self._draft_special_to_target = draft_special_to_target   # draft eos -> target eos, by role
        self.target_tails: dict[int, list[int]] = {}   # row -> its last verified target ids (the look-back)
        self.written: dict[int, list[int]] = {}        # row -> the draft ids written at the last propose

    @property
    def runner(self):
        """The draft model's runner (its kernels and costs are what reports and the advisor time)."""
        return self.writer.runner

    def add_request(self, row: int, prompt_text: str, prompt_target_ids: list[int]) -> None:
        self.writer.add_request(row, prompt_text, prompt_target_ids)
        self.writer.start_rows([row])   # observe re-syncs every row on every step (no backlog): it needs the state now
        self.target_tails[row] = self.window.tail(list(prompt_target_ids))
        self.written[row] = []

    def remove_request(self, row: int) -> None:
        self.writer.remove_request(row)
        self.target_tails.pop(row, None)
        self.written.pop(row, None)

    def unread_tokens(self, rows: list[int]) -> int:
        return self.writer.unread_tokens(rows)

    def draft_forwards(self, num_tokens: int) -> int:
        """The draft writes one token more than it proposes (see propose)."""
        return self.writer.draft_forwards(num_tokens + 1) if num_tokens else 0

    @property
    def later_draft_seconds(self) -> float:
        return self.writer.later_draft_seconds

    def propose(self, rows: list[int], sampling: SamplingBatch | None, num_tokens: int | None = None,
                target_states: list[CapturedStates] | None = None) -> Proposal:
        if sampling is not None:
            raise ValueError(SAMPLING_REFUSAL)
        k = self.num_speculative_tokens if num_tokens is None else num_tokens
        if k == 0:
            for row in rows:
                self.written[row] = []
            return empty_proposal(len(rows), self.target_vocab_rows, False, self.device)
        # One draft token more than k: the text's last target token is held back (a longer text could re-split
        # it), so k draft tokens of a vocabulary as fine as the target's would fill only k - 1 proposals.
        written = self.writer.propose(rows, None, k + 1).draft_target_ids.tolist()   # [B, k+1] draft ids: host sync
        proposals = []
        for row, draft_ids in zip(rows, written):
            self.written[row] = draft_ids
            proposals.append(self._target_ids_of(row, draft_ids, k))
        counts = [len(p) for p in proposals]
        width = max(counts)
        target_ids = host_to_device([p + [PAD_PROPOSAL] * (width - len(p)) for p in proposals], self.device,
                                    torch.long)                                                     # [B, width]
        return Proposal(target_ids, None, num_draft_tokens=counts)

    def _target_ids_of(self, row: int, draft_ids: list[int], k: int) -> list[int]:
        """The target ids of the text the draft wrote (at most k), after the row's verified text."""
        pieces, special = [], None
        for draft_id in draft_ids:
            if draft_id in self._draft_no_text:
                special = self._draft_special_to_target.get(draft_id)   # e.g. its eos: the text ends here
                break
            pieces.append(self._draft_bytes[draft_id])
        text = b"".join(pieces)
        pending = self.writer.states[row].pending   # verified bytes the draft has not read yet: it wrote them first
        if not text.startswith(pending):
            return []
        text = text[len(pending):]
        tail = self.target_tails[row]
        target_ids = self.window.propose(tail, text, final=special is not None, max_tokens=k)
        if (special is not None and len(target_ids) < k
                and b"".join(self.window.token_bytes(t) for t in target_ids) == text):
            target_ids.append(special)
        return target_ids

    def observe(self, rows: list[int], num_accepted: list[int], new_target_ids: list[list[int]]) -> None:
        runner: ModelRunner = self.writer.runner
        for row, target_ids in zip(rows, new_target_ids):
            state = self.writer.states[row]
            written = self.written.get(row, [])
            cached = runner.cache.length(row)   # holds a prefix of state.draft_ids + written
            before = list(state.draft_ids)
            lowest = len(before)                # the shortest prefix of `before` no edit touched
            num_text = next((i for i, t in enumerate(target_ids) if self.window.is_special(t)), len(target_ids))
            text = state.pending + b"".join(self.window.token_bytes(t) for t in target_ids[:num_text])
            # The draft's own whole tokens inside the accepted text stay as it wrote them (and in its cache).
            adopted, spelled = 0, 0
            for draft_id in written:
                piece = self._draft_bytes[draft_id]
                if draft_id in self._draft_no_text or text[spelled:spelled + len(piece)] != piece:
                    break
                adopted, spelled = adopted + 1, spelled + len(piece)
            state.draft_ids.extend(written[:adopted])
            state.pending = b""
            edit = self.resync.extend_bytes(state, text[spelled:])
            lowest = min(lowest, len(state.draft_ids) - len(edit.appended))
            edit = self.resync.extend(state, target_ids[num_text:])   # a special (eos) and what follows it
            lowest = min(lowest, len(state.draft_ids) - len(edit.appended))
            cache_ids = before + written
            keep = lowest
            while keep < min(cached, len(state.draft_ids)) and state.draft_ids[keep] == cache_ids[keep]:
                keep += 1
            runner.cache.truncate(row, min(keep, cached))
            self.target_tails[row] = self.window.tail(self.target_tails[row] + target_ids)
            self.written[row] = []


def build_slem_proposer(runner: ModelRunner, bridge: VocabBridge, target_tokenizer: Tokenizer,
                        draft_tokenizer: Tokenizer, num_speculative_tokens: int, resync_window: int,
                        head_rows: torch.Tensor | None = None) -> SlemProposer:
    """The draft writes freely in its vocabulary, or in the head_rows ([N] sorted draft ids, a frequency-ranked
    head: vocab/frequency.py) it keeps; its text reaches the target through SlemWindow."""
    resync = DraftResync(bridge, target_tokenizer, draft_tokenizer, window=resync_window)
    head_to_draft = None
    if head_rows is not None and len(head_rows) < runner.head_rows:
        runner.prune_head(head_rows)   # head row j writes draft id head_rows[j]: the table maps it back
        head_to_draft = head_rows.to(runner.device)
    vocab = DraftVocab("slem", head_to_draft, head_to_draft, runner.vocab_rows, ResyncContextSync(resync, []))
    writer = DraftModelProposer(runner, vocab, num_speculative_tokens)
    draft_specials = draft_tokenizer.token_table.ids_of_kinds(TokenKind.SPECIAL)
    if bridge.is_identity:
        special_to_target = {d: d for d in draft_specials}
    else:
        draft_to_target = bridge.draft_to_target.tolist()
        special_to_target = {d: draft_to_target[d] for d in draft_specials
                             if d < len(draft_to_target) and draft_to_target[d] >= 0}
    return SlemProposer(writer, resync, SlemWindow(target_tokenizer), draft_tokenizer, special_to_target,
                        bridge.target_vocab_rows)
