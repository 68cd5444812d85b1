"""`anydraft generate`: one prompt through target + draft, text and one stats line (or JSON)."""
from __future__ import annotations

import argparse
import json
import sys

from ..model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from .draft_head_args import add_draft_head_args, draft_head_options


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Speculative generation. With no model flags: the embedded pair "
                                   f"{DEFAULT_TARGET} + {DEFAULT_DRAFT}. --no-draft decodes with the target alone.")
    p.add_argument("prompt", help="prompt text ('\\n' escapes are turned into newlines)")
    p.add_argument("--target", default=None, help=f"target checkpoint dir or builtin name (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=None, help=f"draft checkpoint dir or builtin name (default {DEFAULT_DRAFT} "
                   "when --target is not given; otherwise none: target alone)")
    p.add_argument("--no-draft", action="store_true", help="decode with the target alone")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--vocab-mode", default="auto", choices=["auto", "identity", "tli", "d2t"])
    add_draft_head_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | float64")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..config import SamplingParams
    from ..llm import LLM

    target = args.target or DEFAULT_TARGET
    draft = args.draft if args.draft is not None else (DEFAULT_DRAFT if args.target is None else None)
    if args.no_draft:
        draft = None
    spec = None if draft is None else {"model": draft, "num_speculative_tokens": args.num_speculative_tokens,
                                       "vocab_mode": args.vocab_mode, **draft_head_options(args)}
    prompt = args.prompt.replace("\\n", "\n")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_tokens=args.max_tokens, stop=args.stop)
    llm = LLM(model=target, speculative_config=spec, dtype=args.dtype, device=args.device, max_num_seqs=1)
    out = llm.generate([prompt], params)[0]
    if args.json:
        result = {"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                  "target": target, "draft": draft, "metrics": out.metrics, "draft_info": llm.draft_info}
        print(json.dumps(result))
    else:
        print(out.text)
        stats = llm.stats
        stats.wall_seconds = out.metrics["wall_seconds"]
        print(f"[{target} + {draft or 'no draft'} | {llm.draft_info.get('vocab_mode') or 'target alone'}] "
              f"{stats.summary_line()}", file=sys.stderr)
    return 0
