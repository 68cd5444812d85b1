"""The model flags every model-loading command shares: target, draft ('none' = target alone), k, vocabulary mode,
frequency-ranked draft head, dtype, device, max-model-len — one spelling, one set of choices (from config.py)."""
from __future__ import annotations

import argparse

from ..cache_budget import DEFAULT_KV_CACHE_FRACTION
from ..config import DTYPES, VOCAB_MODES
from ..model.loader import DEFAULT_DRAFT, DEFAULT_TARGET

NO_DRAFT = "none"


def add_model_args(p: argparse.ArgumentParser, max_model_len: int = 2048) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target checkpoint dir or builtin name (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help=f"draft checkpoint dir or builtin name (default {DEFAULT_DRAFT}); "
                        f"'{NO_DRAFT}' decodes with the target alone")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=5,
                   help="the most draft tokens per step (default 5; adaptive speculation picks 0..k per step)")
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="draft exactly k tokens every step instead of choosing k per step for speed")
    p.add_argument("--vocab-mode", default="auto", choices=VOCAB_MODES,
                   help="how the vocabularies are matched (auto picks d2t, identity, tli or slem and says why)")
    p.add_argument("--vocab-mode-corpus", default=None, metavar="FILE",
                   help="in-domain text (.jsonl or plain) on which --vocab-mode auto measures how much the "
                        "vocabularies' intersection covers (none: auto keeps tli across vocabularies)")
    add_draft_head_args(p)
    p.add_argument("--dtype", default="bfloat16", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--max-model-len", type=int, default=max_model_len,
                   help=f"prompt + output tokens per request (default {max_model_len})")
    add_cache_args(p)


def add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-memory", default=None, metavar="BYTES",
                   help=f"memory for the target's and the draft's KV block pools together, e.g. 4GiB (default: "
                        f"{DEFAULT_KV_CACHE_FRACTION:.0%}% of the memory free after loading, at most what every row "
                        f"at max-model-len holds)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of prompt prefixes seen before, for the target and the draft (default on)")


def cache_options(args: argparse.Namespace) -> dict:
    """LLM keyword arguments for the cache flags."""
    return {"kv_cache_memory": args.kv_cache_memory, "enable_prefix_caching": args.enable_prefix_caching}


def add_draft_head_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-vocab-size", type=int, default=None, metavar="N",
                   help="keep only the N draft head rows whose tokens --draft-vocab-corpus uses most (its "
                        "target tokenization; with --vocab-mode slem the draft's own) (frequency-ranked head, as "
                        "FR-Spec / EAGLE-3 draft vocabularies): a cheaper draft forward; output unchanged, "
                        "acceptance drops only off the corpus's domain")
    p.add_argument("--draft-vocab-corpus", default=None, metavar="FILE",
                   help="in-domain text ranking the tokens: .jsonl (string fields per line) or plain text, "
                        "e.g. ../shared/data/gsm8k/train.jsonl")


def draft_head_options(args: argparse.Namespace) -> dict:
    """speculative_config keys for the flags that were given."""
    return {"draft_vocab_size": args.draft_vocab_size, "draft_vocab_corpus": args.draft_vocab_corpus}


def draft_of(args: argparse.Namespace) -> str | None:
    """The draft model, or None for the target alone."""
    return None if args.draft in (None, NO_DRAFT) else args.draft


def speculative_config(args: argparse.Namespace) -> dict | None:
    """The LLM's speculative_config from the shared flags (None: target alone)."""
    draft = draft_of(args)
    if draft is None:
        return None
    return {"model": draft, "num_speculative_tokens": args.num_speculative_tokens, "vocab_mode": args.vocab_mode,
            "vocab_mode_corpus": args.vocab_mode_corpus, "adaptive": args.adaptive, **draft_head_options(args)}
