"""`anydraft advise`: rank candidate drafts for a target by predicted speedup (anydraft/advisor.py)."""
from __future__ import annotations

import argparse
import json

from ..config import DTYPES
from ..model.loader import BUILTIN_MODELS


def add_parser(sub) -> None:
    p = sub.add_parser("advise", help="rank candidate drafts for a target (overlap, coverage, mode, AL, speedup)",
                       description="For each candidate draft: vocabulary overlap both ways, how much of the corpus "
                                   "TLI's intersection covers, the vocab mode 'auto' chooses and why, the "
                                   "frequency-ranked head size keeping 99% of the corpus, the measured draft/target "
                                   "cost ratio, the measured AL at each k (greedy, fixed k) and the cost model's "
                                   "predicted speedup; ranked by predicted speedup. Builtin models: "
                                   + ", ".join(BUILTIN_MODELS))
    p.add_argument("--target", required=True, help="target checkpoint dir or builtin name")
    p.add_argument("--drafts", required=True, metavar="D1,D2,...", help="comma-separated draft dirs or builtin names")
    p.add_argument("--corpus", default=None, metavar="FILE",
                   help="in-domain text (.jsonl: string fields per line; else text split at blank lines) for "
                        "coverage, auto's choice and head sizes (default: GSM8K train.jsonl of --data)")
    p.add_argument("--num-prompts", type=int, default=10, help="GSM8K test questions AL is measured on (default 10)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--ks", default="1-5", help="k values to measure: '1-5' or '1,3,5' (default 1-5)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together while measuring AL")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="directory with GSM8K train.jsonl / test.jsonl (default: ../shared/data/gsm8k when present)")
    p.add_argument("--dtype", default="bfloat16", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--max-model-len", type=int, default=1024, help="prompt + output tokens per request")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _ks(text: str) -> tuple[int, ...]:
    try:
        if "-" in text:
            low, high = (int(x) for x in text.split("-", 1))
            ks = tuple(range(low, high + 1))
        else:
            ks = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--ks {text!r}: give a range like 1-5 or a list like 1,3,5") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"--ks {text!r}: k values must be >= 1")
    return ks


def run(args: argparse.Namespace) -> int:
    from ..advisor import AdviseConfig, advise, gsm8k_prompts, markdown_table
    from ..eval import gsm8k
    from ..provenance import provenance

    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    drafts = [d.strip() for d in args.drafts.split(",") if d.strip()]
    data_dir = gsm8k.data_dir(args.data)
    corpus = args.corpus or str(data_dir / "train.jsonl")
    cfg = AdviseConfig(target=args.target, drafts=drafts, corpus=corpus,
                       prompts=gsm8k_prompts(data_dir, args.num_prompts), ks=_ks(args.ks),
                       max_tokens=args.max_tokens, dtype=args.dtype, device=args.device,
                       batch_size=min(args.batch_size, args.num_prompts), max_model_len=args.max_model_len)
    result = advise(cfg)
    result["prompts"] = f"GSM8K test, first {args.num_prompts} questions ({data_dir / 'test.jsonl'})"
    result["markdown"] = markdown_table(result)
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
             if k not in ("command", "json") and v is not None]
    result["provenance"] = provenance(kernels=result.pop("kernels"), command="anydraft advise " + " ".join(flags))
    if args.json:
        print(json.dumps(result))
    else:
        print(result["markdown"])
        print(f"\ncosts at batch 1 on this machine: target {1e3 * result['costs']['target_seconds']:.2f} ms/token; "
              f"AL on {result['prompts']}, {args.max_tokens} tokens each, greedy")
        for r in result["drafts"]:
            print(f"{r['rank']}. {r['draft']}: auto -> {r['auto_mode']}: {r['auto_reason']}")
            if "note" in r:
                print(f"   {r['note']}")
        print(f"\nbest: {result['drafts'][0]['command']}")
    return 0
