"""Frequency-ranked draft heads: keep only the N draft output rows whose target tokens a corpus uses most.

Why: a draft proposes one token per forward, and on CPU (and for small drafts on any device) its output
head is the costliest part of that forward: memory-bound, one row read per vocabulary entry. Text uses
few of them: GSM8K's training split, tokenized by qwen3, touches ~13k distinct tokens. A head cut to the
most frequent N target tokens (as FR-Spec and EAGLE-3's 32k draft vocabularies do) proposes the same
tokens on such text at a fraction of the cost. The target still verifies every token, so the output is
unchanged whatever the cut; only acceptance can drop, when the draft's favourite token was cut.

Counts are over the *target* tokenization of the corpus for TLI and identity heads: a proposal is accepted only
when it is the target's token, so that is the distribution the head must cover. A SLEM draft writes text in its
own tokens, which the target re-tokenizes, so its head is ranked by the *draft's* tokenization of the corpus
(the same functions, given the draft's tokenizer). Special tokens (EOS, ...) are always kept.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from anydraft.tokenizer import Tokenizer

COUNTS_FORMAT = "1"  # bump when counting rules change: cached counts stop matching


def read_corpus(path: str | Path) -> list[str]:
    """Documents of a corpus file: .jsonl -> per line, its string fields joined by newlines (GSM8K's question
    and answer); any other file -> text split at blank lines."""
    return _parse_corpus(Path(path), _read_bytes(Path(path)))


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"draft vocab corpus {path}: no such file; give a .jsonl or text file")
    return path.read_bytes()


def _parse_corpus(path: Path, raw: bytes) -> list[str]:
    text = raw.decode("utf-8")
    if path.suffix == ".jsonl":
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg}); a .jsonl corpus needs one object per line") from e
            values = [record] if isinstance(record, str) else (
                [v for v in record.values() if isinstance(v, str)] if isinstance(record, dict) else [])
            documents.append("\n".join(values))
    else:
        documents = [part.strip("\n") for part in text.split("\n\n")]
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise ValueError(f"draft vocab corpus {path} holds no text")
    return documents


def count_target_tokens(tokenizer: Tokenizer, documents: list[str], vocab_rows: int) -> torch.Tensor:
    """[vocab_rows] int64: how often each target id occurs in the documents (no special tokens added)."""
    encoded = tokenizer.encode_batch(documents, add_special_tokens=False)
    target_ids = torch.tensor([t for token_ids in encoded for t in token_ids], dtype=torch.long)
    return torch.bincount(target_ids[target_ids < vocab_rows], minlength=vocab_rows)   # one pass, not one per document


def _counts_cache_file(cache_dir: Path, tokenizer: Tokenizer, corpus_bytes: bytes, vocab_rows: int) -> Path:
    key = hashlib.sha256(f"anydraft-counts-v{COUNTS_FORMAT}:{tokenizer.content_hash}:{vocab_rows}:".encode()
                         + hashlib.sha256(corpus_bytes).digest()).hexdigest()
    return cache_dir / f"counts-{key[:40]}.pt"


def load_or_count(tokenizer: Tokenizer, corpus: str | Path, vocab_rows: int, cache_dir: Path | None) -> torch.Tensor:
    """count_target_tokens of a corpus file, cached by tokenizer and corpus *contents* (a rewritten file recounts)."""
    raw = _read_bytes(Path(corpus))
    if cache_dir is None:
        return count_target_tokens(tokenizer, _parse_corpus(Path(corpus), raw), vocab_rows)
    path = _counts_cache_file(cache_dir, tokenizer, raw, vocab_rows)
    try:
        counts = torch.load(path, weights_only=True)
        if isinstance(counts, torch.Tensor) and counts.shape == (vocab_rows,) and counts.dtype == torch.long:
            return counts
    except (OSError, RuntimeError, EOFError, ValueError):
        pass  # missing or unreadable entry: count again and overwrite it
    counts = count_target_tokens(tokenizer, _parse_corpus(Path(corpus), raw), vocab_rows)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{id(counts)}.tmp")
        torch.save(counts, tmp)
        tmp.replace(path)   # atomic: a reader sees a whole entry or none
    except OSError:
        pass  # an unwritable cache only costs the next load a recount
    return counts


@dataclass
class RankedHead:
    keep: torch.Tensor          # [N] sorted positions into the candidate list that stay in the head
    coverage: float             # share of the corpus's candidate-token occurrences the kept rows cover
    corpus_tokens: int          # occurrences of candidate tokens in the corpus


def specials_among(candidate_target_ids: torch.Tensor, tokenizer: Tokenizer) -> torch.Tensor:
    """[C] bool: which candidates are the tokenizer's special tokens (kept in any cut)."""
    return torch.isin(candidate_target_ids, torch.tensor(sorted(tokenizer.special_ids), dtype=torch.long))


