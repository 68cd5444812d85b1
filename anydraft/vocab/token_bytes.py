"""Token id -> byte string, decided from a parsed tokenizer.json (model / decoder / pre_tokenizer types).

Two schemes are handled: byte-level BPE (GPT-2 byte<->unicode table) and SentencePiece/Metaspace
(`▁` = space, `<0xNN>` byte-fallback pieces = one byte). Anything else raises UnsupportedTokenizer.
"""
from __future__ import annotations

import enum
import itertools
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

SPIECE_UNDERLINE = "\u2581"
_BYTE_FALLBACK_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 table: printable latin-1 bytes map to themselves, the other 68 to U+0100.. in order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}
# str.translate maps each table char to the latin-1 char of its byte; .encode("latin-1") then gives bytes.
_BYTE_LEVEL_TRANSLATE = {ord(c): b for c, b in UNICODE_TO_BYTE.items()}
_BYTE_LEVEL_CHARS_RE = re.compile("[" + "".join(re.escape(c) for c in UNICODE_TO_BYTE) + "]*")


class UnsupportedTokenizer(ValueError):
    """tokenizer.json describes a model kind whose token bytes we cannot derive."""


class ByteScheme(str, enum.Enum):
    BYTE_LEVEL = "byte_level"   # GPT-2 family: every char of a piece is one byte via the table
    METASPACE = "metaspace"     # SentencePiece family: `▁` is a space, `<0xNN>` is one byte


class TokenKind(enum.IntEnum):
    MISSING = 0        # an id below vocab_size that no token uses (a gap)
    REGULAR = 1        # a model-vocab piece with known bytes
    BYTE_FALLBACK = 2  # a `<0xNN>` piece of a byte_fallback SentencePiece model
    SPECIAL = 3        # added token flagged special (bos/eos/chat markers): kept apart
    ADDED = 4          # added token not flagged special (e.g. qwen3 `<think>`): its bytes are its content
    UNMAPPABLE = 5     # a model-vocab piece whose chars are outside the byte table


# Kinds that take part in byte matching (plain ints: enum comparisons are slow over 150k ids).
_MATCHABLE_KINDS = frozenset((int(TokenKind.REGULAR), int(TokenKind.BYTE_FALLBACK)))


def _walk_types(component: Any) -> list[dict]:
    """Flatten a normalizer / pre_tokenizer / decoder (possibly a Sequence) into its parts."""
    if not isinstance(component, dict):
        return []
    parts = [component]
    for key in ("normalizers", "pretokenizers", "decoders"):
        for child in component.get(key) or []:
            parts.extend(_walk_types(child))
    return parts


def detect_byte_scheme(tokenizer_json: dict) -> ByteScheme:
    """Decide how pieces map to bytes from the declared component types; fail on anything else."""
    model = tokenizer_json.get("model")
    if not isinstance(model, dict) or "type" not in model:
        raise UnsupportedTokenizer("no model.type in tokenizer.json")
    model_type = model["type"]
    parts = (_walk_types(tokenizer_json.get("decoder")) + _walk_types(tokenizer_json.get("pre_tokenizer"))
             + _walk_types(tokenizer_json.get("normalizer")))
    types = {p.get("type") for p in parts}
    # Older SentencePiece exports spell Metaspace as Replace(" " <-> "▁") normalizer/decoder steps.
    replaces_underline = any(p.get("type") == "Replace" and SPIECE_UNDERLINE in
                             (p.get("content", ""), (p.get("pattern") or {}).get("String")) for p in parts)
    metaspace = "Metaspace" in types or replaces_underline
    if model_type not in ("BPE", "Unigram"):
        raise UnsupportedTokenizer(f"model type {model_type!r} is not supported (only byte-level BPE and "
                                   "SentencePiece BPE/Unigram with byte fallback)")
    if "ByteLevel" in types and model_type == "BPE":
        return ByteScheme.BYTE_LEVEL
    if metaspace and (model_type == "BPE" or model.get("byte_fallback")):
        return ByteScheme.METASPACE
    if model_type == "Unigram":
        raise UnsupportedTokenizer("Unigram model without byte_fallback cannot represent arbitrary bytes")
    raise UnsupportedTokenizer(f"BPE model with neither a ByteLevel nor a Metaspace component "
                               f"(found {sorted(t for t in types if t)})")


def piece_bytes(piece: str, scheme: ByteScheme, byte_fallback: bool) -> tuple[bytes | None, TokenKind]:
    """Bytes of one model-vocab piece, with its kind (REGULAR / BYTE_FALLBACK / UNMAPPABLE)."""
    if scheme is ByteScheme.BYTE_LEVEL:
        if _BYTE_LEVEL_CHARS_RE.fullmatch(piece) is None:
            return None, TokenKind.UNMAPPABLE
        return piece.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1"), TokenKind.REGULAR
    if byte_fallback:
        match = _BYTE_FALLBACK_RE.fullmatch(piece)
        if match is not None:
            return bytes([int(match.group(1), 16)]), TokenKind.BYTE_FALLBACK
    return piece.replace(SPIECE_UNDERLINE, " ").encode("utf-8"), TokenKind.REGULAR


