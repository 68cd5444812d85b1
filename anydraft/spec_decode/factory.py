"""Building a proposer from a SpeculativeConfig: load the draft, decide the vocab mode, wire the bridge."""
from __future__ import annotations

import logging
from typing import Protocol

import torch

from ..config import VOCAB_MODES, SpeculativeConfig, parse_dtype, resolve_device
from ..model.loader import resolve_model_path
from ..model.runner import ModelRunner
from ..model.speculators_config import is_speculators_checkpoint
from ..tokenizer import Tokenizer, same_vocabulary
from ..vocab.cache import default_cache_dir, load_or_build_bridge
from ..vocab.d2t import validate_d2t
from ..vocab.bridge import VocabBridge
from ..vocab.frequency import (RankedHead, coverage_report, load_or_count, most_frequent, most_frequent_own_tokens,
                               specials_among)
from ..vocab.mode_choice import SLEM_HEAD_COVERAGE, TliCoverage, choose_vocab_mode, slem_head_size, tli_coverage
from ..vocab.resync import DraftResync
from .draft_proposer import DraftModelProposer
from .proposer import Proposer
from .draft_vocab import DraftVocab, ResyncContextSync, SharedVocabSync
from .slem_proposer import build_slem_proposer

logger = logging.getLogger("anydraft")


class TargetSide(Protocol):
    """What the draft side needs of the target: where it runs and its vocabulary rows. A ModelRunner is one;
    inside another engine (integrations/vllm) a small record is."""
    device: torch.device
    dtype: torch.dtype
    vocab_rows: int          # embedding rows (config.json vocab_size)
    num_token_rows: int      # rows that are real tokens (the tokenizer's size); the rest is padding


def _draft_tokenizer(path, target_tokenizer: Tokenizer, vocab_mode: str) -> Tokenizer:
    if (path / "tokenizer.json").exists():
        return Tokenizer.from_dir(path)
    if vocab_mode in ("d2t", "identity", "auto"):
        return target_tokenizer  # EAGLE-style draft heads ship no tokenizer: they share the target's
    raise ValueError(f"{path}: no tokenizer.json, which vocab_mode {vocab_mode!r} needs")


def _rank_head_rows(spec: SpeculativeConfig, candidate_rows: torch.Tensor, candidate_target_ids: torch.Tensor,
                    target_tokenizer: Tokenizer, target_vocab_rows: int, info: dict) -> torch.Tensor:
    """The draft head rows to keep: all candidates, or the draft_vocab_size most frequent in the corpus."""
    if spec.draft_vocab_size is None:
        return candidate_rows
    counts = load_or_count(target_tokenizer, spec.draft_vocab_corpus, target_vocab_rows, default_cache_dir())
    ranked = most_frequent(candidate_target_ids, counts, specials_among(candidate_target_ids, target_tokenizer),
                           spec.draft_vocab_size)
    info["draft_vocab"] = _draft_vocab_info(ranked, spec.draft_vocab_size, spec.draft_vocab_corpus, len(candidate_rows))
    return candidate_rows[ranked.keep]


def _slem_head_rows(spec: SpeculativeConfig, runner: ModelRunner, draft_tokenizer: Tokenizer,
                    info: dict) -> torch.Tensor | None:
    """SLEM's head: the draft ids its own tokenization of the corpus uses most, draft_vocab_size of them, or when
    auto chose SLEM from a corpus, slem_head_size's (mode_choice.py); None = the whole head."""
    size, corpus, rule = spec.draft_vocab_size, spec.draft_vocab_corpus, None
    if size is None and spec.vocab_mode == "auto" and spec.vocab_mode_corpus:
        corpus = spec.vocab_mode_corpus
        counts = load_or_count(draft_tokenizer, corpus, runner.vocab_rows, default_cache_dir())
        draft_ids = torch.arange(runner.num_token_rows)
        report = coverage_report(draft_ids, counts, specials_among(draft_ids, draft_tokenizer), [])
        size = slem_head_size(report["size_for_coverage"][f"{SLEM_HEAD_COVERAGE:g}"], runner.num_token_rows)
        rule = (f"auto: the smallest power of two keeping {100 * SLEM_HEAD_COVERAGE:g}% of the draft's own "
                f"tokenization of {corpus}")
    if size is None:
        return None
    counts = load_or_count(draft_tokenizer, corpus, runner.vocab_rows, default_cache_dir())
    ranked = most_frequent_own_tokens(draft_tokenizer, counts, runner.num_token_rows, size)
    info["draft_vocab"] = _draft_vocab_info(ranked, size, corpus, runner.num_token_rows)
    if rule:
        info["draft_vocab"]["rule"] = rule
    return ranked.keep   # the candidates are the ids 0..num_token_rows-1: positions are draft ids


