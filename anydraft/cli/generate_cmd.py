"""`anydraft generate`: one prompt through target + draft, text and one stats line (or JSON)."""
from __future__ import annotations

import argparse
import json
import sys

from ..model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from .model_args import add_model_args, cache_options, draft_of, speculative_config


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Speculative generation. With no model flags: the embedded pair "
                                   f"{DEFAULT_TARGET} + {DEFAULT_DRAFT}. --draft none decodes with the target alone.")
    p.add_argument("prompt", help="prompt text ('\\n' escapes are turned into newlines)")
    add_model_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus cut (1 = none)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = no cut)")
    p.add_argument("--seed", type=int, default=None, help="seed of this request's draws (default: a fresh one)")
    p.add_argument("--max-tokens", type=int, default=128, help="the most tokens generated")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object (vLLM's RequestOutput fields)")


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..config import SamplingParams
    from ..llm import LLM

    prompt = args.prompt.replace("\\n", "\n")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_tokens=args.max_tokens, stop=args.stop)
    llm = LLM(model=args.target, speculative_config=speculative_config(args), dtype=args.dtype, device=args.device,
              max_num_seqs=1, max_model_len=args.max_model_len, **cache_options(args))
    out = llm.generate([prompt], params)[0]
    if args.json:
        result = {**asdict(out), "target": args.target, "draft": draft_of(args), "draft_info": llm.draft_info}
        result["metrics"]["kernels"] = llm.kernels
        print(json.dumps(result))
    else:
        print(out.outputs[0].text)
        stats = llm.stats
        stats.wall_seconds = out.metrics["wall_seconds"]
        print(f"[{args.target} + {draft_of(args) or 'no draft'} | {llm.draft_info.get('vocab_mode') or 'target alone'}] "
              f"{stats.summary_line()}", file=sys.stderr)
    return 0