def incomplete_utf8_tail(data: bytes) -> int:
    """Length of a trailing UTF-8 sequence that more bytes could still complete (0 if none)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: keep looking for the lead
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


def is_complete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True)
class TokenBytesTable:
    """Bytes and kind of every token id of one tokenizer, plus the canonical id of each byte string."""
    scheme: ByteScheme
    token_bytes: list[bytes | None]   # [vocab_size]; special/added tokens hold their content bytes
    token_kinds: bytearray            # [vocab_size] TokenKind values (a bytearray: fast to scan)
    canonical_ids: dict[bytes, int]   # regular byte string -> the id the tokenizer produces for it

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def is_canonical(self, token_id: int) -> bool:
        token_bytes = self.token_bytes[token_id]
        return (self.token_kinds[token_id] in _MATCHABLE_KINDS
                and self.canonical_ids.get(token_bytes) == token_id)

    @cached_property
    def _ids_by_kind(self) -> dict[int, list[int]]:
        ids_by_kind: dict[int, list[int]] = {int(kind): [] for kind in TokenKind}
        for token_id, kind in enumerate(self.token_kinds):
            ids_by_kind[kind].append(token_id)
        return ids_by_kind

    def ids_of_kinds(self, *kinds: TokenKind) -> list[int]:
        """Sorted ids whose kind is one of `kinds`."""
        if len(kinds) == 1:
            return list(self._ids_by_kind[int(kinds[0])])
        return sorted(token_id for kind in kinds for token_id in self._ids_by_kind[int(kind)])

    def single_byte_ids(self) -> list[int | None]:
        """[256] canonical id spelling each single byte (None where the vocabulary has none)."""
        return list(self._single_byte_ids)

    @cached_property
    def _single_byte_ids(self) -> tuple[int | None, ...]:
        return tuple(self.canonical_ids.get(bytes([b])) for b in range(256))


def build_token_bytes(tokenizer_json: dict, encode_fragment: Callable[[str], list[int]] | None = None
                      ) -> TokenBytesTable:
    """Every id -> bytes. `encode_fragment` (text -> ids, no specials, no prefix space) breaks ties
    between pieces with equal bytes that are not settled by the byte-fallback rule."""
    scheme = detect_byte_scheme(tokenizer_json)
    model = tokenizer_json["model"]
    byte_fallback = bool(model.get("byte_fallback"))
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        vocab = {entry[0]: token_id for token_id, entry in enumerate(vocab)}
    added = {int(a["id"]): a for a in tokenizer_json.get("added_tokens") or []}
    vocab_size = max(list(vocab.values()) + list(added) + [-1]) + 1
    token_bytes: list[bytes | None] = [None] * vocab_size
    token_kinds = bytearray(vocab_size)  # TokenKind.MISSING == 0
    pieces = list(vocab)
    for token_id, data, kind in zip(vocab.values(), *_pieces_bytes(pieces, scheme, byte_fallback)):
        token_bytes[token_id], token_kinds[token_id] = data, kind
    for token_id, added_token in added.items():
        # Added tokens are matched on raw text before the model, so their bytes are their content.
        token_bytes[token_id] = added_token["content"].encode("utf-8")
        token_kinds[token_id] = TokenKind.SPECIAL if added_token.get("special") else TokenKind.ADDED
    canonical_ids = _canonical_ids(token_bytes, token_kinds, encode_fragment)
    return TokenBytesTable(scheme, token_bytes, token_kinds, canonical_ids)


def _pieces_bytes(pieces: list[str], scheme: ByteScheme, byte_fallback: bool
                  ) -> tuple[list[bytes | None], list[TokenKind]]:
    """piece_bytes over a whole vocabulary; byte-level vocabularies go through one translate call."""
    if scheme is ByteScheme.BYTE_LEVEL:
        joined = "".join(pieces)
        if _BYTE_LEVEL_CHARS_RE.fullmatch(joined) is not None:
            # One char is one byte, so each piece's bytes sit at its char offsets in the joined result.
            data = joined.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")
            ends = list(itertools.accumulate(map(len, pieces)))
            starts = [0] + ends[:-1]
            return [data[s:e] for s, e in zip(starts, ends)], [TokenKind.REGULAR] * len(pieces)
    pairs = [piece_bytes(piece, scheme, byte_fallback) for piece in pieces]
    return [data for data, _ in pairs], [kind for _, kind in pairs]


def _canonical_ids(token_bytes: list[bytes | None], token_kinds: bytearray,
                   encode_fragment: Callable[[str], list[int]] | None) -> dict[bytes, int]:
    regular_ids = [i for i, kind in enumerate(token_kinds) if kind in _MATCHABLE_KINDS]
    canonical = {token_bytes[i]: i for i in reversed(regular_ids)}  # lowest id wins by default
    if len(canonical) == len(regular_ids):
        return canonical  # no two pieces share bytes (always so for byte-level BPE)
    collisions: dict[bytes, list[int]] = {}
    for token_id in regular_ids:
        collisions.setdefault(token_bytes[token_id], []).append(token_id)
    for data, candidates in collisions.items():
        if len(candidates) > 1:
            canonical[data] = _pick_canonical(data, candidates, token_kinds, encode_fragment)
    return canonical


def _pick_canonical(data: bytes, candidates: list[int], token_kinds: bytearray,
                    encode_fragment: Callable[[str], list[int]] | None) -> int:
    # A byte_fallback BPE only emits <0xNN> when no regular piece covers the char, so a regular
    # piece always wins; otherwise ask the tokenizer which id it produces for these bytes.
    regular = [i for i in candidates if token_kinds[i] == TokenKind.REGULAR]
    if len(regular) == 1:
        return regular[0]
    if encode_fragment is not None and is_complete_utf8(data):
        produced = encode_fragment(data.decode("utf-8"))
        if len(produced) == 1 and produced[0] in candidates:
            return produced[0]
    return min(regular or candidates)
