"""Where a result came from: date, git commit, machine (CPU model, flags, cores), torch and its threads, kernels.

Every JSON result the CLI and the benchmarks write carries this record, so a number can be traced to what
produced it."""
from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
from pathlib import Path

import torch

from .model.native_extension import _cpuinfo, cpu_has

# The flags that decide which kernels can run here (and so which numbers are comparable).
RELEVANT_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout this package runs from (with '-dirty' when it has changes), else None
    (an installed wheel has no checkout). Read once, when this module is imported (below), so a long benchmark
    names the code it loaded, not a commit made while it ran."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


git_commit()   # at import: with the code, not when the result is written


def machine() -> dict:
    return {"cpu": _cpuinfo("model name") or platform.processor(),
            "cpu_flags": [f for f in RELEVANT_CPU_FLAGS if cpu_has(f)],
            "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def provenance(llm=None, **extra) -> dict:
    """The record: date, commit, machine, torch threads, and the kernels of `llm` (an LLM) when given."""
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": git_commit(), "machine": machine(), "torch_threads": torch.get_num_threads()}
    if llm is not None:
        record["kernels"] = llm.kernels
    record.update(extra)
    return record
