"""Keep the draft's token sequence spelling the same text as the target's (TLI / SLEM re-sync).

Invariant after every `extend`, with specials contributing no bytes on either side:
    bytes(state.draft_ids) + state.pending == bytes(draft ids of the prompt) + bytes(target ids appended)

Target special tokens (eos, chat markers) carry no text: they map by role/content through the bridge
when the draft has a counterpart, else they are skipped. An unknown target token is never mapped to
UNK: its bytes are re-tokenized by the draft tokenizer instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anydraft.vocab.bridge import VocabBridge
from anydraft.vocab.token_bytes import SPIECE_UNDERLINE, ByteScheme, TokenKind, incomplete_utf8_tail

if TYPE_CHECKING:  # tokenizer.py imports this package, so import it for type hints only
    from anydraft.tokenizer import Tokenizer

_NO_TEXT_KINDS = (TokenKind.SPECIAL, TokenKind.MISSING)


@dataclass
class ResyncState:
    """The draft's view of one sequence; `pending` holds target bytes not yet given to the draft."""
    draft_ids: list[int]
    pending: bytes = b""
    prompt_len: int = 0             # len(draft_ids) right after the prompt
    dropped_bytes: int = 0          # bytes the draft vocabulary cannot spell at all (0 for byte-capable ones)


@dataclass(frozen=True)
class ResyncEdit:
    """Apply to the draft cache: rewind `num_dropped` tokens, then feed `appended`."""
    num_dropped: int
    appended: list[int] = field(default_factory=list)


