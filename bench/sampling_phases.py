"""Where a sampled step's time goes next to a greedy one: CPU time per emitted token, split by phase.

For the target alone and TLI (fixed k, default 3), at each batch size: one LLM per (contender, batch, mode) decodes
--num-prompts GSM8K prompts (batch at a time, --max-tokens each) greedily and at temperature 0.7 (seeded). The model
runners' and the step's functions are wrapped to add up their exclusive process CPU time (target body, target
greedy / sampling head, full logits, probabilities, draws, verification, the draft's); the rest is "other" (host
work). One intra-op thread by default, so that CPU time is the work done, not the time waited: on a loaded machine
wall-clock splits mostly measure the neighbours, CPU time much less so (memory-bandwidth contention still shows).
The headline is each phase's share and sampled / greedy CPU per token; tok/s comes from bench/sampling_speed.py.

    python bench/sampling_phases.py --out bench/results/<date>-sampling/phases.json
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import time
from pathlib import Path

import torch

import anydraft.engine as engine_module
import anydraft.spec_decode.draft_proposer as draft_module
from anydraft import LLM, SamplingParams
from anydraft.eval import gsm8k
from anydraft.model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from anydraft.provenance import provenance

MODES = {"greedy": 0.0, "sampled": 0.7}


class PhaseClock:
    """Exclusive process CPU time of wrapped functions (a wrapped call inside another counts only once)."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()
        self._inner: list[float] = []

    def wrap(self, owner, name: str, label: str) -> None:
        if not hasattr(owner, name):
            return
        function = getattr(owner, name)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.process_time()
            self._inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                spent, inner = time.process_time() - start, self._inner.pop()
                self.seconds[label] += spent - inner
                if self._inner:
                    self._inner[-1] += spent
        setattr(owner, name, timed)


def instrument(llm: LLM, clock: PhaseClock) -> None:
    runners = [("target", llm.target)] + ([("draft", llm.proposer.runner)] if hasattr(llm.proposer, "runner") else [])
    for side, runner in runners:
        clock.wrap(runner, "forward", f"{side} body")
        clock.wrap(runner, "prefill_rows", f"{side} prefill")
        clock.wrap(runner, "greedy_ids", f"{side} greedy head")
        clock.wrap(runner, "sample_ids", f"{side} sampling head")
        clock.wrap(runner, "logits", f"{side} full logits")
    for module, side in ((engine_module, "target"), (draft_module, "draft")):
        clock.wrap(module, "logits_to_probs", f"{side} probabilities")
        clock.wrap(module, "sample_from_probs", f"{side} inverse-CDF draw")
        clock.wrap(module, "draw_uniforms", f"{side} noise")
        clock.wrap(module, "draw_keys", f"{side} noise keys")
    clock.wrap(engine_module, "verify_sampling", "verify (rejection sampling)")
    clock.wrap(engine_module, "verify_greedy", "verify (equality)")
    clock.wrap(engine_module, "draw_noise", "target noise")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    questions = gsm8k.load_split(gsm8k.data_dir(None) / "test.jsonl")[:args.num_prompts]
    prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    contenders = {"target alone": None,
                  "TLI": {"model": args.draft, "num_speculative_tokens": args.k, "adaptive": False}}
    result: dict = {"command": "python bench/sampling_phases.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "config": vars(args), "runs": {}}
    for name, spec in contenders.items():
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            # one prompt at a time at batch 1 takes long: a quarter of the prompts there
            count = len(prompts) if batch > 1 else max(1, len(prompts) // 4)
            for mode, temperature in MODES.items():
                llm = LLM(args.target, spec, max_num_seqs=batch)
                clock = PhaseClock()
                instrument(llm, clock)

                def run(seed: int) -> int:
                    tokens = 0
                    for i in range(0, count, batch):
                        params = [SamplingParams(temperature=temperature, max_tokens=args.max_tokens,
                                                 seed=None if temperature == 0 else seed + j)
                                  for j in range(i, min(i + batch, count))]
                        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts[i:i + batch], params))
                    return tokens
                run(0)   # warm-up
                clock.seconds.clear()
                llm.engine.stats = type(llm.engine.stats)(llm.engine.k)
                start = time.process_time()
                tokens = run(1000)
                total = time.process_time() - start
                clock.seconds["other (host: engine, proposer, output)"] = total - sum(clock.seconds.values())
                phases = {label: 1e3 * seconds / tokens for label, seconds in clock.seconds.most_common()}
                result["runs"][f"{name} batch {batch} {mode}"] = {
                    "contender": name, "batch": batch, "mode": mode, "tokens": tokens,
                    "acceptance_length": llm.stats.acceptance_length if spec else 1.0,
                    "cpu_ms_per_token": 1e3 * total / tokens, "phases_cpu_ms_per_token": phases}
                print(f"{name} batch {batch} {mode}: {1e3 * total / tokens:.2f} CPU ms/token, AL "
                      f"{result['runs'][f'{name} batch {batch} {mode}']['acceptance_length']:.2f}", flush=True)
                for label, ms in phases.items():
                    print(f"    {label:40s} {ms:7.3f}  ({100 * ms / (1e3 * total / tokens):4.1f}%)", flush=True)
            greedy, sampled = (result["runs"][f"{name} batch {batch} {m}"]["cpu_ms_per_token"] for m in MODES)
            result["runs"][f"{name} batch {batch} sampled"]["greedy_over_sampled_cpu"] = greedy / sampled
            print(f"  {name} batch {batch}: greedy / sampled CPU per token {greedy / sampled:.2f}", flush=True)
    result.update(provenance(llm, torch_threads=args.threads))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
