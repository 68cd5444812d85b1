"""Live servers for the server tests: `python -m anydraft.cli serve` on a free 127.0.0.1 port, started and stopped
by the tests, driven by the official `openai` client.

- `shipped_server`: the command with no model flags (the embedded qwen3-target + smollm2-draft pair, bf16), where the
  native kernels run; elsewhere with `--dtype float64` (SHIPPED_DTYPE_ARGS): bf16 texts are the same whatever the
  batch only on the native kernels (docs/guarantees.md), and the tests compare batched with one-at-a-time texts.
- `tiny_server`: a tiny random qwen3-vocabulary target in float64 (its greedy text has many tokens that are
  partial UTF-8) whose tokenizer config lacks a chat template, with a TLI draft on the llama2 tokenizer
  (SentencePiece), an API key, and max_model_len 128. Speculation is not adaptive here: adaptive k follows
  measured step times, and a seeded sample on the PyTorch path (float64 here: rejection sampling) depends on each
  step's k, so seeds reproduce only with a fixed k.
- `tiny_chat_server`: the same draft and settings with the random qwen3 target whose tokenizer keeps its chat
  template, so chat completions are served too.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai   # declared in the test extra: a missing client is an error here, not a skip
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
from tiny_models import TOKENIZERS, Checkpoints   # tests/engine, on the path by pyproject.toml

from anydraft.model.native_extension import why_not_hardware

if not TOKENIZERS.is_dir():
    pytest.skip(f"real tokenizers not found at {TOKENIZERS}", allow_module_level=True)

STARTUP_LIMIT_S = 900   # first start may compile the native kernels (about a minute, more on a busy machine)
TINY_API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    process: subprocess.Popen
    port: int
    log_path: Path
    api_key: str = "unused"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> "openai.OpenAI":
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key, max_retries=0, **kwargs)

    def async_client(self) -> "openai.AsyncOpenAI":
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key=self.api_key, max_retries=0,
                                  timeout=600)

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by their full name with labels (e.g. 'anydraft:num_requests_running{...}')."""
        text = httpx.get(self.base_url + "/metrics", timeout=30).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def metric(self, prefix: str) -> float:
        """Sum of the samples whose name (with labels) starts with prefix."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def start_server(args: list[str], log_path: Path, api_key: str = "unused", env: dict | None = None) -> LiveServer:
    port = free_port()
    log = open(log_path, "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", "anydraft.cli", "serve", "--port", str(port), *args],
                               cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(process, port, log_path, api_key)
    deadline = time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.base_url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(server)
    raise RuntimeError(f"server not ready after {STARTUP_LIMIT_S} s:\n{server.log_tail()}")


def stop_server(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


SHIPPED_DTYPE_ARGS = [] if why_not_hardware() is None else ["--dtype", "float64"]


@pytest.fixture(scope="session")
def shipped_server(tmp_path_factory):
    server = start_server(["--max-num-seqs", "16", *SHIPPED_DTYPE_ARGS], tmp_path_factory.mktemp("logs") / "shipped.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def tiny_target(tiny_ckpts, tmp_path_factory) -> Path:
    """The random qwen3 target with no chat template in its tokenizer config."""
    directory = tmp_path_factory.mktemp("tiny_target")
    for path in Path(tiny_ckpts.qwen3_target).iterdir():
        shutil.copy(path, directory / path.name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


TINY_SERVE_ARGS = {"dtype": "float64", "max_model_len": 128, "max_num_seqs": 4, "k": 3}


def start_tiny_server(target: Path, ckpts: Checkpoints, tmp_path_factory, log_name: str) -> LiveServer:
    a = TINY_SERVE_ARGS
    return start_server(["--model", str(target), "--draft", str(ckpts.llama2_draft),
                         "-k", str(a["k"]), "--no-adaptive", "--dtype", a["dtype"], "--device", "cpu", "--max-model-len",
                         str(a["max_model_len"]), "--max-num-seqs", str(a["max_num_seqs"]),
                         "--served-model-name", "tiny", "--api-key", TINY_API_KEY],
                        tmp_path_factory.mktemp("logs") / log_name, api_key=TINY_API_KEY,
                        env={"ANYDRAFT_CACHE_DIR": str(tmp_path_factory.mktemp("bridge_cache"))})


@pytest.fixture(scope="session")
def tiny_server(tiny_ckpts, tiny_target, tmp_path_factory):
    server = start_tiny_server(tiny_target, tiny_ckpts, tmp_path_factory, "tiny.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tiny_chat_server(tiny_ckpts, tmp_path_factory):
    """The tiny server with the tokenizer's chat template kept."""
    server = start_tiny_server(tiny_ckpts.qwen3_target, tiny_ckpts, tmp_path_factory, "tiny_chat.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tiny_llm(tiny_ckpts, tiny_target):
    """The same target and draft through the Python API, for comparison with what the server streams."""
    from anydraft.llm import LLM
    a = TINY_SERVE_ARGS
    return LLM(model=str(tiny_target), dtype=a["dtype"], device="cpu", max_model_len=a["max_model_len"],
               max_num_seqs=a["max_num_seqs"],
               speculative_config={"model": str(tiny_ckpts.llama2_draft), "num_speculative_tokens": a["k"],
                                   "adaptive": False})
