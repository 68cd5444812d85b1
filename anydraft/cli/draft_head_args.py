"""The frequency-ranked draft head flags, shared by generate, eval and bench (see vocab/frequency.py)."""
from __future__ import annotations

import argparse


def add_draft_head_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-vocab-size", type=int, default=None, metavar="N",
                   help="keep only the N draft head rows whose target tokens --draft-vocab-corpus uses most "
                        "(frequency-ranked head, as FR-Spec / EAGLE-3 draft vocabularies): a cheaper draft "
                        "forward; output unchanged, acceptance drops only off the corpus's domain")
    p.add_argument("--draft-vocab-corpus", default=None, metavar="FILE",
                   help="in-domain text ranking the tokens: .jsonl (string fields per line) or plain text, "
                        "e.g. ../shared/data/gsm8k/train.jsonl")


def draft_head_options(args: argparse.Namespace) -> dict:
    """speculative_config keys for the flags that were given."""
    return {"draft_vocab_size": args.draft_vocab_size, "draft_vocab_corpus": args.draft_vocab_corpus}
