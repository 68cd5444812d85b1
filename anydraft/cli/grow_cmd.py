"""`anydraft grow SMALL --shape NAME --out DIR`: a small checkpoint grown into a real architecture's shape."""
from __future__ import annotations

import argparse
import json

from ..checkpoints.shapes import SHAPES


def add_parser(sub) -> None:
    p = sub.add_parser("grow", help="grow a small checkpoint into a real architecture's shape (same logits)",
                       description="Write a Hugging Face checkpoint with a real architecture's sizes whose logits "
                                   "equal SMALL's up to floating-point rounding: extra dims, heads, MLP rows and "
                                   "layers contribute exactly zero, and what padding changes (norms over a wider "
                                   "vector, 1/sqrt(head_dim), rotary pairs, KV groups) is compensated. It costs "
                                   "what the real model costs. The same model is available by name as "
                                   "SMALL@SHAPE (e.g. qwen3-target@qwen3-1.7b), written to a cache on first use. "
                                   f"Shapes: {', '.join(SHAPES)}.")
    p.add_argument("small", metavar="SMALL_CHECKPOINT", help="checkpoint directory or builtin name")
    p.add_argument("--shape", required=True, metavar="NAME", help=f"one of: {', '.join(SHAPES)}")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary (grown.json) as JSON")


def run(args: argparse.Namespace) -> int:
    from ..checkpoints.grown_checkpoint import grow_checkpoint
    from ..model.loader import resolve_model_path
    from ..checkpoints.shapes import get_shape

    shape = get_shape(args.shape)   # an unknown name fails before the checkpoint is read
    summary = grow_checkpoint(resolve_model_path(args.small), shape.name, args.out, progress=not args.no_progress)
    if args.json:
        print(json.dumps({"out": str(args.out), **summary}, indent=2))
    else:
        print(f"wrote {args.out}: {summary['architecture']} in the shape of {shape.source} "
              f"({summary['parameters'] / 1e9:.2f}B parameters), grown from {summary['grown_from']}")
    return 0
