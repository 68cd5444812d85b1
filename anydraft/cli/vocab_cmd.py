"""`anydraft vocab TARGET DRAFT`: report how two tokenizers' vocabularies overlap (the TLI bridge)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from anydraft.tokenizer import Tokenizer
from anydraft.vocab.cache import default_cache_dir, load_or_build_bridge
from anydraft.vocab.frequency import coverage_report, load_or_count, specials_among

CUT_SIZES = [2048, 4096, 8192, 16384, 32768]


def _corpus_coverage(args, bridge, target_tokenizer: Tokenizer) -> dict:
    """coverage_report of the corpus for the rows this draft could propose (TLI: the intersection)."""
    cache_dir = None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else default_cache_dir())
    counts = load_or_count(target_tokenizer, args.draft_vocab_corpus, bridge.target_vocab_rows, cache_dir)
    if bridge.is_identity:
        candidates = torch.arange(min(bridge.target_vocab_rows, target_tokenizer.vocab_size))
    else:
        candidates = bridge.draft_to_target[bridge.pruned_draft_rows()]
    specials = specials_among(candidates, target_tokenizer)
    return {"corpus": str(args.draft_vocab_corpus), **coverage_report(candidates, counts, specials, CUT_SIZES)}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("vocab", help="vocabulary intersection of a target and a draft tokenizer",
                                   description="Build (or load from cache) the target<->draft vocabulary bridge "
                                   "and report its coverage.")
    parser.add_argument("target_tokenizer", metavar="TARGET_TOKENIZER_DIR", help="folder with the target's tokenizer.json")
    parser.add_argument("draft_tokenizer", metavar="DRAFT_TOKENIZER_DIR", help="folder with the draft's tokenizer.json")
    parser.add_argument("--target-rows", type=int, default=None,
                        help="target embedding rows (default: the tokenizer's size)")
    parser.add_argument("--draft-rows", type=int, default=None,
                        help="draft embedding rows (default: the tokenizer's size)")
    parser.add_argument("--draft-vocab-corpus", default=None, metavar="FILE",
                        help="also report how much of this corpus (.jsonl or text) the draft can propose, whole "
                             "and with its head cut to the most frequent N rows (to choose --draft-vocab-size)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-cache", action="store_true", help="build the bridge without reading or writing the cache")
    parser.add_argument("--cache-dir", default=None, help="bridge cache directory (default: $ANYDRAFT_CACHE_DIR "
                        "or ~/.cache/anydraft/bridges)")


def run(args: argparse.Namespace) -> int:
    for name in ("target_rows", "draft_rows"):
        rows = getattr(args, name)
        if rows is not None and rows <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {rows}")
    target_tokenizer = Tokenizer.from_dir(args.target_tokenizer)
    draft_tokenizer = Tokenizer.from_dir(args.draft_tokenizer)
    start = time.perf_counter()
    bridge = load_or_build_bridge(target_tokenizer, draft_tokenizer, args.target_rows, args.draft_rows,
                                  cache_dir=args.cache_dir, use_cache=not args.no_cache)
    seconds = time.perf_counter() - start
    stats = bridge.stats
    report = {
        "target": str(target_tokenizer.path), "draft": str(draft_tokenizer.path),
        **stats.to_dict(), "is_identity": bridge.is_identity, "cached": bridge.from_cache,
        "seconds": seconds,  # this run's build or cache-load time; build_seconds is the original build's
    }
    if args.draft_vocab_corpus:
        report["draft_vocab_corpus"] = _corpus_coverage(args, bridge, target_tokenizer)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"target  {report['target']}: {stats.target_vocab} tokens, {stats.target_vocab_rows} rows")
    print(f"draft   {report['draft']}: {stats.draft_vocab} tokens, {stats.draft_vocab_rows} rows")
    if bridge.is_identity:
        print("identical vocabularies: identity mapping (no gather/scatter)")
    print(f"intersection  {stats.intersection} tokens ({stats.pct_target:.1f}% of target, "
          f"{stats.pct_draft:.1f}% of draft) + {stats.special_matched} special tokens matched")
    for side, counts in (("target", stats.unmatched_target), ("draft", stats.unmatched_draft)):
        listed = ", ".join(f"{kind} {count}" for kind, count in counts.items() if count) or "none"
        print(f"unmatched {side:<6}  {listed}")
    corpus = report.get("draft_vocab_corpus")
    if corpus:
        print(f"corpus  {corpus['corpus']}: {corpus['corpus_tokens']} target tokens, {corpus['proposable_pct']:.2f}% "
              f"proposable by the draft ({corpus['distinct_used']} distinct)")
        cuts = " · ".join(f"{c['size']} rows {c['coverage_pct']:.2f}%" for c in corpus["cuts"])
        need = corpus["size_for_coverage"]
        print(f"head cut to the most frequent: {cuts or 'n/a'}; 99% needs {need['0.99']} rows, "
              f"99.9% needs {need['0.999']}")
    source = "loaded from cache" if bridge.from_cache else "built"
    print(f"bridge {source} in {seconds:.3f} s (original build {stats.build_seconds:.3f} s)")
    return 0
