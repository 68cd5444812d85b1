"""Sampled decoding against greedy decoding, in one process, interleaved (issue: sampling at the speed of greedy).

For the target alone and TLI (the shipped pair, default speculative settings: num_speculative_tokens 5, adaptive),
at batch 1 (one prompt at a time) and batch 16 (all prompts together): tok/s greedy, at temperature 0.7 ("sampled")
and with Qwen3's recommended T 0.6, top-p 0.95, top-k 20 ("truncated"; --modes nucleus adds T 0.7, top-p 0.9 alone;
each sampled request seeded), medians of --repeats rounds after a warm-up. Each (contender, batch, mode) has its own
LLM, so adaptive speculation learns the costs of one kind of traffic. The headline is sampled (and truncated) /
greedy tok/s of the same contender and batch, a ratio from one schedule. In a round, the LLMs of a batch size decode
the same group of prompts (one prompt at batch 1, all 16 at batch 16) taking turns step by step
(anydraft/bench/interleave.py), each timed over its own steps, so the machine's drift hits all alike. Every
request's tokens are compared with the target alone's (`tli_equals_target_alone`): greedy is lossless, and with
coupled draws (every mode on a native head) a seeded request samples the target alone's tokens (where both run).
`--contenders TLI` (or `"target alone"`) runs one of them: a real-shaped pair's `LLM`s hold several GB each.

    python bench/sampling_speed.py --out bench/results/<date>-sampling/speed.json
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
from anydraft.metrics import SpecStats
from anydraft.model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from anydraft.provenance import provenance

# mode -> SamplingParams settings; "truncated" is Qwen3's recommended sampling (a top-k and a top-p cut)
MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.7},
         "truncated": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}, "nucleus": {"temperature": 0.7, "top_p": 0.9}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=None)
    parser.add_argument("--modes", default="greedy,sampled,truncated",
                        help="comma list of greedy, sampled, truncated, nucleus (top-p alone); greedy always runs: "
                             "the ratios' base")
    parser.add_argument("--contenders", default="target alone,TLI",
                        help="comma list of 'target alone' and 'TLI' (each costs an LLM per batch size and mode)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    modes = ["greedy"] + [m for m in args.modes.split(",") if m != "greedy"]
    if unknown := set(modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}; choose among {', '.join(MODES)}")
    torch.set_num_threads(args.threads)
    questions = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[:args.num_prompts]
    prompts = [gsm8k.build_prompt(q["question"], [], None, False) for q in questions]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    available = {"target alone": None, "TLI": {"model": args.draft}}
    chosen = [name.strip() for name in args.contenders.split(",")]
    if not chosen or set(chosen) - set(available):
        parser.error(f"--contenders: choose among {', '.join(available)}, comma-separated; got {args.contenders!r}")
    contenders = {name: available[name] for name in available if name in chosen}

    plan = [(name, batch, mode) for name in contenders for batch in batch_sizes for mode in modes]
    llms = {(name, batch, mode): LLM(args.target, spec, max_num_seqs=batch)
            for name, spec in contenders.items() for batch in batch_sizes for mode in modes}

    def params(mode: str, round_index: int) -> list[SamplingParams]:
        # A fresh seed per request and round: every round samples new text, as served traffic would.
        return [SamplingParams(**MODES[mode], max_tokens=args.max_tokens,
                               seed=None if mode == "greedy" else 1000 * round_index + i)
                for i in range(len(prompts))]

    # (batch, mode) -> [prompts where TLI's tokens equal the target alone's, prompts]: greedy is lossless, and a
    # seeded sampled request draws each token with its position's noise (sampling.draw_keys), so it must match too.
    matches = {(batch, mode): [0, 0] for batch in batch_sizes for mode in modes}

    def run_round(round_index: int, rows: slice | None = None) -> dict[tuple, tuple[int, float]]:
        """Every contender of a batch size decodes the same groups of prompts, taking turns step by step."""
        done = {}
        for batch in batch_sizes:
            keys = [key for key in plan if key[1] == batch]
            group_prompts = prompts[rows] if rows else prompts
            totals = {key: (0, 0.0) for key in keys}
            for i in range(0, len(group_prompts), batch):
                runs = {key: (llms[key], group_prompts[i:i + batch], params(key[2], round_index)[i:i + batch])
                        for key in keys}
                outcome = step_interleaved(runs, turn=round_index + i)
                for key, (n, seconds, _) in outcome.items():
                    totals[key] = (totals[key][0] + n, totals[key][1] + seconds)
                for mode in modes if len(contenders) == 2 else []:
                    pairs = list(zip(outcome[("TLI", batch, mode)][2], outcome[("target alone", batch, mode)][2]))
                    matches[(batch, mode)][0] += sum(a == b for a, b in pairs)
                    matches[(batch, mode)][1] += len(pairs)
            done.update(totals)
        return done

    run_round(0, slice(0, max(batch_sizes)))   # warm-up (and adaptive's first cost observations)
    for llm in llms.values():
        llm.engine.stats = SpecStats(llm.engine.k)   # count only the measured rounds
    rates: dict[tuple, list[float]] = {key: [] for key in plan}
    tokens: dict[tuple, int] = {key: 0 for key in plan}
    for repeat in range(args.repeats):
        for key, (n, seconds) in run_round(repeat + 1).items():
            rates[key].append(n / seconds)
            tokens[key] += n
            print(f"round {repeat}: {key[0]} batch {key[1]} {key[2]}: {n / seconds:.1f} tok/s", flush=True)

    result = {**provenance(llms[plan[-1]], torch_threads=args.threads),
              "command": "python bench/sampling_speed.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
              "config": {**vars(args), "modes": MODES, "speculative_config": available["TLI"]},
              "runs": {}, "ratios": {},
              "tli_equals_target_alone": {f"batch {b} {m}": f"{same}/{total}" for (b, m), (same, total)
                                          in matches.items()}}
    for key, values in rates.items():
        stats = llms[key].stats
        result["runs"][" ".join(map(str, key))] = {
            "contender": key[0], "batch": key[1], "mode": key[2], **MODES[key[2]],
            "tokens_per_second_median": statistics.median(values), "tokens_per_second_all": values,
            "tokens": tokens[key], "acceptance_length": stats.acceptance_length,
            "k_histogram": {str(k): v for k, v in sorted(getattr(stats, "k_histogram", {}).items())},
            "seconds_split": {"draft": stats.draft_seconds, "target": stats.target_seconds,
                              "other": stats.other_seconds}}
    for name in contenders:
        for batch in batch_sizes:
            for mode in modes[1:]:
                per_round = [s / g for s, g in zip(rates[(name, batch, mode)], rates[(name, batch, "greedy")])]
                result["ratios"][f"{name} batch {batch} {mode} / greedy"] = {
                    "median_of_medians": statistics.median(rates[(name, batch, mode)])
                    / statistics.median(rates[(name, batch, "greedy")]),
                    "per_round": per_round}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": {k: round(v["median_of_medians"], 3) for k, v in result["ratios"].items()},
                      "tok/s": {k: round(v["tokens_per_second_median"], 1) for k, v in result["runs"].items()},
                      "AL": {k: round(v["acceptance_length"], 3) for k, v in result["runs"].items()
                             if v["contender"] != "target alone"},
                      "TLI = target alone": result["tli_equals_target_alone"]}, indent=1))


if __name__ == "__main__":
    main()