def _draft_vocab_info(ranked: RankedHead, asked: int, corpus: str, num_candidates: int) -> dict:
    return {"size": len(ranked.keep), "asked": asked, "of": num_candidates, "corpus": str(corpus),
            "corpus_tokens": ranked.corpus_tokens, "corpus_coverage_pct": round(100 * ranked.coverage, 3)}


def corpus_coverage(bridge: VocabBridge, target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer,
                    corpus: str) -> TliCoverage:
    """TLI coverage of a corpus file (token counts cached by the file's contents)."""
    cache_dir = default_cache_dir()
    return tli_coverage(bridge, load_or_count(target_tokenizer, corpus, bridge.target_vocab_rows, cache_dir),
                        load_or_count(draft_tokenizer, corpus, bridge.draft_vocab_rows, cache_dir), str(corpus))


def _resolve_mode(spec: SpeculativeConfig, bridge: VocabBridge, target_tokenizer: Tokenizer,
                  draft_tokenizer: Tokenizer, shared_vocabulary: bool, has_d2t: bool) -> tuple[str, str, dict]:
    """(mode, reason, coverage dict or {}) for the asked vocab_mode; auto asks choose_vocab_mode (one rule)."""
    if spec.vocab_mode != "auto":
        if spec.vocab_mode == "tli" and shared_vocabulary:   # TLI over identical vocabularies is the identity map
            return "identity", "vocab_mode 'tli' asked, but the vocabularies are the same: identity (no tables)", {}
        return spec.vocab_mode, f"vocab_mode {spec.vocab_mode!r} asked", {}
    coverage = None
    if not (has_d2t or shared_vocabulary) and spec.vocab_mode_corpus:
        coverage = corpus_coverage(bridge, target_tokenizer, draft_tokenizer, spec.vocab_mode_corpus)
    mode, reason = choose_vocab_mode(shared_vocabulary, has_d2t, coverage)
    logger.info("vocab_mode auto chose %s: %s", mode, reason)
    if mode not in VOCAB_MODES:
        raise ValueError(f"vocab_mode 'auto' chose {mode!r} for this pair ({reason}), but this build has no "
                         f"{mode!r} mode; pass vocab_mode 'tli' to use the intersection anyway")
    return mode, f"auto: {reason}", ({} if coverage is None else coverage.to_dict())


def _head_savings(runner: ModelRunner, flops_before: dict) -> dict:
    """The draft head's rows now, and the multiply-adds per token its pruning saved."""
    flops_after = runner.cost_flops_per_token()
    return {"draft_head_rows": runner.head_rows,
            "draft_head_macs_saved_per_token": flops_before["head"] - flops_after["head"],
            "draft_head_macs_saved_pct": round(100 * (1 - flops_after["head"] / flops_before["head"]), 2)}


# Text both tokenizers encode to measure draft tokens per target token (GSM8K-shaped: words, numbers, arithmetic).
SAMPLE_TEXT = ("The store sold 48 clips in April and half as many in May, so it sold 48 / 2 = 24 clips in "
               "May and 48 + 24 = 72 clips in all. Each box holds 12 pencils; 5 boxes hold 5 * 12 = 60 pencils, "
               "and after giving away 15 of them, 60 - 15 = 45 pencils are left. ")


def draft_tokens_per_target_token(target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer) -> float:
    """Draft tokens per target token over the same text (sizes the draft's KV pool beside the target's)."""
    return len(draft_tokenizer.encode(SAMPLE_TEXT)) / max(len(target_tokenizer.encode(SAMPLE_TEXT)), 1)


