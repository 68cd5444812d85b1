"""The pair advisor: for a target and candidate drafts, what each draft would do and how fast it would be.

Per draft: vocabulary overlap both ways, TLI's corpus coverage, the mode vocab_mode="auto" picks and why
(vocab/mode_choice.py, the same rule the engine applies), the frequency-ranked head size keeping 99% of the
corpus, the measured draft/target per-token cost ratio, the measured AL at each k (greedy, fixed k, the first
N prompts), and the cost model's predicted speedup AL(k)·T_target / (T_verify(k) + F(k)·T_draft)
(spec_decode/cost_model.py), F(k) the draft forwards the proposer runs to propose k (k + 1 for SLEM). Drafts are
ranked by their best predicted speedup.

AL is measured at every k rather than derived from one run at the largest k: greedy acceptance at position i
does not depend on k, but which contexts steps start from does (a step that accepts n tokens moves the next
step's start by n + 1), and so does the draft's re-synced tokenization of the text; so AL(3) read off a k = 5
run's per-position counts is an estimate over other step starts. All timings (interleaved measurements of
the target and every draft, the least median of a few rounds) are at batch 1 on this machine; AL does not
depend on the batch (greedy).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import SamplingParams, SpeculativeConfig, VOCAB_MODES, parse_dtype, resolve_device
from .engine import Engine
from .eval import gsm8k
from .k_sweep import set_k
from .model.config import ModelConfig
from .model.loader import has_d2t_table, resolve_model_path
from .model.runner import ModelRunner
from .model.speculators_config import is_speculators_checkpoint
from .spec_decode.cost_model import ideal_speedup, measure_costs
from .spec_decode.factory import build_proposer, corpus_coverage
from .tokenizer import Tokenizer, same_vocabulary
from .vocab.cache import default_cache_dir, load_or_build_bridge
from .vocab.frequency import coverage_report, load_or_count, specials_among
from .vocab.mode_choice import choose_vocab_mode, slem_head_size

HEAD_COVERAGE = "0.99"   # the share of the corpus a frequency-ranked head must keep (coverage_report's key)


@dataclass
class AdviseConfig:
    target: str
    drafts: list[str]
    corpus: str                    # .jsonl or text: coverage, auto's choice, head sizes
    prompts: list[str]             # AL is measured on these
    ks: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_tokens: int = 128
    dtype: str = "bfloat16"
    device: str | None = None
    batch_size: int = 8
    max_model_len: int = 1024
    cost_rounds: int = 3           # timing rounds; each cost is its least median over them

    def __post_init__(self):
        if not self.drafts:
            raise ValueError("give at least one draft to advise on (--drafts D1,D2,...)")
        if len(set(self.drafts)) != len(self.drafts):
            raise ValueError(f"--drafts lists a draft twice: {self.drafts}")
        if not self.prompts:
            raise ValueError("no prompts to measure acceptance on")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"k values must be >= 1, got {list(self.ks)}")
        if self.max_tokens < 1 or self.batch_size < 1 or self.cost_rounds < 1:
            raise ValueError("max_tokens, batch_size and cost_rounds must be >= 1")


def gsm8k_prompts(data_dir: Path, num_prompts: int) -> list[str]:
    """The first num_prompts GSM8K test questions as the eval harness asks them (zero-shot)."""
    return [gsm8k.build_prompt(example["question"], []) for example in
            gsm8k.load_split(data_dir / "test.jsonl")[:num_prompts]]


def _draft_path(name: str) -> Path:
    """The draft's checkpoint, refusing what advise cannot rank, before anything is loaded."""
    path = resolve_model_path(name)   # an unknown name: the error lists the builtin names
    if is_speculators_checkpoint(path):
        raise ValueError(f"{name} is a hidden-state drafter (speculators format): it reads the target's hidden "
                         f"states, so its cost is not a separate model's forward; advise ranks draft models "
                         f"(compare hidden-state drafters with bench/hidden_state_drafts.py)")
    if not (path / "tokenizer.json").exists() and not has_d2t_table(path):
        raise ValueError(f"{path}: no tokenizer.json; a draft model needs its tokenizer beside its weights")
    return path