def _rank_order(candidate_target_ids: torch.Tensor, candidate_counts: torch.Tensor,
                always_keep: torch.Tensor) -> torch.Tensor:
    """[C] candidate positions, most used first: specials, then by count, ties by lower target id."""
    score = torch.where(always_keep, torch.iinfo(torch.long).max, candidate_counts)
    order = torch.sort(candidate_target_ids).indices
    return order[torch.sort(-score[order], stable=True).indices]


def most_frequent(candidate_target_ids: torch.Tensor,  # [C] target id of each candidate head row
                  counts: torch.Tensor,                # [V_target_rows] corpus occurrences per target id
                  always_keep: torch.Tensor,           # [C] bool: special tokens, kept whatever their count
                  limit: int) -> RankedHead:
    """The `limit` candidates used most by the corpus (ties: lower target id first), specials first."""
    if limit < 1:
        raise ValueError(f"draft_vocab_size must be >= 1, got {limit}")
    candidate_counts = counts[candidate_target_ids]
    keep = _rank_order(candidate_target_ids, candidate_counts, always_keep)[:limit].sort().values
    total = int(candidate_counts.sum())
    covered = int(candidate_counts[keep].sum())
    return RankedHead(keep=keep, coverage=covered / total if total else 0.0, corpus_tokens=total)


def most_frequent_own_tokens(tokenizer: Tokenizer,
                             counts: torch.Tensor,   # [V_rows] occurrences per id in the tokenizer's own tokenization
                             num_token_rows: int,    # ids 0..num_token_rows-1 are real tokens (the rest: padding)
                             limit: int) -> RankedHead:
    """A SLEM draft's head: of its own tokens, the `limit` its tokenization of the corpus uses most, its specials
    (EOS, ...) always kept. keep: the kept draft ids."""
    draft_ids = torch.arange(num_token_rows)
    specials = specials_among(draft_ids, tokenizer)
    num_specials = int(specials.sum())
    if not num_specials < limit <= num_token_rows:
        raise ValueError(f"draft_vocab_size {limit} is out of range for this draft: give more than its {num_specials} "
                         f"special tokens (always kept) and at most its {num_token_rows} tokens, or leave "
                         f"draft_vocab_size unset to keep the whole head")
    return most_frequent(draft_ids, counts, specials, limit)


def coverage_report(candidate_target_ids: torch.Tensor,  # [C] target ids a draft head may propose
                    counts: torch.Tensor,                # [V_target_rows] corpus occurrences per target id
                    always_keep: torch.Tensor,           # [C] bool
                    sizes: list[int]) -> dict:
    """How much of a corpus a draft head can propose: all candidates, top-N cuts, and the N that reach 99% /
    99.9% of the candidates' occurrences (for choosing draft_vocab_size)."""
    total = int(counts.sum())
    candidate_counts = counts[candidate_target_ids]
    proposable = int(candidate_counts.sum())
    # Occurrences accumulated in most_frequent's rank order: cumulative[n - 1] is what its top-n cut covers.
    cumulative = candidate_counts[_rank_order(candidate_target_ids, candidate_counts, always_keep)].cumsum(0)
    size_for = {}
    for share in (0.99, 0.999):
        reached = torch.nonzero(cumulative >= share * proposable).flatten()
        size_for[f"{share:g}"] = int(reached[0]) + 1 if proposable and len(reached) else None
    cuts = [{"size": n, "coverage_pct": round(100 * (int(cumulative[n - 1]) / proposable if proposable else 0.0), 3)}
            for n in sizes if n < len(candidate_target_ids)]
    return {"corpus_tokens": total, "proposable_pct": round(100 * proposable / total, 3) if total else 0.0,
            "distinct_used": int((candidate_counts > 0).sum()), "cuts": cuts, "size_for_coverage": size_for}
