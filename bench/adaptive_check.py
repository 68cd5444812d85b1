"""Adaptive speculation against its two baselines, in one process, interleaved (issue: throughput under load).

Batch 16: LLM with the draft and default settings (num_speculative_tokens 5, adaptive) vs LLM with the target
alone, 16 GSM8K test prompts decoded together. Batch 1: the same settings vs {"num_speculative_tokens": 3,
"adaptive": False} (and the target alone, for context), one prompt at a time; each setting has its own LLM.
Greedy, max 128 tokens, medians of --repeats rounds after a warm-up; within a round the contenders of a batch
size decode the same group of prompts (all 16 at batch 16, each prompt at batch 1) taking turns step by step, in
rotating order, each timed over its own steps. Outputs are checked equal across the contenders (greedy is
lossless).

    python bench/adaptive_check.py --out bench/results/<date>-adaptive/check.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from anydraft import LLM, SamplingParams
from anydraft.bench.interleave import step_interleaved
from anydraft.eval import gsm8k
from anydraft.model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from anydraft.provenance import provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=None)
    parser.add_argument("--extra-batch-sizes", default="",
                        help="comma list: also adaptive vs fixed k=3 vs the target alone at these batch sizes, each on "
                             "max(B, --num-prompts) prompts decoded B at a time (the goals' batch 4 and 64)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    extra = [int(b) for b in args.extra_batch_sizes.split(",") if b]
    questions = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[:max([args.num_prompts] + extra)]
    all_prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    prompts = all_prompts[:args.num_prompts]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    batch = len(prompts)
    # One LLM per (setting, contender): adaptive learns its costs at the batch size it serves, and each k
    # histogram counts only its own setting's steps.
    def make(name: str, b: int) -> LLM:
        speculative = {"target alone": None, "adaptive k<=5": {"model": args.draft},
                       "fixed k=3": {"model": args.draft, "num_speculative_tokens": 3, "adaptive": False}}[name]
        return LLM(args.target, speculative, max_num_seqs=b)

    groups = [("batch16", ["adaptive k<=5", "target alone"], batch),
              ("batch1", ["adaptive k<=5", "fixed k=3", "target alone"], 1)]
    groups += [(f"extra batch{b}", ["adaptive k<=5", "fixed k=3", "target alone"], b) for b in extra]
    group_prompts = {setting: all_prompts[:max(b, args.num_prompts)] if setting.startswith("extra") else prompts
                     for setting, _, b in groups}
    contenders = {(setting, name): make(name, b) for setting, names, b in groups for name in names}
    for setting, names, b in groups:   # warm-up
        step_interleaved({name: (contenders[(setting, name)], group_prompts[setting][:b], [params] * b)
                          for name in names})
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in contenders}
    outputs: dict[tuple[str, str], list] = {}
    # The contenders of a batch size take turns step by step (a step is milliseconds): this machine's speed
    # drifts by tens of percent within seconds, and interleaving whole rounds (seconds each) let a drift land on
    # one contender. Each contender's time is its own steps' (and queueing its prompts), summed.
    for repeat in range(args.repeats):
        for setting, names, b in groups:
            tokens, seconds = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0)
            outs = {name: [] for name in names}
            for i in range(0, len(group_prompts[setting]), b):
                group = group_prompts[setting][i:i + b]
                done = step_interleaved({name: (contenders[(setting, name)], group, [params] * len(group))
                                         for name in names}, turn=repeat + i)
                for name, (n, dt, out) in done.items():
                    tokens[name], seconds[name] = tokens[name] + n, seconds[name] + dt
                    outs[name] += out
            for name in names:
                rates[(setting, name)].append(tokens[name] / seconds[name])
                outputs[(setting, name)] = outs[name]
    reference = outputs[("batch16", "target alone")]
    result = {**provenance(torch_threads=args.threads), "command": "python bench/adaptive_check.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "config": vars(args), "runs": {}}
    for (setting, name), values in rates.items():
        result["runs"][f"{setting} {name}"] = {
            "tokens_per_second_median": statistics.median(values), "tokens_per_second_all": values,
            "exact_vs_target_alone": sum(a == b for a, b in zip(outputs[(setting, name)], reference
                                                                if setting in ("batch16", "batch1")
                                                                else outputs[(setting, "target alone")])),
            "k_histogram": {str(k): v for k, v in sorted(contenders[(setting, name)].stats.k_histogram.items())},
            "acceptance_length": contenders[(setting, name)].stats.acceptance_length}
    runs = result["runs"]
    result["ratios"] = {
        "batch16 adaptive / target alone": runs["batch16 adaptive k<=5"]["tokens_per_second_median"]
        / runs["batch16 target alone"]["tokens_per_second_median"],
        "batch1 adaptive / fixed k=3": runs["batch1 adaptive k<=5"]["tokens_per_second_median"]
        / runs["batch1 fixed k=3"]["tokens_per_second_median"],
        "batch1 adaptive / target alone": runs["batch1 adaptive k<=5"]["tokens_per_second_median"]
        / runs["batch1 target alone"]["tokens_per_second_median"]}
    for b in extra:   # the goal: adaptive >= 0.95 x the better of the target alone and fixed k
        median = {name: runs[f"extra batch{b} {name}"]["tokens_per_second_median"]
                  for name in ("adaptive k<=5", "fixed k=3", "target alone")}
        result["ratios"][f"batch{b} adaptive / max(target alone, fixed k=3)"] = (
            median["adaptive k<=5"] / max(median["target alone"], median["fixed k=3"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": result["ratios"], **{k: round(v["tokens_per_second_median"], 1)
                                                      for k, v in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
