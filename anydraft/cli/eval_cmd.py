"""`anydraft eval gsm8k`: accuracy, acceptance length and tok/s on GSM8K, optionally against the target alone."""
from __future__ import annotations

import argparse
import json
import sys

from .model_args import add_model_args, cache_options, draft_of, speculative_config


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate on a benchmark (gsm8k)")
    p.add_argument("task", choices=["gsm8k"])
    add_model_args(p, max_model_len=4096)
    p.add_argument("--num-questions", type=int, default=500, help="the first N test questions")
    p.add_argument("--num-shots", type=int, default=0,
                   help="few-shot examples from the train split (0 suits the shipped models, trained zero-shot)")
    p.add_argument("--chat", action="store_true", help="use the target tokenizer's chat template")
    p.add_argument("--compare-target", action="store_true",
                   help="also run the target alone: exact-text matches and near-ties at first divergences")
    p.add_argument("--max-tokens", type=int, default=256, help="the most tokens generated per question")
    p.add_argument("--batch-size", type=int, default=16, help="rows decoded together (all prompts are queued at once)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="directory with GSM8K train.jsonl / test.jsonl (default: ../shared/data/gsm8k when present)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); above 0 every question is sampled, the target alone (with "
                        "--compare-target) at the same temperature and seeds")
    p.add_argument("--seed", type=int, default=0, help="question i samples with seed SEED + i (sampled runs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _progress(total: int, label: str, enabled: bool):
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=label, file=sys.stderr, leave=False)
        return bar.update, bar.close
    except ImportError:
        done = [0]

        def update(n):
            done[0] += n
            print(f"\r{label}: {done[0]}/{total}", end="", file=sys.stderr)
        return update, lambda: print(file=sys.stderr)


def markdown_table(result: dict) -> str:
    rows = [("model", "accuracy", "AL", "tok/s", "exact matches")]
    spec = result
    rows.append((f"{spec['target']} + {spec['draft'] or '-'} (k={spec['k']})", f"{spec['accuracy']:.3f}",
                 f"{spec['acceptance_length']:.2f}", f"{spec['tokens_per_second']:.1f}",
                 f"{spec.get('exact_matches', '-')}/{spec['num_questions']}" if "exact_matches" in spec else "-"))
    if "target_alone" in result:
        t = result["target_alone"]
        rows.append((f"{spec['target']} alone", f"{t['accuracy']:.3f}", "1.00", f"{t['tokens_per_second']:.1f}", "-"))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..config import SamplingParams
    from ..engine import Engine
    from ..eval import gsm8k
    from ..provenance import provenance
    from ..llm import LLM
    from ..spec_decode.proposer import NoDraftProposer

    if args.num_questions < 1:
        raise ValueError("--num-questions must be >= 1")
    data_dir = gsm8k.data_dir(args.data)
    test = gsm8k.load_split(data_dir / "test.jsonl")[:args.num_questions]
    shots = gsm8k.load_split(data_dir / "train.jsonl")[:args.num_shots] if args.num_shots else []
    draft = draft_of(args)
    llm = LLM(model=args.target, speculative_config=speculative_config(args), dtype=args.dtype, device=args.device,
              max_num_seqs=args.batch_size, max_model_len=args.max_model_len, **cache_options(args))
    prompts = [gsm8k.build_prompt(ex["question"], shots, llm.tokenizer, args.chat) for ex in test]
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, stop=gsm8k.STOP_STRINGS,
                             seed=None if args.temperature == 0 else args.seed + i) for i in range(len(prompts))]
    update, close = _progress(len(prompts), "gsm8k", not args.no_progress)
    spec_run = gsm8k.run_engine(llm.engine, prompts, params, update)
    close()
    golds = [gsm8k.gold_answer(ex) for ex in test]
    correct = [gsm8k.extract_answer(c) == g for c, g in zip(spec_run.completions, golds)]
    result = {
        "task": "gsm8k", "target": args.target, "draft": draft, "k": args.num_speculative_tokens if draft else 0,
        "vocab_mode": llm.draft_info.get("vocab_mode"), "dtype": args.dtype, "num_shots": args.num_shots,
        "num_questions": len(test), "accuracy": sum(correct) / len(test),
        "temperature": args.temperature, "seed": args.seed if args.temperature else None,
        "acceptance_length": spec_run.stats.acceptance_length,
        "acceptance_by_position": spec_run.stats.acceptance_by_position,
        "tokens_per_second": spec_run.stats.num_emitted / spec_run.seconds,
        "generated_tokens": spec_run.stats.num_emitted, "seconds": spec_run.seconds,
        "draft_info": llm.draft_info, "batch_size": args.batch_size, "provenance": provenance(llm),
    }
    if args.compare_target:
        alone_engine = Engine(llm.target, llm.tokenizer, NoDraftProposer(llm.target.device, llm.target.vocab_rows),
                              llm.engine.max_model_len)
        update, close = _progress(len(prompts), "gsm8k (target alone)", not args.no_progress)
        alone = gsm8k.run_engine(alone_engine, prompts, params, update)
        close()
        alone_correct = [gsm8k.extract_answer(c) == g for c, g in zip(alone.completions, golds)]
        prompt_ids = [llm.tokenizer.encode(p) for p in prompts]
        comparison = gsm8k.compare_runs(spec_run, alone, llm.target, prompt_ids, near_ties=args.temperature == 0)
        result.update({"exact_matches": comparison["exact_matches"],
                       "near_tie_mismatches": comparison["near_tie_mismatches"],
                       "mismatches": comparison["mismatches"],
                       "target_alone": {"accuracy": sum(alone_correct) / len(test),
                                        "tokens_per_second": alone.stats.num_emitted / alone.seconds,
                                        "generated_tokens": alone.stats.num_emitted, "seconds": alone.seconds},
                       "speedup": (result["tokens_per_second"] / (alone.stats.num_emitted / alone.seconds)),
                       "accuracy_vs_target_alone": gsm8k.accuracy_noise(sum(correct), sum(alone_correct), len(test))})
    result["markdown"] = markdown_table(result)
    if args.json:
        print(json.dumps(result))
    else:
        print(result["markdown"])
        if args.compare_target:
            print(f"\nexact-text matches vs target alone: {result['exact_matches']}/{len(test)}; "
                  f"mismatches at a near-tie: {result['near_tie_mismatches']}/{len(result['mismatches'])}")
            noise = result["accuracy_vs_target_alone"]
            print(f"accuracy minus the target alone's: {noise['difference']:+.3f} (binomial standard error "
                  f"{noise['stderr']:.3f}: {'within' if noise['within_binomial_noise'] else 'OUTSIDE'} 2 of them)")
    return 0
