"""What a user installing the package (not a checkout) gets: builtin names that say where the checkpoints are,
a wheel that carries the native sources and the vLLM bench worker but no models, and no data paths read
relative to the source tree."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from anydraft.model.loader import MODELS_DIR_ENV, resolve_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_builtin_name_without_checkpoints_says_where_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"not in the wheel.*{MODELS_DIR_ENV}"):
        resolve_model_path("qwen3-target")


def test_builtin_name_resolves_through_the_environment(tmp_path, monkeypatch):
    (tmp_path / "qwen3-target").mkdir()
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    assert resolve_model_path("qwen3-target") == tmp_path / "qwen3-target"


def test_wheel_carries_sources_and_worker_but_no_models(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO_ROOT)], check=True, capture_output=True, text=True)
    [wheel] = tmp_path.glob("anydraft-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("anydraft/model/csrc/decoder.cpp", "anydraft/model/csrc/greedy_head.cpp",
                   "anydraft/model/csrc/kernels.h", "anydraft/bench/vllm_worker.py", "anydraft/cli/__init__.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith("models/") or n.endswith(".safetensors")]


def test_package_reads_no_path_beside_its_source_tree():
    """../shared, the repo's bench/ and tests/ are not part of an installed package: nothing may reach them
    through __file__ (the builtin models/ folder is the one documented exception, with its own variable)."""
    offenders = []
    for path in (REPO_ROOT / "anydraft").rglob("*.py"):
        text = path.read_text()
        for needle in ('"shared"', "'shared'", '/ "bench"', '/ "tests"', "parents[3]"):
            if needle in text:
                offenders.append(f"{path.relative_to(REPO_ROOT)}: {needle}")
    assert offenders == []
