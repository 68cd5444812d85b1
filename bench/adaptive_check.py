"""Adaptive speculation against its two baselines, in one process, interleaved (issue: throughput under load).

Batch 16: LLM with the draft and default settings (num_speculative_tokens 5, adaptive) vs LLM with the target alone,
16 GSM8K test prompts decoded together. Batch 1: the same settings vs {"num_speculative_tokens": 3, "adaptive":
False} (and the target alone, for context), one prompt at a time; each setting has its own LLM. Greedy (or
--temperature T, each request seeded), max 128 tokens, medians of --repeats rounds after a warm-up; within a round
the contenders of a batch size decode the same group of prompts (all 16 at batch 16, each prompt at batch 1) taking
turns step by step, in rotating order, each timed over its own steps. Outputs are checked equal across the
contenders (greedy is lossless; a seeded sample with coupled draws is the target alone's, token for token).
--control adds a second target-alone LLM at batch 16: two identical contenders, whose ratio shows how far this
machine moves the must-show's ratio by itself. --balanced also adds a second adaptive LLM, created last: the four
are created adaptive, target alone, target alone, adaptive (ABBA), and each setting's tok/s in a round is its two
LLMs' tokens over their seconds. In one process the LLMs created later decode faster (five target-alone LLMs created
in turn: the first 0.986x the second, the last 1.01x), so with one LLM each the setting created first is handicapped
by the order alone; the first pair's ratio (the unbalanced statistic) is reported beside it. `ratios` compares the
contenders' median tok/s (the must-show's statistic); `paired_ratios` the median of the rounds' own ratios.

    python bench/adaptive_check.py --out bench/results/<date>-adaptive/check.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
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
                        help="comma list: also adaptive vs the fixed k (--fixed-ks) vs the target alone at these batch sizes, each on "
                             "max(B, --num-prompts) prompts decoded B at a time (the goals' batch 4 and 64)")
    parser.add_argument("--fixed-ks", default="3",
                        help="comma list: the fixed k contenders at the extra batch sizes (the goal's best fixed k)")
    parser.add_argument("--must-show", action=argparse.BooleanOptionalAction, default=True,
                        help="run the must-show's batch 16 and batch 1 groups (--no-must-show: the extra sizes only)")
    parser.add_argument("--target-alone", action=argparse.BooleanOptionalAction, default=True,
                        help="a target-alone contender at the extra sizes (--no-target-alone: one LLM fewer, where a "
                             "real-shaped pair's LLMs do not all fit in memory; adaptive is then checked against the "
                             "fixed k of this run and the target alone of another)")
    parser.add_argument("--balanced", action="store_true",
                        help="batch 16 with two LLMs of each setting, created adaptive, target alone, target alone, "
                             "adaptive; each setting's tok/s pools its two (implies --control)")
    parser.add_argument("--control", action="store_true",
                        help="a second target-alone LLM at batch 16, interleaved as the others: its ratio to the first "
                             "is this run's noise floor for the must-show's ratio (two identical contenders)")
    parser.add_argument("--max-model-len", type=int, default=2048,
                        help="each LLM's; a real-shaped target's KV cache at batch 64 needs it small on 24 GiB")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 = greedy (the goals'); above 0 each request is seeded (prompt and round), the same "
                             "seeds for every contender: with coupled draws their tokens must still be equal")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    extra = [int(b) for b in args.extra_batch_sizes.split(",") if b]
    fixed = [f"fixed k={k}" for k in args.fixed_ks.split(",") if k]
    if extra and not fixed and not args.target_alone:
        parser.error("the extra batch sizes need a rival: give --fixed-ks or drop --no-target-alone")
    if not extra and not args.must_show:
        parser.error("--no-must-show leaves nothing to run: give --extra-batch-sizes")
    questions = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[:max([args.num_prompts] + extra)]
    all_prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    prompts = all_prompts[:args.num_prompts]

    def params(first: int, n: int, repeat: int) -> list[SamplingParams]:   # prompts first .. first + n - 1
        return [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                               seed=None if args.temperature == 0 else 1000 * repeat + first + i) for i in range(n)]
    batch = len(prompts)
    # One LLM per (setting, contender): adaptive learns its costs at the batch size it serves, and each k
    # histogram counts only its own setting's steps.
    def make(name: str, b: int) -> LLM:
        if name.startswith("fixed k="):
            speculative = {"model": args.draft, "num_speculative_tokens": int(name[8:]), "adaptive": False}
        else:
            speculative = {"target alone": None, "target alone (control)": None,
                           "adaptive k<=5": {"model": args.draft}, "adaptive k<=5 (second)": {"model": args.draft}}[name]
        return LLM(args.target, speculative, max_num_seqs=b, max_model_len=args.max_model_len)

    args.control = args.control or args.balanced
    control = ["target alone (control)"] if args.control else []
    second = ["adaptive k<=5 (second)"] if args.balanced else []
    groups = [("batch16", ["adaptive k<=5", "target alone", *control, *second], batch),
              ("batch1", ["adaptive k<=5", "fixed k=3", "target alone"], 1)] if args.must_show else []
    alone = ["target alone"] if args.target_alone else []
    groups += [(f"extra batch{b}", ["adaptive k<=5", *fixed, *alone], b) for b in extra]
    group_prompts = {setting: all_prompts[:max(b, args.num_prompts)] if setting.startswith("extra") else prompts
                     for setting, _, b in groups}
    contenders = {(setting, name): make(name, b) for setting, names, b in groups for name in names}
    for setting, names, b in groups:   # warm-up
        step_interleaved({name: (contenders[(setting, name)], group_prompts[setting][:b], params(0, b, -1))
                          for name in names})
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in contenders}
    round_totals: dict[tuple[str, str], list[tuple[int, float]]] = {key: [] for key in contenders}   # (tokens, s)
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
                done = step_interleaved({name: (contenders[(setting, name)], group, params(i, len(group), repeat))
                                         for name in names}, turn=repeat + i)
                for name, (n, dt, out) in done.items():
                    tokens[name], seconds[name] = tokens[name] + n, seconds[name] + dt
                    outs[name] += out
            for name in names:
                rates[(setting, name)].append(tokens[name] / seconds[name])
                round_totals[(setting, name)].append((tokens[name], seconds[name]))
                outputs[(setting, name)] = outs[name]
    reference = outputs.get(("batch16", "target alone"))
    result = {**provenance(torch_threads=args.threads), "command": shlex.join(["python"] + sys.argv),
              "config": vars(args), "runs": {}}
    for (setting, name), values in rates.items():
        # Greedy is lossless, and so are seeded coupled draws token for token: every contender's outputs equal the
        # target alone's (else the first fixed k's, checked against the target alone in other runs).
        group_reference = "target alone" if args.target_alone or not setting.startswith("extra") else fixed[0]
        result["runs"][f"{setting} {name}"] = {
            "tokens_per_second_median": statistics.median(values), "tokens_per_second_all": values,
            f"exact_vs_{group_reference.replace(' ', '_')}": sum(
                a == b for a, b in zip(outputs[(setting, name)], reference if setting in ("batch16", "batch1")
                                       else outputs[(setting, group_reference)])),
            "k_histogram": {str(k): v for k, v in sorted(contenders[(setting, name)].stats.k_histogram.items())},
            "acceptance_length": contenders[(setting, name)].stats.acceptance_length}
    runs = result["runs"]
    # the must-show's two contenders at batch 16: one LLM each, or (balanced) each setting's pooled pair
    must_show = {"adaptive": "batch16 adaptive k<=5", "alone": "batch16 target alone"}
    if args.must_show and args.balanced:   # each setting's two LLMs pooled, round by round
        for side, name, pair in (("adaptive", "adaptive k<=5", ("adaptive k<=5", "adaptive k<=5 (second)")),
                                 ("alone", "target alone", ("target alone", "target alone (control)"))):
            pooled = [sum(t for t, _ in both) / sum(s for _, s in both)
                      for both in zip(*(round_totals[("batch16", llm)] for llm in pair))]
            runs[f"batch16 {name} (pooled)"] = {"llms": list(pair), "tokens_per_second_median": statistics.median(pooled),
                                               "tokens_per_second_all": pooled}
            must_show[side] = f"batch16 {name} (pooled)"
    result["ratios"] = {
        "batch16 adaptive / target alone": runs[must_show["adaptive"]]["tokens_per_second_median"]
        / runs[must_show["alone"]]["tokens_per_second_median"],
        "batch1 adaptive / fixed k=3": runs["batch1 adaptive k<=5"]["tokens_per_second_median"]
        / runs["batch1 fixed k=3"]["tokens_per_second_median"],
        "batch1 adaptive / target alone": runs["batch1 adaptive k<=5"]["tokens_per_second_median"]
        / runs["batch1 target alone"]["tokens_per_second_median"]} if args.must_show else {}
    if args.must_show and args.control:
        result["ratios"]["batch16 control / target alone"] = (
            runs["batch16 target alone (control)"]["tokens_per_second_median"]
            / runs["batch16 target alone"]["tokens_per_second_median"])
    if args.must_show and args.balanced:   # the unbalanced statistic (one LLM each), and two identical adaptive LLMs
        result["ratios"]["batch16 adaptive / target alone (first created of each)"] = (
            runs["batch16 adaptive k<=5"]["tokens_per_second_median"]
            / runs["batch16 target alone"]["tokens_per_second_median"])
        result["ratios"]["batch16 adaptive created last / adaptive created first"] = (
            runs["batch16 adaptive k<=5 (second)"]["tokens_per_second_median"]
            / runs["batch16 adaptive k<=5"]["tokens_per_second_median"])
    # The same ratios paired by round (the median over rounds of each round's ratio): rounds share the machine's
    # state of the moment, while each contender's median round may come from another round.
    result["paired_ratios"] = {}
    for name, (numerator, denominator) in {
            "batch16 adaptive / target alone": (must_show["adaptive"], must_show["alone"]),
            "batch16 control / target alone": ("batch16 target alone (control)", "batch16 target alone"),
            "batch1 adaptive / fixed k=3": ("batch1 adaptive k<=5", "batch1 fixed k=3")}.items():
        if numerator in runs and denominator in runs:
            rounds = zip(runs[numerator]["tokens_per_second_all"], runs[denominator]["tokens_per_second_all"])
            result["paired_ratios"][name] = statistics.median(a / b for a, b in rounds)
    rivals = [*fixed, *alone]
    for b in extra:   # the goal: adaptive >= 0.95 x the better of the target alone and the fixed k
        median = {name: runs[f"extra batch{b} {name}"]["tokens_per_second_median"]
                  for name in ("adaptive k<=5", *rivals)}
        result["ratios"][f"batch{b} adaptive / max({', '.join(rivals)})"] = (
            median["adaptive k<=5"] / max(median[name] for name in rivals))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": result["ratios"], "paired_ratios": result["paired_ratios"],
                      **{k: round(v["tokens_per_second_median"], 1)
                                                      for k, v in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
