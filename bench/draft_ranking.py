"""Drafts for one target ranked by measured speedup, interleaved, to set next to `anydraft advise`'s ranking.

    python bench/draft_ranking.py --target qwen3-target --drafts smollm2-draft,mistral-draft,qwen3-draft \
        --out bench/results/DATE-crossfamily/ranking_qwen3-target.json

Greedy, bf16, batch 1, adaptive speculation (the default), vocab_mode auto with the GSM8K train corpus (the
mode and head advise assumes); `--modes tli,slem` runs each draft in both modes instead (SLEM with its head cut
to --slem-head rows, as auto cuts it), to see whether auto picked the faster. Every round decodes the first N GSM8K test questions with the target alone and
with each draft in turn, in one process; each configuration keeps its least wall time over the rounds (on a
shared machine other work only adds time), so the ratios compare the configurations under the same load,
which separate `eval --compare-target` runs cannot.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.config import SamplingParams  # noqa: E402
from anydraft.eval import gsm8k  # noqa: E402
from anydraft.llm import LLM  # noqa: E402
from anydraft.provenance import git_commit, machine  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafts", required=True, help="comma-separated draft names")
    p.add_argument("--num-questions", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="auto",
                   help="comma list of vocab modes to run each draft in: auto (with the GSM8K train corpus, as advise "
                        "assumes), tli, slem (its head cut to --slem-head rows ranked on that corpus)")
    p.add_argument("--slem-head", type=int, default=8192)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    modes = args.modes.split(",")
    if set(modes) - {"auto", "tli", "slem"}:
        p.error(f"--modes takes auto, tli and slem, got {args.modes}")
    data = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    prompts = [gsm8k.build_prompt(e["question"], []) for e in gsm8k.load_split(data)[:args.num_questions]]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, stop=gsm8k.STOP_STRINGS)
    llms = {"target alone": LLM(model=args.target, max_num_seqs=1, device="cpu")}
    options = {"auto": {"vocab_mode": "auto", "vocab_mode_corpus": str(CORPUS)}, "tli": {"vocab_mode": "tli"},
               "slem": {"vocab_mode": "slem", "draft_vocab_size": args.slem_head, "draft_vocab_corpus": str(CORPUS)}}
    for draft in args.drafts.split(","):
        for mode in modes:
            name = draft if modes == ["auto"] else f"{draft} ({mode})"
            llms[name] = LLM(model=args.target, max_num_seqs=1, device="cpu",
                             speculative_config={"model": draft, **options[mode]})
    best, texts, accepted = {}, {}, {}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            start = time.perf_counter()
            outputs = [llm.generate([prompt], params)[0] for prompt in prompts]   # batch 1
            seconds = time.perf_counter() - start
            best[name] = min(best.get(name, seconds), seconds)
            texts[name] = [o.outputs[0].token_ids for o in outputs]
            accepted.setdefault(name, []).extend(o.metrics.get("num_accepted", 0) for o in outputs)
    reference = texts["target alone"]
    tokens = sum(len(t) for t in reference)
    results = {}
    for name, llm in llms.items():
        stats = llm.stats.to_dict()
        results[name] = {"seconds_least": round(best[name], 4), "tokens_per_second": round(tokens / best[name], 2),
                         "speedup": round(best["target alone"] / best[name], 4),
                         "acceptance_length": stats["acceptance_length"], "k_histogram": stats["k_histogram"],
                         "exact_matches": sum(a == b for a, b in zip(texts[name], reference)),
                         "vocab_mode": llm.draft_info.get("vocab_mode") if llm.draft_info else None,
                         "draft_head_rows": llm.draft_info.get("draft_head_rows") if llm.draft_info else None}
    ranking = sorted((n for n in results if n != "target alone"), key=lambda n: -results[n]["speedup"])
    report = {"date": datetime.now(timezone.utc).isoformat(), "git_commit": git_commit(), "machine": machine(),
              "torch_threads": torch.get_num_threads(),
              "command": "python bench/draft_ranking.py " + " ".join(sys.argv[1:]),
              "target": args.target, "num_questions": len(prompts), "max_tokens": args.max_tokens,
              "rounds": args.rounds, "generated_tokens": tokens, "ranking": ranking, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for name in ["target alone"] + ranking:
        r = results[name]
        print(f"{name:>22}: {r['speedup']:.2f}x, AL {r['acceptance_length']:.2f}, {r['tokens_per_second']:.0f} tok/s, "
              f"exact {r['exact_matches']}/{len(prompts)}, mode {r['vocab_mode']}, head {r['draft_head_rows']}")


if __name__ == "__main__":
    main()