def build_proposer(spec: SpeculativeConfig, target: TargetSide, target_tokenizer: Tokenizer,
                   max_batch: int, max_model_len: int, draft_num_blocks: int | None = None) -> tuple[Proposer, dict]:
    """Returns (proposer, info) where info reports the vocab mode, intersection stats, head savings and the draft's
    tokens per target token. draft_num_blocks: the draft's KV pool (None: every row at full length)."""
    dtype = parse_dtype(spec.dtype) if spec.dtype else target.dtype
    device = resolve_device(spec.device) if spec.device else target.device
    path = resolve_model_path(spec.model)
    if is_speculators_checkpoint(path):   # EAGLE-3 / DSpark: the draft reads the target's hidden states
        from .hidden_state_factory import build_hidden_state_proposer
        return build_hidden_state_proposer(spec, path, target, target_tokenizer, max_batch, max_model_len)
    draft_tokenizer = _draft_tokenizer(path, target_tokenizer, spec.vocab_mode)
    # The draft's sequence can be longer than the target's (another tokenizer) and is right-padded in batches.
    runner = ModelRunner.load(path, dtype, device, max_batch, 2 * max_model_len + 64,
                              num_token_rows=draft_tokenizer.vocab_size, num_blocks=draft_num_blocks)
    ratio = {"draft_tokens_per_target_token": round(draft_tokens_per_target_token(target_tokenizer, draft_tokenizer), 3)}
    if runner.dtype != dtype or runner.device.type != device.type:
        raise ValueError(f"draft loaded on {runner.device}/{runner.dtype} but {device}/{dtype} was asked")
    has_d2t = "d2t" in runner.extras
    bridge = load_or_build_bridge(target_tokenizer, draft_tokenizer, target.vocab_rows, runner.vocab_rows)
    shared_vocabulary = bridge.is_identity or same_vocabulary(target_tokenizer, draft_tokenizer)
    mode, reason, coverage = _resolve_mode(spec, bridge, target_tokenizer, draft_tokenizer, shared_vocabulary, has_d2t)
    if mode == "slem":   # the draft writes freely in its vocabulary; the target re-tokenizes its text
        if has_d2t:
            raise ValueError(f"{path}: a d2t draft head writes target ids already; use vocab_mode 'd2t', not 'slem'")
        info = {"vocab_mode": "slem", "vocab_mode_reason": reason, "draft_path": str(path), **ratio,
                **({"tli_coverage": coverage} if coverage else {})}
        flops_before = runner.cost_flops_per_token()
        head_rows = _slem_head_rows(spec, runner, draft_tokenizer, info)
        proposer = build_slem_proposer(runner, bridge, target_tokenizer, draft_tokenizer,
                                       spec.num_speculative_tokens, spec.resync_window, head_rows)
        return proposer, {**info, **_head_savings(runner, flops_before)}
    flops_before = runner.cost_flops_per_token()
    info = {"vocab_mode": mode, "vocab_mode_reason": reason, "draft_path": str(path), **ratio}
    if coverage:
        info["tli_coverage"] = coverage
    if mode == "identity":
        if not shared_vocabulary:
            raise ValueError("vocab_mode 'identity' needs the same tokenizer for draft and target, but they differ "
                             f"(intersection {bridge.stats.intersection} tokens); use vocab_mode 'tli' or 'auto'")
        rows = torch.arange(min(runner.num_token_rows, target.num_token_rows))
        keep = _rank_head_rows(spec, rows, rows, target_tokenizer, target.vocab_rows, info)
        if len(keep) == len(rows):
            vocab = DraftVocab("identity", None, None, target.vocab_rows, SharedVocabSync())
        else:  # same ids on both sides; the head keeps the most frequent rows, which are then target ids too
            runner.prune_head(keep)
            vocab = DraftVocab("identity", keep.to(device), keep.to(device), target.vocab_rows, SharedVocabSync())
    elif mode == "d2t":
        if spec.draft_vocab_size is not None:
            raise ValueError(f"{path}: the draft head is already reduced by its d2t table; leave draft_vocab_size "
                             f"unset")
        if not has_d2t:
            raise ValueError(f"vocab_mode 'd2t' needs d2t/t2d tables in {path} (model.safetensors or d2t.safetensors)")
        if not shared_vocabulary:
            raise ValueError("vocab_mode 'd2t' needs the draft to share the target's tokenizer; they differ")
        d2t, t2d = runner.extras["d2t"].long(), runner.extras["t2d"].bool()
        validate_d2t(d2t, t2d, target.vocab_rows, source=str(path))
        if runner.head_rows != len(d2t):
            raise ValueError(f"{path}: d2t has {len(d2t)} entries but the draft head has {runner.head_rows} rows")
        head_to_target = (torch.arange(len(d2t)) + d2t).to(device)
        vocab = DraftVocab("d2t", head_to_target, head_to_target, target.vocab_rows, SharedVocabSync())
    else:  # tli
        keep = bridge.pruned_draft_rows()
        keep = _rank_head_rows(spec, keep, bridge.draft_to_target[keep], target_tokenizer, target.vocab_rows, info)
        runner.prune_head(keep)
        head_to_target = bridge.draft_to_target[keep].to(device)
        resync = DraftResync(bridge, target_tokenizer, draft_tokenizer, window=spec.resync_window)
        sync = ResyncContextSync(resync, bridge.target_to_draft.tolist())
        vocab = DraftVocab("tli", head_to_target, keep.to(device), target.vocab_rows, sync)
        info["intersection"] = bridge.stats.intersection
        shared = 100 * bridge.stats.intersection
        info["intersection_pct_of_draft"] = round(shared / max(1, draft_tokenizer.vocab_size), 2)
        info["intersection_pct_of_target"] = round(shared / max(1, target_tokenizer.vocab_size), 2)
    info.update(_head_savings(runner, flops_before))
    return DraftModelProposer(runner, vocab, spec.num_speculative_tokens), info
