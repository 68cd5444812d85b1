"""The native linear kernels at 1-64 activation rows, on a real model's shapes, for one or more checkouts side by side.

    python bench/linear_rows.py --checkout before=/tmp/anydraft-old --checkout after=. \
        --json bench/results/<date>-avx2-kernels/linear_rows.json

A speculative step verifies k + 1 tokens per request and a prefill many more, so what a target costs at 2-8 rows
decides which k pays. For each checkout (its own native build, compiled on first use) this times, in a child
process: the decoder body's linear layers with packed weights (three layers of the shape: the q/k/v, o, gate/up
and down projections, ~300 MB streamed from memory) and the output head (row-major, vocabulary x hidden), at each
row count. Checkouts alternate round by round (this machine's speed drifts); medians of the rounds. Each child also
returns a digest of every output, so two checkouts can be shown to compute the same bits.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from anydraft.checkpoints.shapes import SHAPES   # the real architectures `anydraft grow` knows

ROWS = (1, 2, 3, 4, 5, 6, 8, 16, 64)


def child(shape: str, repeats: int, threads: int) -> dict:
    """Runs inside a checkout: times its kernels, returns medians (ms) and an output digest per row count."""
    import torch
    from anydraft.model.native_extension import load_extension

    extension = load_extension()
    if extension is None:
        raise SystemExit("the native kernels do not build or load here")
    torch.set_num_threads(threads)
    s = SHAPES[shape]
    hidden, intermediate, attention = s.hidden_size, s.intermediate_size, s.num_attention_heads * s.head_dim
    qkv = (s.num_attention_heads + 2 * s.num_key_value_heads) * s.head_dim
    gen = torch.Generator().manual_seed(0)

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) / k ** 0.5).bfloat16()

    layer = [(qkv, hidden), (hidden, attention), (2 * intermediate, hidden), (hidden, intermediate)]
    body = [(extension.pack_body_weight(weight(n, k)), n, k) for n, k in layer * 3]
    head = weight(s.vocab_size, hidden)
    out = {}
    for rows in ROWS:
        widths = dict.fromkeys((hidden, attention, intermediate))   # each input width once, in this order
        x = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in widths}
        digest = hashlib.sha256()
        for packed, n, k in body:   # warm-up and the digest
            digest.update(extension.body_linear(x[k], packed, n).view(torch.int16).numpy().tobytes())
        digest.update(extension.head_logits(x[hidden], head).view(torch.int16).numpy().tobytes())
        body_ms, head_ms = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            for packed, n, k in body:
                extension.body_linear(x[k], packed, n)
            body_ms.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            extension.head_logits(x[hidden], head)
            head_ms.append((time.perf_counter() - start) * 1e3)
        out[rows] = {"body_3_layers_ms": statistics.median(body_ms), "head_ms": statistics.median(head_ms),
                     "digest": digest.hexdigest()[:16]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", action="append", metavar="LABEL=PATH", default=None,
                   help="a checkout of anydraft to measure (default: this one, labelled 'here')")
    p.add_argument("--shape", choices=list(SHAPES), default="qwen3-1.7b")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every checkout once")
    p.add_argument("--repeats", type=int, default=5, help="timings per row count within a round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.shape, args.repeats, args.threads)))
        return
    checkouts = dict(c.split("=", 1) for c in (args.checkout or ["here=."]))
    rounds = {label: [] for label in checkouts}
    for _ in range(args.rounds):
        for label, path in checkouts.items():
            root = Path(path).resolve()
            env = dict(os.environ, PYTHONPATH=str(root))
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--shape", args.shape,
                                   "--repeats", str(args.repeats), "--threads", str(args.threads)],
                                  cwd=root, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{label}: {done.stderr.strip()[-2000:]}")
            rounds[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    table = {}
    for label, runs in rounds.items():
        table[label] = {rows: {key: statistics.median(run[str(rows)][key] for run in runs)
                               for key in ("body_3_layers_ms", "head_ms")} | {"digest": runs[0][str(rows)]["digest"]}
                        for rows in ROWS}
    labels = list(table)
    print("| rows | " + " | ".join(f"{l}: body (3 layers) ms | {l}: head ms" for l in labels) + " | same bits |")
    print("|---|" + "---|---|" * len(labels) + "---|")
    for rows in ROWS:
        same = len({table[l][rows]["digest"] for l in labels}) == 1
        print(f"| {rows} | " + " | ".join(f"{table[l][rows]['body_3_layers_ms']:.1f} | {table[l][rows]['head_ms']:.1f}"
                                          for l in labels) + f" | {'yes' if same else 'no'} |")
    if args.json:
        from anydraft.provenance import provenance
        commits = {label: subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                                         text=True).stdout.strip() for label, path in checkouts.items()}
        result = {"provenance": provenance(command=" ".join(["python"] + sys.argv)), "shape": args.shape,
                  "checkouts": {label: {"path": path, "commit": commits[label]} for label, path in checkouts.items()},
                  "median_ms": table, "rounds": rounds}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
