"""Per-position acceptance under sampling, by how the draft proposes and how it is verified, on held-out prompts.

    python bench/sampled_acceptance_bound.py --target qwen3-target --draft smollm2-draft --temperature 0.7 --json

Along the target's own sampled continuations of GSM8K test prompts, at every position where the draft (reading as
re-sync feeds it) and the target share a text boundary (anydraft/distill/objective.py):
- `sampled_drafting`: sum_x min(p, q) = 1 - TV, a draft token drawn from q and verified with q (anydraft's engine);
- `greedy_one_hot`: p(argmax q), a greedy draft token verified as a one-hot proposal (vLLM custom_class proposers:
  vLLM 0.32 has no way for them to hand over q);
- `best_one_hot`: max p, the most any deterministic drafter verified one-hot can reach.
With per-position acceptance a, fixed k gives AL at most 1 + a + ... + a^k when positions are independent
(`al_k`): the bound the AL of each path is compared with.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anydraft.distill.objective import acceptance, one_hot_acceptance  # noqa: E402
from anydraft.distill.trainer import DistillConfig, Distiller  # noqa: E402
from anydraft.provenance import provenance  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen3-target")
    p.add_argument("--draft", default="smollm2-draft")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--num-prompts", type=int, default=32, help="GSM8K test prompts (held out from every training)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        # Distiller's data path: the test file's first prompt is its (unused) training prompt, the last N held out.
        distiller = Distiller(DistillConfig(args.target, args.draft, args.data, out, temperature=args.temperature,
                                            num_prompts=1, held_out=args.num_prompts, max_tokens=args.max_tokens))
        distiller.prepare()
    sums = {"sampled_drafting": 0.0, "greedy_one_hot": 0.0, "best_one_hot": 0.0}
    positions = 0
    with torch.no_grad():
        for example in distiller.held_out:
            target_probs = distiller.target_probs_at(example)            # [M, N]
            log_q = distiller.proposal_log_probs_at(example)             # [M, N]
            sums["sampled_drafting"] += acceptance(target_probs, log_q).sum().item()
            sums["greedy_one_hot"] += one_hot_acceptance(target_probs, log_q).sum().item()
            sums["best_one_hot"] += target_probs.max(dim=-1).values.sum().item()
            positions += len(target_probs)
    rates = {name: total / positions for name, total in sums.items()}
    report = {"target": args.target, "draft": args.draft, "temperature": args.temperature, "positions": positions,
              "acceptance": rates, "al_k": {name: sum(a ** i for i in range(args.k + 1)) for name, a in rates.items()},
              "k": args.k, "provenance": provenance(), "command": " ".join(["python", *sys.argv])}
    print(json.dumps(report, indent=1) if args.json else
          "\n".join(f"{n:18s} acceptance {a:.3f}  AL(k={args.k}) <= {report['al_k'][n]:.2f}" for n, a in rates.items()))
    return report


if __name__ == "__main__":
    main()
