"""How many tokens a lossless draft can buy per target forward when the target samples: bounds from the distributions.

    python bench/acceptance_bound.py --target qwen3-target --draft smollm2-draft --temperature 0.7 \
        --out bench/results/DATE-acceptance/qwen3_smollm2_t07.json

The target writes each GSM8K prompt's continuation twice in float32 (greedy, and sampled at the temperature); at
every position the draft reads the same text in its own tokenization (TLI re-sync) and proposes within the
vocabularies' intersection, as TLI does. Per position this records:
- greedy: whether the draft's argmax is the target's (on the greedy continuation);
- rejection: 1 - TV(p, q), the probability that rejection sampling accepts the draft's sampled token. No scheme that
  proposes one token per position can be accepted more often (a coupling of p and q agrees with probability at most
  1 - TV), so it bounds every single-chain lossless draft, ours included;
- coupled: how often the draft's Gumbel-max with the target's noise equals the target's own draw (ours), and
  top-m: how often the target's draw is among the draft's m largest perturbed logits (a tree with m candidates there).
Expected tokens per target forward with k drafted (AL(k)) come from these along the continuations:
AL(k) at position t = sum_j prod_{i<j} a(t+i), j = 0..k. For greedy and rejection sampling that is the
expectation given the continuation (the accepted prefix is the target's own text); for trees it is the positional
model of Sequoia (ranks independent across depths), an estimate, not a bound.
Then the engine (bf16, batch 1, one prompt at a time) decodes the prompts with the target alone and with fixed
k = 1..5, greedy and sampled (seeded), the contenders taking turns step by step: seconds per target forward c(k) and
tok/s of each. A sampled step costs at least the greedy step with the same k (the same forwards, plus draws), so no
single-chain lossless draft samples faster than max over k of AL_rejection(k) / c_greedy(k) (k = 0: one token per
plain step): `sampled_bound_tokens_per_second`, set against the fastest greedy contender's measured tok/s.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.bench.acceptance_model import chain_lengths, tree_length  # noqa: E402
from anydraft.bench.interleave import step_interleaved  # noqa: E402
from anydraft.config import SamplingParams  # noqa: E402
from anydraft.eval import gsm8k  # noqa: E402
from anydraft.llm import LLM  # noqa: E402
from anydraft.model.loader import load_model, resolve_model_path  # noqa: E402
from anydraft.provenance import provenance  # noqa: E402
from anydraft.tokenizer import Tokenizer  # noqa: E402
from anydraft.vocab.bridge import VocabBridge  # noqa: E402

MAX_RANK = 4           # draft candidates per position looked at for trees
NOISE_DRAWS = 512      # Gumbel draws per position for the coupled rates
SUPPORT = 4096         # the coupled rates look at the union of p's and q's largest entries (the rest has ~no mass)
TREE_NODES = (5, 8, 16, 32, 64)


class Pair:
    def __init__(self, target: str, draft: str, temperature: float):
        cpu = torch.device("cpu")
        self.target, _ = load_model(target, torch.float32, cpu)
        self.draft, _ = load_model(draft, torch.float32, cpu)
        self.target_tokenizer = Tokenizer.from_dir(resolve_model_path(target))
        self.draft_tokenizer = Tokenizer.from_dir(resolve_model_path(draft))
        bridge = VocabBridge.build(self.target_tokenizer, self.draft_tokenizer,
                                   self.target.lm_head.weight.shape[0], self.draft.lm_head.weight.shape[0])
        self.draft_rows = bridge.pruned_draft_rows()                               # [N]
        self.draft_rows_target = (self.draft_rows if bridge.is_identity
                                  else bridge.draft_to_target[self.draft_rows])     # [N]
        self.temperature = temperature
        self.target_vocab = self.target.cfg.vocab_size

    @torch.no_grad()
    def continuation(self, prompt_ids: list[int], max_tokens: int, generator: torch.Generator | None) -> list[int]:
        """The target's own tokens (greedy when generator is None, else sampled at the temperature)."""
        ids = list(prompt_ids)
        eos = set(self.target_tokenizer.eos_token_ids)
        for _ in range(max_tokens):
            logits = self.target.lm_head(self.target(torch.tensor([ids]))[:, -1])[0, :self.target_vocab]
            if generator is None:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(logits.double() / self.temperature, -1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            ids.append(token)
            if token in eos:
                break
        return ids[len(prompt_ids):]

    @torch.no_grad()
    def positions(self, prompt_ids: list[int], output_ids: list[int], temperature: float | None,
                  generator: torch.Generator) -> dict[str, list[float]]:
        """Per output position: the draft's agreement with the target under each scheme."""
        ids = prompt_ids + output_ids
        hidden = self.target(torch.tensor([ids]))[0, len(prompt_ids) - 1:-1]
        target_logits = self.target.lm_head(hidden)[:, :self.target_vocab].double()     # [T, V_target]
        rows = {"greedy": [], "rejection": [], "coupled": [], **{f"top{m}": [] for m in range(2, MAX_RANK + 1)}}
        for t in range(len(output_ids)):
            text = self.target_tokenizer.decode(ids[:len(prompt_ids) + t], skip_special_tokens=False)
            draft_ids = self.draft_tokenizer.encode(text, add_special_tokens=False)
            draft_logits = self.draft.lm_head(self.draft(torch.tensor([draft_ids]))[:, -1])[0]
            draft_logits = draft_logits[self.draft_rows].double()                           # [N]
            if temperature is None:
                best = self.draft_rows_target[draft_logits.argmax()]
                rows["greedy"].append(float(best == target_logits[t].argmax()))
                continue
            p = torch.softmax(target_logits[t] / temperature, -1)                          # [V_target]
            q = torch.zeros_like(p).index_copy_(0, self.draft_rows_target,
                                                torch.softmax(draft_logits / temperature, -1))
            rows["rejection"].append(float(torch.minimum(p, q).sum()))
            support = torch.unique(torch.cat([p.topk(SUPPORT).indices, q.topk(min(SUPPORT, len(draft_logits))).indices]))
            noise = -torch.log(-torch.log(torch.rand(NOISE_DRAWS, len(support), dtype=torch.float64,
                                                     generator=generator)))
            target_draw = (p[support].log() + noise).argmax(-1)                              # [NOISE_DRAWS]
            ranked = (q[support].log() + noise).topk(MAX_RANK, dim=-1).indices               # [NOISE_DRAWS, R]
            hits = ranked == target_draw[:, None]
            rows["coupled"].append(float(hits[:, 0].double().mean()))
            for m in range(2, MAX_RANK + 1):
                rows[f"top{m}"].append(float(hits[:, :m].any(-1).double().mean()))
        return {name: values for name, values in rows.items() if values}


def step_costs(args, prompts: list[str]) -> dict[str, dict]:
    """Each contender's tok/s, target forwards and seconds per forward at batch 1 (target alone: k = 0; fixed k), the
    contenders of a group taking turns step by step, prompt by prompt, over --rounds rounds; each keeps its fastest
    round (other work on the machine only adds time). Groups of --engine-group LLMs, one group alive at a time:
    real-shaped LLMs do not all fit in memory."""
    names = [(mode, k) for mode in args.engine_modes.split(",") for k in range(6)]
    best: dict[tuple[str, int], dict] = {}
    for first in range(0, len(names), args.engine_group):
        best.update(group_costs(args, prompts, names[first:first + args.engine_group]))
        gc.collect()   # the group's LLMs are gone (nothing refers to them past group_costs) before the next loads
        print(f"measured {min(first + args.engine_group, len(names))} of {len(names)} contenders", flush=True)
    return {f"{mode} k={k}": value for (mode, k), value in best.items()}


def group_costs(args, prompts: list[str], group: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    llms = {(mode, k): LLM(args.engine_target or args.target,
                           None if k == 0 else {"model": args.engine_draft or args.draft,
                                                "num_speculative_tokens": k, "adaptive": False},
                           max_num_seqs=1, max_model_len=args.max_model_len) for mode, k in group}
    best: dict[tuple[str, int], dict] = {}
    for round_index in range(args.rounds):
        totals = {name: [0, 0.0, 0] for name in group}   # tokens, seconds, target forwards
        for i, prompt in enumerate(prompts):
            runs = {(mode, k): (llms[(mode, k)], [prompt], [SamplingParams(
                temperature=0.0 if mode == "greedy" else args.temperature, max_tokens=args.engine_max_tokens,
                seed=None if mode == "greedy" else i)]) for mode, k in group}
            forwards_before = {name: llms[name].stats.target_forwards for name in group}
            for name, (tokens, seconds, _) in step_interleaved(runs, turn=round_index + i).items():
                totals[name][0] += tokens
                totals[name][1] += seconds
                totals[name][2] += llms[name].stats.target_forwards - forwards_before[name]
        for name, (tokens, seconds, forwards) in totals.items():
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = {"tokens": tokens, "seconds": seconds, "target_forwards": forwards,
                              "tokens_per_second": tokens / seconds, "seconds_per_forward": seconds / forwards,
                              "al": tokens / forwards}
    return best


DISTRIBUTION_KEYS = ("target", "draft", "temperature", "num_prompts", "max_tokens", "positions",
                     "acceptance_per_position", "coupled_rank_acceptance", "al", "tree_al_estimate")


def distributions(args, questions: list[dict]) -> dict:
    """Per-position agreement of the pair along the target's own continuations, and what it gives per step (AL)."""
    pair = Pair(args.target, args.draft, args.temperature)
    generator = torch.Generator().manual_seed(args.seed)
    per_position: dict[str, list[float]] = {}
    greedy_tracks, sampled_tracks = [], []
    for number, question in enumerate(questions):
        prompt_ids = pair.target_tokenizer.encode(gsm8k.build_prompt(question["question"], [], None, False))
        greedy_ids = pair.continuation(prompt_ids, args.max_tokens, None)
        sampled_ids = pair.continuation(prompt_ids, args.max_tokens, generator)
        greedy = pair.positions(prompt_ids, greedy_ids, None, generator)
        sampled = pair.positions(prompt_ids, sampled_ids, args.temperature, generator)
        greedy_tracks.append(torch.tensor(greedy["greedy"]))
        sampled_tracks.append({name: torch.tensor(values) for name, values in sampled.items()})
        for name, values in {**greedy, **sampled}.items():
            per_position.setdefault(name, []).extend(values)
        print(f"prompt {number + 1}/{len(questions)}: " + ", ".join(
            f"{name} {sum(v) / len(v):.3f}" for name, v in per_position.items()), flush=True)

    def mean_length(tracks, k):   # each prompt's continuation weighted by its positions
        lengths = [(chain_lengths(track, k), len(track)) for track in tracks]
        return sum(length * n for length, n in lengths) / sum(n for _, n in lengths)

    ks = range(1, 6)
    al = {"greedy": {k: mean_length(greedy_tracks, k) for k in ks},
          "rejection": {k: mean_length([t["rejection"] for t in sampled_tracks], k) for k in ks},
          "coupled": {k: mean_length([t["coupled"] for t in sampled_tracks], k) for k in ks}}
    rates = {name: sum(values) / len(values) for name, values in per_position.items()}
    rank_accept = [rates["coupled"]] + [rates[f"top{m}"] - rates[f"top{m - 1}" if m > 2 else "coupled"]
                                        for m in range(2, MAX_RANK + 1)]
    return {"target": args.target, "draft": args.draft, "temperature": args.temperature,
            "num_prompts": len(questions), "max_tokens": args.max_tokens,
            "positions": {"greedy": len(per_position["greedy"]), "sampled": len(per_position["rejection"])},
            "acceptance_per_position": rates, "coupled_rank_acceptance": rank_accept,
            "al": {name: {str(k): v for k, v in values.items()} for name, values in al.items()},
            "tree_al_estimate": {str(n): tree_length(rank_accept, n) for n in TREE_NODES}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen3-target")
    parser.add_argument("--draft", default="smollm2-draft")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the engine's step costs")
    parser.add_argument("--engine-target", default=None,
                        help="the engine's target for the step costs (default --target): a grown checkpoint of the "
                             "same function, e.g. qwen3-target@qwen3-1.7b, computes the same distributions")
    parser.add_argument("--engine-draft", default=None, help="the engine's draft (default --draft)")
    parser.add_argument("--engine-modes", default="greedy,sampled",
                        help="greedy is needed for the bound; sampled adds the measured sampled tok/s")
    parser.add_argument("--engine-group", type=int, default=12, help="LLMs alive (and interleaved) at a time")
    parser.add_argument("--engine-prompts", type=int, default=None, help="prompts the engine decodes (default all)")
    parser.add_argument("--engine-max-tokens", type=int, default=None, help="default --max-tokens")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--distributions-from", type=Path, default=None,
                        help="an earlier JSON of this script on the same pair (or the small pair a grown one was "
                             "grown from: the same function): its per-position rates and ALs, not measured again")
    parser.add_argument("--data", default=None, help="GSM8K directory (default ../shared/data/gsm8k)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.temperature <= 0:
        parser.error("--temperature must be > 0 (the greedy side is always measured)")

    questions = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[:args.num_prompts]
    if args.distributions_from is None:
        result = {"provenance": provenance(command=" ".join(sys.argv)), **distributions(args, questions)}
    else:   # the same pair's function (a grown checkpoint's), measured by an earlier run
        earlier = json.loads(args.distributions_from.read_text())
        for key in ("target", "draft", "temperature", "num_prompts", "max_tokens"):
            if earlier[key] != getattr(args, key):
                parser.error(f"--distributions-from: its {key} is {earlier[key]!r}, this run's {getattr(args, key)!r}")
        result = {"provenance": provenance(command=" ".join(sys.argv), distributions_from=str(args.distributions_from)),
                  **{key: earlier[key] for key in DISTRIBUTION_KEYS}}
    al = {name: {int(k): v for k, v in values.items()} for name, values in result["al"].items()}
    args.engine_max_tokens = args.engine_max_tokens or args.max_tokens
    engine = step_costs(args, [gsm8k.build_prompt(q["question"], [], None, False)
                               for q in questions[:args.engine_prompts]])
    cost = {k: engine[f"greedy k={k}"]["seconds_per_forward"] for k in range(6)}

    def at_greedy_cost(scheme: str) -> dict[int, float]:   # tok/s if a step cost what the greedy step does
        return {k: (1.0 if k == 0 else al[scheme][k]) / cost[k] for k in range(6)}
    bound, coupled = at_greedy_cost("rejection"), at_greedy_cost("coupled")
    greedy_best = max(engine[f"greedy k={k}"]["tokens_per_second"] for k in range(6))
    sampled = [engine[f"sampled k={k}"]["tokens_per_second"] for k in range(6) if f"sampled k={k}" in engine]
    result.update({
        "engine_target": args.engine_target or args.target, "engine_draft": args.engine_draft or args.draft,
        "engine": engine,
        "sampled_bound_tokens_per_second": {str(k): v for k, v in bound.items()},
        "coupled_at_greedy_cost_tokens_per_second": {str(k): v for k, v in coupled.items()},
        "greedy_best_tokens_per_second": greedy_best,
        "sampled_best_tokens_per_second": max(sampled) if sampled else None,
        "sampled_over_greedy_measured": max(sampled) / greedy_best if sampled else None,
        "sampled_over_greedy_bound": max(bound.values()) / greedy_best,
        "coupled_at_greedy_cost_over_greedy": max(coupled.values()) / greedy_best,
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("acceptance_per_position", "al", "tree_al_estimate",
                                                   "sampled_bound_tokens_per_second", "sampled_over_greedy_measured",
                                                   "sampled_over_greedy_bound",
                                                   "coupled_at_greedy_cost_over_greedy")}, indent=1))


if __name__ == "__main__":
    main()
