"""Where a SLEM step's time goes with the draft's whole head and with frequency-ranked heads (draft_vocab_size).

    python bench/slem_head_split.py --out bench/results/DATE-slem/head_split.json

mistral-target + qwen3-draft (151936-row head), vocab_mode "slem", greedy, fixed k, the first N GSM8K test
questions in one batch. Per head size: the engine's time split (draft / target / other seconds), AL and the
drafted tokens, over `--rounds` rounds that visit the head sizes in turn (the least time of each is kept: on a
shared machine other work only adds time). The draft seconds compare head sizes on the same proposals, which a
wall-clock tok/s ratio on a loaded machine cannot.
"""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.config import SamplingParams  # noqa: E402
from anydraft.eval import gsm8k  # noqa: E402
from anydraft.llm import LLM  # noqa: E402
from anydraft.metrics import SpecStats  # noqa: E402
from anydraft.provenance import git_commit, machine  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="full,8192,4096", help="draft head sizes ('full' = the whole head)")
    p.add_argument("--num-questions", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    data = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    prompts = [gsm8k.build_prompt(e["question"], []) for e in gsm8k.load_split(data)[:args.num_questions]]
    params = [SamplingParams(temperature=0, max_tokens=args.max_tokens)] * len(prompts)
    llms = {}
    for head in args.heads.split(","):
        spec = {"model": "qwen3-draft", "vocab_mode": "slem", "num_speculative_tokens": args.k, "adaptive": False}
        if head != "full":
            spec |= {"draft_vocab_size": int(head), "draft_vocab_corpus": str(CORPUS)}
        llms[head] = LLM(model="mistral-target", speculative_config=spec, max_num_seqs=len(prompts), device="cpu")
    results, texts = {}, {}
    for _ in range(args.rounds):
        for head, llm in llms.items():
            llm.engine.stats = SpecStats(num_speculative_tokens=args.k)   # this round's counts only
            outputs = llm.generate(prompts, params)
            texts.setdefault(head, [o.outputs[0].token_ids for o in outputs])
            stats = llm.stats.to_dict()
            best = results.get(head)
            if best is None or stats["wall_seconds"] < best["wall_seconds"]:
                results[head] = {**stats, "draft_head_rows": llm.draft_info["draft_head_rows"]}
    first = next(iter(texts.values()))
    report = {"date": datetime.now(timezone.utc).isoformat(),
              "git_commit": git_commit(), "machine": machine(), "torch_threads": torch.get_num_threads(),
              "command": "python bench/slem_head_split.py " + " ".join(sys.argv[1:]),
              "target": "mistral-target", "draft": "qwen3-draft", "k": args.k, "num_questions": len(prompts),
              "max_tokens": args.max_tokens, "rounds": args.rounds,
              "same_output_for_every_head": all(t == first for t in texts.values()), "heads": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for head, r in results.items():
        split = r["time_split_seconds"]
        print(f"head {head:>6} ({r['draft_head_rows']} rows): AL {r['acceptance_length']:.2f}, wall "
              f"{r['wall_seconds']:.2f}s, draft {split['draft']:.2f}s, target {split['target']:.2f}s, "
              f"other {split['other']:.2f}s")


if __name__ == "__main__":
    main()
