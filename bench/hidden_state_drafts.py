"""Hidden-state drafters (EAGLE-3, DSpark) next to the independent drafts, on the same target and questions.

    python bench/hidden_state_drafts.py --num-questions 20 --out bench/results/DATE-hidden-state/gsm8k.json

Greedy, bf16, fixed k, GSM8K test questions (zero-shot prompt the models were trained on), one LLM per draft in turn in
one process, same batch size. Reports AL, acceptance by position, tok/s and exact matches against the target
alone (token for token). Timings on a shared 2-core machine are noisy; compare within one run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.config import SamplingParams  # noqa: E402
from anydraft.llm import LLM  # noqa: E402
from anydraft.provenance import git_commit, machine  # noqa: E402

DRAFTS = [("smollm2-draft", 3), ("qwen3-draft", 3), ("qwen3-eagle3", 3), ("qwen3-eagle3-full", 3),
          ("qwen3-dspark", 4), ("qwen3-dspark-full", 4)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen3-target")
    parser.add_argument("--num-questions", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--drafts", nargs="*", default=None, help="name:k pairs (default: all six)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    drafts = DRAFTS if args.drafts is None else [(d.split(":")[0], int(d.split(":")[1])) for d in args.drafts]
    rows = [json.loads(line) for line in open("/work/shared/data/gsm8k/test.jsonl")][:args.num_questions]
    prompts = [f"Question: {r['question']}\nAnswer:" for r in rows]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    results = []

    def run(draft, k):
        # fixed k (adaptive k off): AL and speed at the k each drafter was trained for, side by side
        spec = None if draft is None else {"model": draft, "num_speculative_tokens": k, "adaptive": False}
        llm = LLM(model=args.target, speculative_config=spec, dtype="bfloat16", device="cpu",
                  max_num_seqs=args.batch_size, max_model_len=1024)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))   # warm-up
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        forwards = sum(o.metrics["target_forwards"] for o in outputs)
        accepted = sum(o.metrics["num_accepted"] for o in outputs)
        return llm, outputs, {"draft": draft, "k": k if draft else 0, "vocab_mode": llm.draft_info.get("vocab_mode"),
                              "draft_vocab_size": llm.draft_info.get("draft_vocab_size"),
                              "acceptance_length": round((accepted + forwards) / max(forwards, 1), 3),
                              "tokens": tokens, "seconds": round(seconds, 2),
                              "tokens_per_second": round(tokens / seconds, 2), "kernels": llm.kernels}

    _, alone_outputs, alone = run(None, 0)
    results.append({**alone, "exact_matches": f"{len(prompts)}/{len(prompts)}"})
    for draft, k in drafts:
        llm, outputs, row = run(draft, k)
        exact = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outputs, alone_outputs))
        row["exact_matches"] = f"{exact}/{len(prompts)}"
        row["speedup_vs_target_alone"] = round(row["tokens_per_second"] / alone["tokens_per_second"], 2)
        print(json.dumps(row), flush=True)
        results.append(row)
        del llm
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git_commit": git_commit(),
              "machine": machine(), "command": " ".join(sys.argv), "num_questions": len(prompts),
              "max_tokens": args.max_tokens, "batch_size": args.batch_size, "threads": args.threads,
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print("| draft | mode | k | AL | tok/s | vs target alone | exact |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['draft'] or 'none (target alone)'} | {r['vocab_mode'] or '-'} | {r['k']} | {r['acceptance_length']} "
              f"| {r['tokens_per_second']} | {r.get('speedup_vs_target_alone', 1.0)} | {r['exact_matches']} |")


if __name__ == "__main__":
    main()