def _vocabulary(name: str, path: Path, target_tokenizer: Tokenizer, target_rows: int, target_counts: torch.Tensor,
                corpus: str) -> dict:
    """Overlap, coverage, auto's choice and the 99% head size of one draft (no model loaded)."""
    draft_tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").exists() else target_tokenizer
    draft_rows = ModelConfig.from_file(path / "config.json").vocab_size
    bridge = load_or_build_bridge(target_tokenizer, draft_tokenizer, target_rows, draft_rows)
    shared = bridge.is_identity or same_vocabulary(target_tokenizer, draft_tokenizer)
    has_d2t = has_d2t_table(path)
    coverage = None if shared or has_d2t else corpus_coverage(bridge, target_tokenizer, draft_tokenizer, corpus)
    mode, reason = choose_vocab_mode(shared, has_d2t, coverage)
    if mode == "slem":   # the draft writes in its own vocabulary: its head is ranked by its own tokenization
        candidates = torch.arange(min(draft_rows, draft_tokenizer.vocab_size))
        counts = load_or_count(draft_tokenizer, corpus, draft_rows, default_cache_dir())
        ranking_tokenizer = draft_tokenizer
    elif shared or has_d2t:
        candidates = torch.arange(min(target_rows, target_tokenizer.vocab_size))
        counts, ranking_tokenizer = target_counts, target_tokenizer
    else:
        candidates = bridge.draft_to_target[bridge.pruned_draft_rows()]
        counts, ranking_tokenizer = target_counts, target_tokenizer
    head = coverage_report(candidates, counts, specials_among(candidates, ranking_tokenizer), [])
    return {
        "draft": name, "draft_path": str(path), "same_vocabulary": shared, "has_d2t": has_d2t,
        "intersection": bridge.stats.intersection,
        "intersection_pct_of_draft": round(bridge.stats.pct_draft, 2),
        "intersection_pct_of_target": round(bridge.stats.pct_target, 2),
        "tli_coverage": None if coverage is None else {k: round(v, 4) if isinstance(v, float) else v
                                                       for k, v in coverage.to_dict().items()},
        "auto_mode": mode, "auto_reason": reason,
        "head_rows": len(candidates),
        "head_rows_for_99pct": None if has_d2t else head["size_for_coverage"][HEAD_COVERAGE],
    }


