"""The speculation policy's goals, side by side: adaptive (the default) against the target alone and fixed k = 3.

Cells: {pair} x {batch 1, batch 16} x {greedy, T 0.7}. In each cell the three LLMs decode the same held-out GSM8K test
prompts (the last --num-prompts of test.jsonl, which no other bench uses), taking turns step by step
(anydraft.bench.interleave), for --repeats rounds after a warm-up; each contender's tok/s is the median over rounds.
Sampled requests are seeded per prompt and round, the same seeds for every contender.

Goals (exit 0 only when all hold for the pairs run):
- adaptive >= 0.95x max(target alone, fixed k = 3) in every cell;
- adaptive >= 1.10x the target alone at batch 1 greedy;
- greedy outputs identical to the target alone's in every greedy cell, where the target runs the native kernels (the
  condition of bf16 exactness, docs/guarantees.md); on the PyTorch path the exact counts are reported, not judged.

    python bench/policy_check.py --json --out bench/results/<date>-policy/check.json
    python bench/policy_check.py --pairs grown --json     # the grown qwen3-1.7b + smollm2-135m pair
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
from anydraft.provenance import provenance

PAIRS = {"shipped": ("qwen3-target", "smollm2-draft"),
         "grown": ("qwen3-target@qwen3-1.7b", "smollm2-draft@smollm2-135m")}
CONTENDERS = ("adaptive", "fixed k=3", "target alone")
MIN_RATIO, MIN_B1_GREEDY_GAIN = 0.95, 1.10


def make(name: str, target: str, draft: str, batch: int, args) -> LLM:
    spec = {"adaptive": {"model": draft}, "fixed k=3": {"model": draft, "num_speculative_tokens": 3,
                                                       "adaptive": False}, "target alone": None}[name]
    return LLM(target, spec, max_num_seqs=batch, max_model_len=args.max_model_len,
               **({"kv_cache_memory": args.kv_cache_memory} if args.kv_cache_memory else {}))


def run_cell(llms: dict[str, LLM], prompts: list[str], batch: int, temperature: float, args) -> dict:
    def params(first: int, n: int, repeat: int) -> list[SamplingParams]:
        return [SamplingParams(temperature=temperature, max_tokens=args.max_tokens,
                               seed=None if temperature == 0 else 1000 * repeat + first + i) for i in range(n)]
    step_interleaved({name: (llm, prompts[:batch], params(0, batch, -1)) for name, llm in llms.items()})   # warm-up
    rates = {name: [] for name in llms}
    outputs = {}
    for repeat in range(args.repeats):
        tokens, seconds, outs = dict.fromkeys(llms, 0), dict.fromkeys(llms, 0.0), {name: [] for name in llms}
        for i in range(0, len(prompts), batch):
            group = prompts[i:i + batch]
            done = step_interleaved({name: (llm, group, params(i, len(group), repeat)) for name, llm in llms.items()},
                                    turn=repeat + i)
            for name, (n, dt, out) in done.items():
                tokens[name] += n
                seconds[name] += dt
                outs[name] += out
        for name in llms:
            rates[name].append(tokens[name] / seconds[name])
        outputs[repeat] = outs
    median = {name: statistics.median(values) for name, values in rates.items()}
    exact = {name: sum(a == b for r in outputs for a, b in zip(outputs[r][name], outputs[r]["target alone"]))
             for name in llms}
    return {"tokens_per_second_median": median, "tokens_per_second_all": rates,
            "exact_vs_target_alone": exact, "outputs_compared": len(prompts) * args.repeats,
            "ratio_vs_best_rival": median["adaptive"] / max(median["fixed k=3"], median["target alone"]),
            "ratio_vs_target_alone": median["adaptive"] / median["target alone"],
            "adaptive_k_histogram": {str(k): v for k, v in sorted(llms["adaptive"].stats.k_histogram.items())},
            "adaptive_beliefs": llms["adaptive"].engine.policy.beliefs(),
            "kernels": llms["adaptive"].kernels,
            # bf16-exact: native body, and a native head, screened ("native") or full logits ("native logits: ...")
            "native": all(llm.kernels["target"].get(part, "").startswith("native") for llm in llms.values()
                          for part in ("body", "head"))}


def goals(cells: dict) -> dict[str, bool]:
    met = {}
    for name, cell in cells.items():
        met[f"{name}: adaptive >= {MIN_RATIO}x best rival"] = cell["ratio_vs_best_rival"] >= MIN_RATIO
        if "batch1 greedy" in name:
            met[f"{name}: adaptive >= {MIN_B1_GREEDY_GAIN}x target alone"] = (
                cell["ratio_vs_target_alone"] >= MIN_B1_GREEDY_GAIN)
        if "greedy" in name and cell["native"]:
            met[f"{name}: greedy outputs identical"] = all(
                n == cell["outputs_compared"] for n in cell["exact_vs_target_alone"].values())
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="shipped,grown", help="comma list of: " + ", ".join(PAIRS))
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-cache-memory", default=None, help="each LLM's KV budget (e.g. 1GiB for the grown pair)")
    parser.add_argument("--data", default=None)
    parser.add_argument("--json", action="store_true", help="print the result as JSON (else a table)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    questions = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[-args.num_prompts:]
    prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    cells = {}
    for pair in args.pairs.split(","):
        target, draft = PAIRS[pair]
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            llms = {name: make(name, target, draft, batch, args) for name in CONTENDERS}
            for temperature in (float(t) for t in args.temperatures.split(",")):
                for llm in llms.values():   # each cell's histogram and counts its own
                    llm.engine.stats = type(llm.stats)(llm.engine.k)
                mode = "greedy" if temperature == 0 else f"T{temperature}"
                cells[f"{pair} batch{batch} {mode}"] = run_cell(llms, prompts, batch, temperature, args)
                print(f"{pair} batch{batch} {mode}: " + ", ".join(
                    f"{n} {v:.1f}" for n, v in cells[f"{pair} batch{batch} {mode}"]["tokens_per_second_median"].items())
                    + " tok/s", file=sys.stderr, flush=True)
            del llms
    met = goals(cells)
    result = {**provenance(torch_threads=args.threads), "command": shlex.join(["python"] + sys.argv),
              "config": vars(args), "cells": cells, "goals": met, "all_goals_met": all(met.values())}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{'cell':28} {'adaptive':>9} {'k=3':>9} {'alone':>9} {'vs best':>8} {'vs alone':>8}  exact")
        for name, cell in cells.items():
            tps = cell["tokens_per_second_median"]
            print(f"{name:28} {tps['adaptive']:9.1f} {tps['fixed k=3']:9.1f} {tps['target alone']:9.1f} "
                  f"{cell['ratio_vs_best_rival']:8.3f} {cell['ratio_vs_target_alone']:8.3f}  "
                  f"{cell['exact_vs_target_alone']['adaptive']}/{cell['outputs_compared']}")
        for goal, ok in met.items():
            print(("met     " if ok else "NOT MET ") + goal)
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
