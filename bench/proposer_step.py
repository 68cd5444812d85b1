"""The vLLM proposer's own cost per step, outside vLLM: HistoryDrafter.propose called as vLLM 0.32 calls it, along
a fixed continuation (the target alone's greedy text from anydraft's engine), verification emulated as greedy
acceptance against that text. Prints ms per propose call (median) split into the draft's forwards and the rest.

    python bench/proposer_step.py --target qwen3-target --draft smollm2-draft --num-prompts 8 --max-tokens 128 \
        --json bench/results/<date>/proposer_step.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import gsm8k_prompts  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen3-target")
    p.add_argument("--draft", default="smollm2-draft")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from anydraft import LLM
    from anydraft.config import SamplingParams, SpeculativeConfig
    from anydraft.integrations.vllm.history_drafter import HistoryDrafter
    from anydraft.model.loader import resolve_model_path
    from anydraft.tokenizer import Tokenizer

    prompts = gsm8k_prompts(args.num_prompts)
    target = LLM(model=args.target, dtype="bfloat16")
    outputs = target.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
    tokenizer = Tokenizer.from_dir(resolve_model_path(args.target))
    spec = SpeculativeConfig.from_any({"model": args.draft, "num_speculative_tokens": args.k, "adaptive": False})
    drafter, info = HistoryDrafter.build(spec, tokenizer, tokenizer.vocab_size, torch.device("cpu"), torch.bfloat16,
                                         1, 4096)
    runner = drafter.draft.runner
    forward_seconds = [0.0]

    def timed(method):   # the draft model's forwards and head, so the rest is the proposer's host work
        def call(*a, **kw):
            t0 = time.perf_counter()
            out = method(*a, **kw)
            forward_seconds[0] += time.perf_counter() - t0
            return out
        return call

    runner.forward, runner.greedy_ids = timed(runner.forward), timed(runner.greedy_ids)
    steps, forwards, accepted_total, drafts = [], [], 0, 0
    for out in outputs:
        prompt_ids = list(out.prompt_token_ids)
        text_ids = list(out.outputs[0].token_ids)
        history = np.zeros((1, len(prompt_ids) + len(text_ids) + args.k + 2), dtype=np.int64)
        n = len(prompt_ids) + 1   # the prefill's first token
        sequence = prompt_ids + text_ids
        history[0, :len(sequence)] = sequence
        sampled = [sequence[n - 1:n]]
        while n < len(sequence):
            forward_seconds[0] = 0.0
            t0 = time.perf_counter()
            proposal = drafter.propose(sampled, np.array([n]), history)[0]
            steps.append(time.perf_counter() - t0)
            forwards.append(forward_seconds[0])
            matched = 0
            while matched < len(proposal) and n + matched < len(sequence) and proposal[matched] == sequence[n + matched]:
                matched += 1
            accepted_total += matched
            drafts += 1
            step_tokens = min(matched + 1, len(sequence) - n)
            sampled = [sequence[n:n + step_tokens]]
            n += step_tokens
        drafter.draft.remove_request(0)
        drafter.states = type(drafter.states)(1)
    result = {"target": args.target, "draft": args.draft, "k": args.k, "info": info,
              "propose_ms_median": 1e3 * statistics.median(steps),
              "draft_forward_ms_median": 1e3 * statistics.median(forwards),
              "host_ms_median": 1e3 * statistics.median(s - f for s, f in zip(steps, forwards)),
              "acceptance_length": 1 + accepted_total / drafts, "num_steps": drafts}
    from anydraft.provenance import provenance
    result["provenance"] = provenance(command=" ".join(sys.argv))
    print(json.dumps({k: v for k, v in result.items() if k not in ("provenance", "info")}, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
