"""Issue #12's must-show: `anydraft grow` writes a real-shaped checkpoint that transformers loads as the real
architecture, that continues a GSM8K question greedily as the shipped target does, and that speculative
decoding with a grown draft (a builtin SMALL@SHAPE name, written on first use) accepts as the small pair does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from anydraft import LLM, SamplingParams
from anydraft.cli import main

NATALIA = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?\\nAnswer:")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a loaded 2-core machine two threads spin-wait on each other at every op, which
    costs these 0.6B- and 135M-parameter models (30 layers, ~10 ops each per token) several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def greedy_ids(model: str, max_tokens: int) -> list[int]:
    llm = LLM(model=model, dtype="float32", max_num_seqs=1, max_model_len=256)
    out = llm.generate([NATALIA.replace("\\n", "\n")], SamplingParams(temperature=0, max_tokens=max_tokens))
    return out[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def grown_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grown") / "qwen3-0.6b"
    assert main(["grow", "qwen3-target", "--shape", "qwen3-0.6b", "--out", str(out), "--no-progress"]) == 0
    return out


def test_transformers_loads_it_as_the_real_architecture(grown_dir):
    model, info = AutoModelForCausalLM.from_pretrained(grown_dir, dtype=torch.bfloat16, output_loading_info=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (1024, 28)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_greedy_continuation_equals_the_shipped_target(grown_dir):
    # float32: the grown checkpoint is the same function up to float32 rounding (bf16: see grow.py)
    assert greedy_ids(str(grown_dir), 16) == greedy_ids("qwen3-target", 16)


def test_generate_with_a_grown_draft_by_name(grown_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ANYDRAFT_CACHE_DIR", str(tmp_path / "cache"))   # the grown draft is written here on first use
    capsys.readouterr()
    # A fixed k: AL here measures how well the grown pair agrees. Adaptive speculation (the default) picks k from
    # measured costs, and on a loaded 2-core machine it may rightly draft little (AL near 1) for this pair.
    assert main(["generate", "--target", str(grown_dir), "--draft", "smollm2-draft@smollm2-135m", "--no-adaptive",
                 "-k", "3", "--max-tokens", "48", "--json", NATALIA]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["draft_info"]["vocab_mode"] == "tli"
    assert result["metrics"]["acceptance_length"] >= 2.5
    grown_drafts = list((tmp_path / "cache" / "grown").iterdir())
    assert [d.name.split("-")[:3] for d in grown_drafts] == [["smollm2", "draft@smollm2", "135m"]]
    assert json.loads((grown_drafts[0] / "config.json").read_text())["num_hidden_layers"] == 30
