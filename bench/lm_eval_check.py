"""lm-eval's GSM8K through `anydraft serve` with speculation against `--draft none`: the same per-question outputs,
exact-match score and log-likelihoods? (anydraft/eval/lm_eval_tasks.py: local tasks, no hub.)

    python bench/lm_eval_check.py --num-questions 100 --json bench/results/<date>-lm-eval/gsm8k_100.json

Both servers run with their defaults plus `--serve-args` (e.g. `--dtype float64`), one after the other, each
evaluated by lm-eval's `local-completions` model (one request at a time, greedy).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anydraft.eval import lm_eval_tasks  # noqa: E402
from anydraft.provenance import provenance  # noqa: E402

STARTUP_LIMIT_S = 900


def serve(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "anydraft.cli", "serve", "--port", str(port), *args],
                               cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"anydraft serve {' '.join(args)} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise RuntimeError(f"anydraft serve {' '.join(args)} not ready after {STARTUP_LIMIT_S} s")


def run(server_args: list[str], task_dir: Path, log: Path) -> dict:
    process, url = serve(server_args, log)
    try:
        return lm_eval_tasks.evaluate(url, task_dir, REPO / "models" / "qwen3-target")
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-questions", type=int, default=100)
    p.add_argument("--max-gen-toks", type=int, default=256)
    p.add_argument("--serve-args", default="", help="extra `anydraft serve` arguments for both servers")
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"))
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    extra = shlex.split(args.serve_args)
    with tempfile.TemporaryDirectory() as tmp:
        task_dir = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(task_dir / "hf_datasets")
        lm_eval_tasks.write_tasks(task_dir, Path(args.data), args.num_questions, args.max_gen_toks)
        spec = run(extra, task_dir, task_dir / "spec.log")
        alone = run(["--draft", "none", *extra], task_dir, task_dir / "alone.log")
    summary = lm_eval_tasks.compare(spec, alone)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": summary, "settings": vars(args),
                                               "provenance": provenance(command=" ".join(sys.argv))}, indent=1))


if __name__ == "__main__":
    main()
