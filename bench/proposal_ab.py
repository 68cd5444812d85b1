"""A coupled draft's token among its largest logits (NativeHead.propose) against the exact sampling head's draw.

    python bench/proposal_ab.py --out bench/results/DATE-proposal/ab_t07.json

Three `LLM`s of one pair in one process, step-interleaved prompt by prompt (batch 1, fixed k = --k, or adaptive):
"selection" (the code as it is: a coupled draft draws among its --selected largest logits, proposal_head.cpp),
"exact" (the same, its uncut draws through the exact sampling head over every row instead: what a coupled draft did
before), and "greedy" (temperature 0, the reference of sampled / greedy). Seeded requests: the two sampled `LLM`s
must emit the same tokens (the target's own draws; the draft only changes how many a step accepts).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft import LLM, SamplingParams  # noqa: E402
from anydraft.bench.interleave import step_interleaved  # noqa: E402
from anydraft.eval import gsm8k  # noqa: E402
from anydraft.provenance import provenance  # noqa: E402


def exact_proposals(llm: LLM) -> None:
    """Route this LLM's uncut coupled proposals through the exact sampling head (its head object only)."""
    head = llm.proposer.runner.native_head
    selection = head.propose

    def propose(hidden, num_rows, selected, temperature, keys, noise_ids=None, top_k=None, top_p=None):
        if top_k is None and top_p is None:
            return head.sample(hidden, num_rows, temperature, keys, noise_ids)
        return selection(hidden, num_rows, selected, temperature, keys, noise_ids, top_k, top_p)
    head.propose = propose


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen3-target")
    parser.add_argument("--draft", default="smollm2-draft")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3, help="drafted tokens a step (fixed)")
    parser.add_argument("--adaptive", action="store_true", help="adaptive k <= --k instead of a fixed k: on a flat "
                        "optimum (sampled, batch 1) its choices move more than the proposals do")
    parser.add_argument("--rounds", type=int, default=3, help="after a warm-up round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    speculative = {"model": args.draft, "num_speculative_tokens": args.k, "adaptive": args.adaptive}
    llms = {name: LLM(args.target, speculative, max_num_seqs=1) for name in ("selection", "exact", "greedy")}
    exact_proposals(llms["exact"])
    questions = gsm8k.load_split(gsm8k.data_dir(None) / "test.jsonl")[:args.num_prompts]
    prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    rates: dict[str, list[float]] = {name: [] for name in llms}
    equal_outputs = []
    for round_index in range(args.rounds + 1):
        totals = {name: [0, 0.0] for name in llms}
        outputs: dict[str, list] = {name: [] for name in llms}
        for i, prompt in enumerate(prompts):
            runs = {name: (llm, [prompt], [SamplingParams(
                temperature=0.0 if name == "greedy" else args.temperature, max_tokens=args.max_tokens,
                seed=1000 * round_index + i)]) for name, llm in llms.items()}
            for name, (tokens, seconds, ids) in step_interleaved(runs, turn=round_index + i).items():
                totals[name][0] += tokens
                totals[name][1] += seconds
                outputs[name] += ids
        if round_index:   # round 0 warms up
            for name, (tokens, seconds) in totals.items():
                rates[name].append(tokens / seconds)
            equal_outputs.append(sum(a == b for a, b in zip(outputs["selection"], outputs["exact"])))
            print(f"round {round_index}: " + ", ".join(f"{n} {v[-1]:.1f} tok/s" for n, v in rates.items()), flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    result = {**provenance(torch_threads=args.threads), "command": " ".join(["python"] + sys.argv),
              "config": {k: str(v) for k, v in vars(args).items()},
              "tokens_per_second_median": median, "tokens_per_second_all": rates,
              "acceptance_length": {name: llm.stats.acceptance_length for name, llm in llms.items()},
              "k_histogram": {name: {str(k): v for k, v in sorted(llm.stats.k_histogram.items())}
                              for name, llm in llms.items()},
              "selection_over_exact": median["selection"] / median["exact"],
              "selection_over_greedy": median["selection"] / median["greedy"],
              "exact_over_greedy": median["exact"] / median["greedy"],
              "selection_outputs_equal_exact": equal_outputs, "prompts": len(prompts)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("tokens_per_second_median", "acceptance_length",
                                                   "selection_over_exact", "selection_over_greedy",
                                                   "exact_over_greedy", "selection_outputs_equal_exact")}, indent=1))


if __name__ == "__main__":
    main()
