"""SLEM's text -> target tokens: the target tokenizer's tokens for a draft's text that follows the verified text.

The draft writes text; the target must verify it as target tokens. Two edges of that text need care:
- Left edge (look-back): how a text starts tokenizing depends on what precedes it (a pre-tokenizer regex
  reading the previous char, a SentencePiece word mark, a run of spaces). So the verified text's last
  `window_tokens` target tokens are tokenized together with the new text, and only the tokens after a token
  boundary that falls exactly at the end of the verified text are proposed. When no token boundary falls
  there (the new text would merge with the last verified token), the new text is tokenized alone: the
  target has already committed to its tokens, so it continues from that edge.
- Right edge (stability): the new text ends wherever the draft stopped, often mid-word, mid-number or
  mid-character, where a longer text would tokenize differently. Only tokens that end at or before the
  last *stable* boundary are proposed: a boundary no continuation can move. For a pre-tokenizer (byte-level
  BPE: gpt2, qwen3, smollm2) that is the start of the last pre-token, since pre-tokens are tokenized
  independently and only the last one can still grow or re-split, or of the run of whitespace pre-tokens the text
  ends with (a run re-splits as a whole). For SentencePiece BPE without a
  pre-tokenizer (llama2, mistral) it is the last `▁` that follows a non-`▁` char, as no piece of the
  vocabulary spans such a point (checked at load). An incomplete UTF-8 tail is cut before tokenizing.
  A text that ends at a draft special token (end of text) is final as a whole.
Losslessness does not rest on any of this: the target verifies every proposed token. These rules decide how
many proposals the target can accept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from anydraft.vocab.token_bytes import SPIECE_UNDERLINE, TokenKind, incomplete_utf8_tail

if TYPE_CHECKING:  # tokenizer.py imports this package, so import it for type hints only
    from anydraft.tokenizer import Tokenizer


class SlemWindow:
    def __init__(self, target_tokenizer: Tokenizer, window_tokens: int = 8) -> None:
        if window_tokens < 1:
            raise ValueError(f"window_tokens must be >= 1, got {window_tokens}")
        self.window_tokens = window_tokens
        table = target_tokenizer.token_table
        self._bytes = table.token_bytes                                      # [V_target_tokens]
        self._no_text = frozenset(table.ids_of_kinds(TokenKind.SPECIAL, TokenKind.MISSING))
        self._encode = target_tokenizer.encode_fragment
        self._single_byte = table.single_byte_ids()                          # [256]
        fragment = target_tokenizer._fragment_hf
        self._normalizer, self._pre_tokenizer = fragment.normalizer, fragment.pre_tokenizer
        pieces = target_tokenizer._json["model"].get("vocab") or {}
        pieces = pieces if isinstance(pieces, dict) else {p[0]: i for i, p in enumerate(pieces)}
        # SentencePiece without a pre-tokenizer: "▁ after a non-▁ char" is a stable boundary only if no piece spans
        # one; if some piece does, fall back to trusting nothing but the text's end minus its last token.
        self._word_marks = self._pre_tokenizer is None and not any(
            _spans_word_mark(piece) for piece in pieces)

    def token_bytes(self, target_id: int) -> bytes:
        return self._bytes[target_id]

    def is_special(self, target_id: int) -> bool:
        """A target token with no text (eos, chat markers)."""
        return target_id in self._no_text

    def tail(self, verified_target_ids: list[int]) -> list[int]:
        """The verified target ids the next `propose` needs (the last window_tokens; callers keep just these)."""
        return verified_target_ids[-self.window_tokens:]

    def propose(self, verified_target_ids: list[int], new_text: bytes, final: bool, max_tokens: int) -> list[int]:
        """Target ids spelling a prefix of `new_text`, the text that follows `verified_target_ids`' text; at most
        max_tokens of them. final: the text ends for good (a special follows), so its last token is stable."""
        if max_tokens <= 0 or not new_text:
            return []
        window = self._window_bytes(verified_target_ids)
        data = window + new_text
        cut = 0 if final else incomplete_utf8_tail(data)
        if cut >= len(new_text):
            return []
        joined = _decode_joined(data[:len(data) - cut], len(window))
        if joined is None:
            return []
        text, window_len, complete = joined
        final = final and complete and not cut
        proposals = self._after(text, window_len, final)
        if proposals is None:   # no token boundary at the verified text's end: the new text starts afresh
            proposals = self._afresh(text.encode("utf-8")[window_len:], final)
        return proposals[:max_tokens]

    # -- internals ---------------------------------------------------------------------------------------------
    def _window_bytes(self, verified_target_ids: list[int]) -> bytes:
        window = []
        for target_id in reversed(verified_target_ids[-self.window_tokens:]):
            if target_id in self._no_text:
                break   # text before a special token does not tokenize together with text after it
            window.append(self._bytes[target_id])
        return b"".join(reversed(window))

    def _afresh(self, data: bytes, final: bool) -> list[int]:
        """Tokens of the new text alone. If it completes a character the verified text began (a byte-level target
        wrote its first bytes), those bytes can only be single-byte tokens; the rest starts at a character."""
        lead = 0
        while lead < min(3, len(data)) and data[lead] & 0xC0 == 0x80:
            lead += 1
        head = [self._single_byte[b] for b in data[:lead]]
        if None in head:
            return []
        return head + (self._after(data[lead:].decode("utf-8"), 0, final) or [])

    def _after(self, text: str, window_len: int, final: bool) -> list[int] | None:
        """Tokens of `text` after byte offset window_len that end at or before its stable end; None when no token
        boundary falls at window_len."""
        target_ids = self._encode(text)
        data = text.encode("utf-8")
        stable = len(data) if final else self._stable_end(text)
        ends, end = [], 0
        for target_id in target_ids:
            piece = self._bytes[target_id]
            if target_id in self._no_text or data[end:end + len(piece)] != piece:
                break   # the tokenizer changed the text here (an UNK, a normalization): trust nothing after
            end += len(piece)
            ends.append(end)
        ends_at = [i for i, e in enumerate(ends) if e == window_len]
        first = 0 if window_len == 0 else (ends_at[0] + 1 if ends_at else None)
        if first is None:
            return None
        return [t for t, e in zip(target_ids[first:len(ends)], ends[first:]) if e <= stable]

    def _stable_end(self, text: str) -> int:
        """Byte offset in `text` up to which its tokenization can no longer change, whatever text follows."""
        normalized = self._normalizer.normalize_str(text) if self._normalizer is not None else text
        if len(normalized) != len(text):
            return 0   # offsets would not map back; trust nothing (only space -> ▁ is kept, which keeps lengths)
        if self._pre_tokenizer is not None:
            offsets = [span for _, span in self._pre_tokenizer.pre_tokenize_str(normalized)]
            # Whitespace pre-tokens at the end re-split as one run: '\n' then ' ' is '\n \n' once a newline follows
            # (qwen3's \s*[\r\n]+), so the run's start is the last boundary no continuation moves.
            last = len(offsets) - 1
            while last > 0 and normalized[offsets[last - 1][0]:offsets[last][1]].isspace():
                last -= 1
            start = offsets[last][0] if offsets else 0
        elif self._word_marks:
            start = next((i for i in range(len(normalized) - 1, 0, -1)
                          if normalized[i] == SPIECE_UNDERLINE and normalized[i - 1] != SPIECE_UNDERLINE), 0)
        else:
            ids = self._encode(text)
            return len(text.encode("utf-8")) - (len(self._bytes[ids[-1]]) if ids else 0)
        return len(text[:start].encode("utf-8"))


def _spans_word_mark(piece: str) -> bool:
    """A piece with ▁ right after another char than ▁ (e.g. 'a▁b'): it can span a word start."""
    return any(c == SPIECE_UNDERLINE and p != SPIECE_UNDERLINE for p, c in zip(piece, piece[1:]))


def _decode_joined(data: bytes, window_len: int) -> tuple[str, int, bool] | None:
    """data (window + new text) as text: window bytes are dropped from the left until it decodes (the window may
    start mid-character or hold invalid bytes the target wrote); the new text is cut before any invalid byte (a
    draft can write them). Returns (text, window bytes kept, whether the new text was kept whole), or None when
    nothing of the new text is left."""
    start, end = 0, len(data)
    while True:
        try:
            text = data[start:end].decode("utf-8")
        except UnicodeDecodeError as e:
            bad_start, bad_end = start + e.start, start + e.end
            if bad_end <= window_len:
                start = bad_end                 # invalid bytes inside the verified text: look back less far
            elif bad_start < window_len:
                start = window_len              # a verified partial character the new text does not complete
            else:
                end = bad_start                 # invalid bytes in the new text: stop before them
            continue
        if end <= window_len:
            return None
        return text, window_len - start, end == len(data)
