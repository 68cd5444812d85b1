"""`anydraft distill`: fit a draft of any vocabulary to the target's sampled next-token distribution (anydraft/distill)."""
from __future__ import annotations

import argparse
import json
import sys
import time


def add_parser(sub) -> None:
    p = sub.add_parser("distill", help="fit a draft's proposals to the target's sampled distribution (raises 1 - TV)",
                       description="The target samples continuations of corpus prompts at the serving temperature; "
                                   "at every position where the draft (reading that text as it does while serving) "
                                   "and the target share a text boundary, the draft's proposal distribution over the "
                                   "vocabulary intersection is fitted to the target's next-token distribution. Writes "
                                   "a standard HF checkpoint with distill.json (before/after held-out 1 - TV and AL).")
    p.add_argument("--target", required=True, help="target checkpoint dir or builtin name")
    p.add_argument("--draft", required=True, help="the draft to start from: checkpoint dir or builtin name")
    p.add_argument("--corpus", required=True, metavar="FILE",
                   help=".jsonl with a question (GSM8K), prompt or text per line; else paragraphs of text")
    p.add_argument("--out", required=True, metavar="DIR", help="where the distilled draft (and resumable state) goes")
    p.add_argument("--temperature", type=float, default=0.7, help="the serving temperature to fit (default 0.7)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--loss", default="tv", choices=["tv", "kl", "jsd"],
                   help="tv: 1 - acceptance itself (default); kl: forward KL; jsd: Jensen-Shannon")
    p.add_argument("--batch-size", type=int, default=8, help="continuations per step (default 8)")
    p.add_argument("--num-prompts", type=int, default=256, help="corpus prompts continued for training (default 256)")
    p.add_argument("--held-out", type=int, default=32,
                   help="prompts from the corpus's end, never trained on, for 1 - TV and AL (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per continuation (default 128)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate, cosine to 0 (default 3e-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--on-policy", type=float, default=0.0, metavar="FRACTION",
                   help="fraction of training prompts the draft continues itself, its text scored by the target "
                        "(default 0: the target's continuations only)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations and saved states")
    p.add_argument("--resume", action="store_true", help="continue from the state in --out")
    p.add_argument("--no-al", dest="measure_al", action="store_false",
                   help="skip measuring AL (fixed k = 3, sampled) before and after on the held-out prompts")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def measure_al(target: str, draft: str, prompts: list[str], temperature: float, max_tokens: int, seed: int) -> float:
    """AL of fixed k = 3 sampled speculation of `draft` for `target` over `prompts` (seeded per prompt)."""
    from ..config import SamplingParams
    from ..llm import LLM
    llm = LLM(target, {"model": draft, "num_speculative_tokens": 3, "adaptive": False}, max_num_seqs=16)
    llm.generate(prompts, [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i)
                           for i in range(len(prompts))])
    return llm.stats.acceptance_length


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ..distill.examples import corpus_prompts
    from ..distill.trainer import STATE_FILE, DistillConfig, Distiller
    from ..provenance import provenance

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = DistillConfig(args.target, args.draft, args.corpus, args.out, args.temperature, args.steps, args.loss,
                        args.batch_size, args.num_prompts, args.held_out, args.max_tokens, args.lr, args.seed,
                        args.eval_every, args.on_policy)
    start = time.perf_counter()
    distiller = Distiller(cfg)
    resumed = args.resume and distiller.load_state()
    if not resumed:
        if (distiller.out / STATE_FILE).exists():
            raise ValueError(f"{distiller.out / STATE_FILE} exists: pass --resume to continue it, or another --out")
        bar = tqdm(total=cfg.num_prompts + cfg.held_out, desc="target continuations", file=sys.stderr)
        distiller.prepare(progress=bar.update)
        bar.close()
        distiller.history.append({"step": 0, "held_out_acceptance": distiller.evaluate(distiller.held_out)})
        distiller.save_state()
    before = distiller.history[0]["held_out_acceptance"]
    bar = tqdm(total=cfg.steps, initial=distiller.step, desc="distill", file=sys.stderr)
    last = [before]

    def on_step(record: dict) -> None:
        last[0] = record.get("held_out_acceptance", last[0])
        bar.set_postfix(loss=f"{record['loss']:.4f}", held_out_1_minus_tv=f"{last[0]:.4f}")
        bar.update(1)
    distiller.train_steps(on_step)
    bar.close()
    after = distiller.evaluate(distiller.held_out)
    summary = {"target": cfg.target, "draft": cfg.draft, "corpus": cfg.corpus, "temperature": cfg.temperature,
               "loss": cfg.loss, "on_policy": cfg.on_policy, "steps": cfg.steps, "batch_size": cfg.batch_size,
               "learning_rate": cfg.learning_rate,
               "train_continuations": len(distiller.train), "held_out_continuations": len(distiller.held_out),
               "held_out_positions": sum(len(e.target_positions) for e in distiller.held_out),
               "held_out_acceptance_before": before, "held_out_acceptance_after": after,
               "history": distiller.history}
    distiller.write_checkpoint()   # before AL: the engine loads the distilled draft from --out
    if args.measure_al:
        prompts = corpus_prompts(cfg.corpus)[-cfg.held_out:]
        summary["acceptance_length_k3_before"] = measure_al(cfg.target, cfg.draft, prompts, cfg.temperature,
                                                            cfg.max_tokens, cfg.seed)
        summary["acceptance_length_k3_after"] = measure_al(cfg.target, str(distiller.out), prompts, cfg.temperature,
                                                           cfg.max_tokens, cfg.seed)
    summary["seconds"] = time.perf_counter() - start
    summary["provenance"] = provenance()
    distiller.write_summary(summary)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"held-out 1 - TV (per-position acceptance bound at T {cfg.temperature}): {before:.4f} -> {after:.4f}")
        if args.measure_al:
            print(f"AL at fixed k = 3, sampled: {summary['acceptance_length_k3_before']:.3f} -> "
                  f"{summary['acceptance_length_k3_after']:.3f}")
        print(f"draft written to {distiller.out}")
    return 0