class DraftResync:
    def __init__(self, bridge: VocabBridge, target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer,
                 window: int = 6) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._draft_tokenizer = draft_tokenizer
        draft_tokenizer.encode_fragment(" ")   # builds its fragment tokenizer (~0.2 s) now, not in the first step
        target_table, draft_table = target_tokenizer.token_table, draft_tokenizer.token_table
        self._target_bytes = target_table.token_bytes        # [V_target_tokens]
        self._target_kinds = target_table.token_kinds        # [V_target_tokens]
        self._draft_bytes = draft_table.token_bytes          # [V_draft_tokens]
        # Draft tokens that carry no text bound the re-tokenization window (never re-encoded).
        self._draft_no_text = frozenset(draft_table.ids_of_kinds(*_NO_TEXT_KINDS))
        self._draft_single_byte = draft_table.single_byte_ids()  # [256]
        self._draft_metaspace = draft_table.scheme is ByteScheme.METASPACE
        if bridge.is_identity:
            self._target_to_draft: list[int] | None = None
        else:
            self._target_to_draft = bridge.target_to_draft.tolist()  # [V_target_rows]; plain list for the hot path
        # The draft id `extend` appends for a target id as it is (a text token the draft spells alone), -1 where it
        # reads the token's bytes or role instead: `append_direct`'s table.
        text_kinds = [kind not in _NO_TEXT_KINDS for kind in self._target_kinds]
        mapped = range(len(text_kinds)) if self._target_to_draft is None else self._target_to_draft
        self._direct = [d if text else -1 for d, text in zip(mapped, text_kinds)]  # [V_target_tokens]

    # --- prompt -----------------------------------------------------------------------------
    def draft_ids_for_text(self, text: str) -> list[int]:
        """The draft tokenizer's own encoding, with its BOS and dummy-prefix rules."""
        return self._draft_tokenizer.encode(text, add_special_tokens=True)

    def new_state(self, prompt_text: str) -> ResyncState:
        """The draft's sequence for a prompt. A prompt with no text for the draft (only special tokens, which spell
        nothing) starts from the draft's BOS, else its end-of-text token: what a document follows; no bytes, so the
        invariant holds."""
        draft_ids = self.draft_ids_for_text(prompt_text)
        if not draft_ids:
            tokenizer = self._draft_tokenizer
            start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else next(
                iter(tokenizer.eos_token_ids), None)
            if start is None:
                raise ValueError("the draft tokenizer turns this prompt into no tokens and has no BOS or end-of-text "
                                 "token to start from; give a prompt with text")
            draft_ids = [start]
        return ResyncState(draft_ids=draft_ids, prompt_len=len(draft_ids))

    def draft_text_bytes(self, draft_ids: list[int]) -> bytes:
        """The text bytes a draft id sequence spells (specials contribute nothing)."""
        return b"".join(self._draft_bytes[d] for d in draft_ids if d not in self._draft_no_text)

    # --- steps ------------------------------------------------------------------------------
    def extend(self, state: ResyncState, target_ids: list[int]) -> ResyncEdit:
        """Append target tokens to the draft's view; returns the edit to apply to the draft cache."""
        start_len = len(state.draft_ids)
        keep = start_len  # shortest prefix of the original draft_ids left untouched
        for target_id in target_ids:
            if not 0 <= target_id < len(self._target_kinds):
                raise ValueError(f"target id {target_id} is outside the target vocabulary "
                                 f"({len(self._target_kinds)} tokens): padding rows must never be sampled")
            kind = self._target_kinds[target_id]
            if kind == TokenKind.MISSING:
                raise ValueError(f"target id {target_id} has no token in the target vocabulary")
            draft_id = target_id if self._target_to_draft is None else self._target_to_draft[target_id]
            if kind == TokenKind.SPECIAL:
                keep = min(keep, self._flush(state, force=True))  # text before a special is final
                if draft_id >= 0:
                    state.draft_ids.append(draft_id)
            elif draft_id >= 0 and not state.pending:
                state.draft_ids.append(draft_id)
            else:
                state.pending += self._target_bytes[target_id]
                keep = min(keep, self._flush(state, force=False))
        return ResyncEdit(num_dropped=start_len - keep, appended=state.draft_ids[keep:])

    def append_direct(self, states: list[ResyncState], target_id_lists: list[list[int]]) -> list[bool]:
        """`extend` for every row where it only appends (no pending bytes, each target id a text token with a draft
        id); returns which rows it extended, the others are left to `extend`. A few calls a step whatever the number
        of rows: the common decode step's re-sync without a call per row or per token."""
        flat = [t for ids in target_id_lists for t in ids]
        direct = self._direct
        if not flat or min(flat) < 0 or max(flat) >= len(direct):
            return [False] * len(states)   # `extend` says what is wrong with an id
        mapped = list(map(direct.__getitem__, flat))
        done = [False] * len(states)
        end = 0
        for i, (state, num_ids) in enumerate(zip(states, map(len, target_id_lists))):
            start, end = end, end + num_ids
            draft_ids = mapped[start:end]
            if -1 not in draft_ids and not state.pending:
                state.draft_ids += draft_ids
                done[i] = True
        return done

    def extend_bytes(self, state: ResyncState, data: bytes) -> ResyncEdit:
        """Append text the target accepted as bytes (SLEM: past the draft's own whole tokens); no specials."""
        start_len = len(state.draft_ids)
        state.pending += data
        keep = self._flush(state, force=False)
        return ResyncEdit(num_dropped=start_len - keep, appended=state.draft_ids[keep:])

    def flush(self, state: ResyncState) -> ResyncEdit:
        """Give the draft any pending bytes now, even an incomplete UTF-8 tail (e.g. at the end)."""
        start_len = len(state.draft_ids)
        keep = self._flush(state, force=True)
        return ResyncEdit(num_dropped=start_len - keep, appended=state.draft_ids[keep:])

    def _flush(self, state: ResyncState, force: bool) -> int:
        """Re-tokenize the last `window` draft tokens + pending; returns the first changed index."""
        draft_ids = state.draft_ids
        if not state.pending:
            return len(draft_ids)
        start = self._window_start(draft_ids)
        text_bytes = b"".join(self._draft_bytes[d] for d in draft_ids[start:]) + state.pending
        if not force and incomplete_utf8_tail(text_bytes):
            return len(draft_ids)  # a multi-byte char is split: wait for the rest of it
        new_ids, dropped = self._encode_bytes(text_bytes)
        state.dropped_bytes += dropped
        same = 0
        for old_id, new_id in zip(draft_ids[start:], new_ids):
            if old_id != new_id:
                break
            same += 1
        del draft_ids[start + same:]
        draft_ids.extend(new_ids[same:])
        state.pending = b""
        return start + same

    def _window_start(self, draft_ids: list[int]) -> int:
        start = max(0, len(draft_ids) - self.window)
        for index in range(len(draft_ids) - 1, start - 1, -1):
            if draft_ids[index] in self._draft_no_text:
                return index + 1  # never re-encode across a special token
        # Widen back over tokens that start mid-character so the window text decodes as UTF-8.
        for _ in range(3):
            if start == 0 or draft_ids[start - 1] in self._draft_no_text:
                break
            first = self._draft_bytes[draft_ids[start]] if start < len(draft_ids) else b""
            if not first or first[0] & 0xC0 != 0x80:
                break
            start -= 1
        return start

    def _encode_bytes(self, text_bytes: bytes) -> tuple[list[int], int]:
        """Draft ids spelling exactly `text_bytes`: valid UTF-8 runs go through the draft tokenizer,
        invalid bytes become single-byte tokens. Returns (draft ids, bytes it could not spell)."""
        draft_ids: list[int] = []
        dropped = 0
        rest = text_bytes
        while rest:
            try:
                valid, bad, rest = rest.decode("utf-8"), b"", b""
            except UnicodeDecodeError as e:
                valid, bad, rest = rest[: e.start].decode("utf-8"), rest[e.start: e.end], rest[e.end:]
            draft_ids += self._encode_text(valid)
            for byte in bad:
                dropped += self._append_byte(draft_ids, byte)
        return draft_ids, dropped

    def _encode_text(self, text: str) -> list[int]:
        if not text:
            return []
        if self._draft_metaspace and SPIECE_UNDERLINE in text:
            # A literal ▁ would be read back as a space: spell it with byte tokens instead.
            draft_ids: list[int] = []
            for index, part in enumerate(text.split(SPIECE_UNDERLINE)):
                if index:
                    for byte in SPIECE_UNDERLINE.encode("utf-8"):
                        self._append_byte(draft_ids, byte)
                draft_ids += self._encode_plain(part)
            return draft_ids
        return self._encode_plain(text)

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        draft_ids = self._draft_tokenizer.encode_fragment(text)
        if self.draft_text_bytes(draft_ids) == text.encode("utf-8") and not any(
                d in self._draft_no_text for d in draft_ids):
            return draft_ids
        # The tokenizer changed the text (an UNK, an added token eating spaces): spell it byte by byte.
        byte_ids: list[int] = []
        for byte in text.encode("utf-8"):
            self._append_byte(byte_ids, byte)
        return byte_ids

    def _append_byte(self, draft_ids: list[int], byte: int) -> int:
        """Append the draft's single-byte token; returns 1 if the vocabulary has none (byte lost)."""
        draft_id = self._draft_single_byte[byte]
        if draft_id is None:
            return 1
        draft_ids.append(draft_id)
        return 0