def _measure_acceptance(engine: Engine, prompts: list[str], ks: tuple[int, ...], max_tokens: int) -> dict:
    """AL at each k (fixed k, greedy), and the per-position acceptance of the largest k."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop=gsm8k.STOP_STRINGS)
    out = {"acceptance_length": {}, "generated_tokens": {}}
    for k in ks:
        set_k(engine, k)
        run = gsm8k.run_engine(engine, prompts, params)
        out["acceptance_length"][k] = round(run.stats.acceptance_length, 4)
        out["generated_tokens"][k] = run.stats.num_emitted
        if k == max(ks):
            out["acceptance_by_position"] = [round(x, 4) for x in run.stats.acceptance_by_position]
    return out


def advise(cfg: AdviseConfig) -> dict:
    """The report: {'target', 'corpus', 'costs', 'drafts': [ranked, best predicted speedup first]}."""
    dtype, device = parse_dtype(cfg.dtype), resolve_device(cfg.device)
    target_path = resolve_model_path(cfg.target)
    draft_paths = {name: _draft_path(name) for name in cfg.drafts}    # every name checked before loading
    target_tokenizer = Tokenizer.from_dir(target_path)
    target = ModelRunner.load(target_path, dtype, device, cfg.batch_size, cfg.max_model_len + max(cfg.ks),
                              num_token_rows=target_tokenizer.vocab_size)
    target_counts = load_or_count(target_tokenizer, cfg.corpus, target.vocab_rows, default_cache_dir())
    reports, runners = [], {}
    for name, path in draft_paths.items():
        report = _vocabulary(name, path, target_tokenizer, target.vocab_rows, target_counts, cfg.corpus)
        measured = report["auto_mode"] if report["auto_mode"] in VOCAB_MODES else "tli"
        if measured != report["auto_mode"]:
            report["note"] = f"auto would choose {report['auto_mode']!r}, which this build lacks: measured with TLI"
        # A SLEM draft is measured with the head auto gives it (mode_choice.slem_head_size), as auto would run it.
        head = slem_head_size(report["head_rows_for_99pct"], report["head_rows"]) if measured == "slem" else None
        head_options = {"draft_vocab_size": head, "draft_vocab_corpus": str(cfg.corpus)} if head else {}
        spec = SpeculativeConfig(model=str(path), num_speculative_tokens=max(cfg.ks), vocab_mode=measured,
                                 adaptive=False, **head_options)
        proposer, info = build_proposer(spec, target, target_tokenizer, cfg.batch_size, cfg.max_model_len)
        report["measured_mode"] = info["vocab_mode"]
        report["draft_head_rows_measured"] = info["draft_head_rows"]
        if head_options:
            report["head_options"] = head_options
        report["kernels"] = proposer.runner.kernels
        report["draft_forwards"] = {k: proposer.draft_forwards(k) for k in cfg.ks}   # SLEM writes k + 1 tokens
        engine = Engine(target, target_tokenizer, proposer, cfg.max_model_len)
        report.update(_measure_acceptance(engine, cfg.prompts, cfg.ks, cfg.max_tokens))
        runners[f"draft{len(runners)}"] = proposer.runner   # keys that cannot clash with measure_costs' own
        reports.append(report)
    # Interleaved timings of the target and every draft, so their ratios share the machine's state; each quantity's
    # least median over a few rounds, since on a shared machine other work only ever adds time.
    rounds = [measure_costs(target, runners, list(cfg.ks)) for _ in range(cfg.cost_rounds)]
    seconds = [key for key in rounds[0] if key.endswith("_seconds") and key != "verify_seconds"]
    costs = {**rounds[0], "rounds": cfg.cost_rounds, **{key: min(r[key] for r in rounds) for key in seconds},
             "verify_seconds": {k: min(r["verify_seconds"][k] for r in rounds) for k in cfg.ks}}
    for key, report in zip(runners, reports):
        draft_seconds = costs[f"{key}_seconds"]
        report["draft_seconds"] = draft_seconds
        report["draft_to_target_cost_ratio"] = round(draft_seconds / costs["target_seconds"], 4)
        predicted = {k: round(ideal_speedup(report["acceptance_length"][k], costs["target_seconds"],
                                            costs["verify_seconds"][k], draft_seconds, k,
                                            report["draft_forwards"][k]), 4) for k in cfg.ks}
        report["predicted_speedup"] = predicted
        report["best_k"] = max(predicted, key=predicted.get)
        report["best_predicted_speedup"] = predicted[report["best_k"]]
        head = report.get("head_options", {})
        report["command"] = (f"anydraft generate --target {cfg.target} --draft {report['draft']} --vocab-mode "
                             f"{report['measured_mode']} -k {report['best_k']}"
                             + (f" --draft-vocab-size {head['draft_vocab_size']} --draft-vocab-corpus "
                                f"{head['draft_vocab_corpus']}" if head else ""))
    reports.sort(key=lambda r: -r["best_predicted_speedup"])
    for rank, report in enumerate(reports, 1):
        report["rank"] = rank
    return {"target": cfg.target, "target_path": str(target_path), "corpus": str(cfg.corpus),
            "num_prompts": len(cfg.prompts), "max_tokens": cfg.max_tokens, "ks": list(cfg.ks), "dtype": cfg.dtype,
            "batch_size": cfg.batch_size,
            "costs": {"target_seconds": costs["target_seconds"], "verify_seconds": costs["verify_seconds"],
                      "context_tokens": costs["context_tokens"], "repeats": costs["repeats"],
                      "rounds": costs["rounds"]},
            "kernels": {"target": target.kernels},
            "drafts": reports}


def markdown_table(result: dict) -> str:
    ks = result["ks"]
    header = ["rank", "draft", "auto mode", "overlap % (draft / target)", "TLI coverage %", "head 99%",
              "cost ratio", *[f"AL k={k}" for k in ks], "best k", "predicted speedup"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in result["drafts"]:
        coverage = r["tli_coverage"]
        mode = r["auto_mode"] + ("" if r["measured_mode"] == r["auto_mode"] else f" (measured {r['measured_mode']})")
        row = [str(r["rank"]), r["draft"], mode,
               f"{r['intersection_pct_of_draft']:.1f} / {r['intersection_pct_of_target']:.1f}",
               "-" if coverage is None else f"{100 * coverage['combined']:.1f}",
               "-" if r["head_rows_for_99pct"] is None else f"{r['head_rows_for_99pct']} of {r['head_rows']}",
               f"{r['draft_to_target_cost_ratio']:.3f}", *[f"{r['acceptance_length'][k]:.2f}" for k in ks],
               str(r["best_k"]), f"{r['best_predicted_speedup']:.2f}×"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
