"""The target<->draft id mapping over the byte-string intersection of two vocabularies (TLI)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from anydraft.vocab.token_bytes import TokenBytesTable, TokenKind, is_complete_utf8

if TYPE_CHECKING:  # tokenizer.py imports this package, so import it for type hints only
    from anydraft.tokenizer import Tokenizer

_REGULAR_KINDS = (TokenKind.REGULAR, TokenKind.BYTE_FALLBACK)
_SPECIAL_KINDS = (TokenKind.SPECIAL, TokenKind.ADDED)
UNMATCHED_KINDS = ("special", "duplicate", "partial_utf8", "unmappable", "missing", "beyond_rows", "other")


@dataclass
class BridgeStats:
    """What the bridge covers; `intersection` counts regular (byte-matched) tokens only."""
    target_vocab: int                  # tokenizer size (max id + 1), not vocab rows
    draft_vocab: int
    target_vocab_rows: int
    draft_vocab_rows: int
    intersection: int                  # regular tokens with equal bytes on both sides (canonical ids)
    special_matched: int               # special/added tokens matched by identical content or role
    pct_target: float                  # intersection / target_vocab * 100
    pct_draft: float                   # intersection / draft_vocab * 100
    unmatched_target: dict[str, int] = field(default_factory=dict)  # by UNMATCHED_KINDS
    unmatched_draft: dict[str, int] = field(default_factory=dict)
    build_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BridgeStats":
        return cls(**data)


def _unmatched(table: TokenBytesTable, matched_ids: set[int], vocab_rows: int) -> dict[str, int]:
    """Count the tokens of one side left out of the mapping, by why they were left out."""
    counts = dict.fromkeys(UNMATCHED_KINDS, 0)
    for kind, name in ((TokenKind.SPECIAL, "special"), (TokenKind.ADDED, "special"),
                       (TokenKind.UNMAPPABLE, "unmappable"), (TokenKind.MISSING, "missing"),
                       (TokenKind.REGULAR, None), (TokenKind.BYTE_FALLBACK, None)):
        for token_id in table.ids_of_kinds(kind):
            if token_id in matched_ids:
                continue
            if token_id >= vocab_rows and kind != TokenKind.MISSING:
                counts["beyond_rows"] += 1
            elif name is not None:
                counts[name] += 1
            else:
                data = table.token_bytes[token_id]
                if table.canonical_ids[data] != token_id:
                    counts["duplicate"] += 1
                elif not data.isascii() and not is_complete_utf8(data):
                    counts["partial_utf8"] += 1
                else:
                    counts["other"] += 1
    return counts


def _special_pairs(target: Tokenizer, draft: Tokenizer, target_rows: int, draft_rows: int) -> list[tuple[int, int]]:
    """Special/added tokens: identical content first, then the bos/eos/pad/unk roles; injective."""
    target_table, draft_table = target.token_table, draft.token_table

    def specials(table: TokenBytesTable, rows: int) -> dict[bytes, int]:
        return {table.token_bytes[i]: i for i in table.ids_of_kinds(*_SPECIAL_KINDS) if i < rows}

    target_specials = specials(target_table, target_rows)
    pairs: dict[int, int] = {}  # target id -> draft id
    for content, draft_id in specials(draft_table, draft_rows).items():
        target_id = target_specials.get(content)
        if target_id is not None and target_table.token_kinds[target_id] == draft_table.token_kinds[draft_id]:
            pairs[target_id] = draft_id
    target_roles = [(target.eos_token_ids[:1] or [None])[0], target.bos_token_id, target.pad_token_id,
                    target.unk_token_id]
    draft_roles = [(draft.eos_token_ids[:1] or [None])[0], draft.bos_token_id, draft.pad_token_id, draft.unk_token_id]
    for target_id, draft_id in zip(target_roles, draft_roles):
        if (target_id is None or draft_id is None or target_id >= target_rows or draft_id >= draft_rows
                or target_id not in target.special_ids or draft_id not in draft.special_ids):
            continue
        if target_id not in pairs and draft_id not in pairs.values():
            pairs[target_id] = draft_id
    return sorted(pairs.items())


def _within_rows(table: TokenBytesTable, vocab_rows: int) -> dict[bytes, int]:
    """Canonical ids that have an embedding row (a model may have fewer rows than token ids)."""
    if table.vocab_size <= vocab_rows:
        return table.canonical_ids
    return {data: token_id for data, token_id in table.canonical_ids.items() if token_id < vocab_rows}


def _is_identity(target: Tokenizer, draft: Tokenizer, target_rows: int, draft_rows: int) -> bool:
    if target_rows != draft_rows:
        return False  # different row counts would still need a resize in the hot path
    if target.content_hash == draft.content_hash:
        return True
    target_table, draft_table = target.token_table, draft.token_table
    return (target_table.token_bytes == draft_table.token_bytes and target_table.token_kinds == draft_table.token_kinds
            and target.special_ids == draft.special_ids)


@dataclass
class VocabBridge:
    """Injective draft<->target id maps; None maps mean identical vocabularies (no gather/scatter)."""
    target_vocab_rows: int
    draft_vocab_rows: int
    is_identity: bool
    draft_to_target: torch.Tensor | None   # [V_draft_rows] int64, -1 = no target token
    target_to_draft: torch.Tensor | None   # [V_target_rows] int64, -1 = no draft token
    draft_in_intersection: torch.Tensor    # [V_draft_rows] bool: draft rows that may be proposed
    stats: BridgeStats
    from_cache: bool = False

    @classmethod
    def build(cls, target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer,
              target_vocab_rows: int | None = None, draft_vocab_rows: int | None = None) -> "VocabBridge":
        start = time.perf_counter()
        target_rows = target_tokenizer.vocab_size if target_vocab_rows is None else int(target_vocab_rows)
        draft_rows = draft_tokenizer.vocab_size if draft_vocab_rows is None else int(draft_vocab_rows)
        if target_rows <= 0 or draft_rows <= 0:
            raise ValueError(f"vocab rows must be positive (target {target_rows}, draft {draft_rows})")
        target_table, draft_table = target_tokenizer.token_table, draft_tokenizer.token_table

        if _is_identity(target_tokenizer, draft_tokenizer, target_rows, draft_rows):
            draft_in_intersection = torch.zeros(draft_rows, dtype=torch.bool)  # [V_draft_rows]
            real_ids = [i for i in draft_table.ids_of_kinds(*_REGULAR_KINDS, *_SPECIAL_KINDS) if i < draft_rows]
            draft_in_intersection[real_ids] = True
            num_special = len([i for i in draft_table.ids_of_kinds(*_SPECIAL_KINDS) if i < draft_rows])
            empty = dict.fromkeys(UNMATCHED_KINDS, 0)
            stats = BridgeStats(target_table.vocab_size, draft_table.vocab_size, target_rows, draft_rows,
                                intersection=len(real_ids) - num_special, special_matched=num_special,
                                pct_target=100.0, pct_draft=100.0, unmatched_target=empty, unmatched_draft=dict(empty),
                                build_seconds=time.perf_counter() - start)
            return cls(target_rows, draft_rows, True, None, None, draft_in_intersection, stats)

        # Regular tokens: the canonical id of each byte string on both sides, so the map is injective.
        # Ids at or past the row count have no embedding row and are left out.
        target_canonical = _within_rows(target_table, target_rows)
        draft_canonical = _within_rows(draft_table, draft_rows)
        shared = target_canonical.keys() & draft_canonical.keys()
        target_ids = [target_canonical[b] for b in shared]
        draft_ids = [draft_canonical[b] for b in shared]
        special_pairs = _special_pairs(target_tokenizer, draft_tokenizer, target_rows, draft_rows)
        target_ids += [t for t, _ in special_pairs]
        draft_ids += [d for _, d in special_pairs]

        target_index = torch.tensor(target_ids, dtype=torch.long)  # [N_mapped]
        draft_index = torch.tensor(draft_ids, dtype=torch.long)    # [N_mapped]
        draft_to_target = torch.full((draft_rows,), -1, dtype=torch.long)   # [V_draft_rows]
        target_to_draft = torch.full((target_rows,), -1, dtype=torch.long)  # [V_target_rows]
        draft_to_target[draft_index] = target_index
        target_to_draft[target_index] = draft_index
        draft_in_intersection = draft_to_target >= 0  # [V_draft_rows]
        stats = BridgeStats(
            target_table.vocab_size, draft_table.vocab_size, target_rows, draft_rows,
            intersection=len(shared), special_matched=len(special_pairs),
            pct_target=100.0 * len(shared) / target_table.vocab_size,
            pct_draft=100.0 * len(shared) / draft_table.vocab_size,
            unmatched_target=_unmatched(target_table, set(target_ids), target_rows),
            unmatched_draft=_unmatched(draft_table, set(draft_ids), draft_rows))
        stats.build_seconds = time.perf_counter() - start
        return cls(target_rows, draft_rows, False, draft_to_target, target_to_draft, draft_in_intersection, stats)

    def pruned_draft_rows(self) -> torch.Tensor:
        """[N_intersection] sorted draft ids that may be proposed: the rows to keep in a pruned head."""
        return torch.nonzero(self.draft_in_intersection).flatten()
