"""The issues' 'must show' commands, run as a user would type them, on the shipped models."""
from __future__ import annotations

import json
import os

import pytest

from anydraft.cli import main
from anydraft.model.native_extension import why_not_hardware, why_not_screened_head


def native_expected() -> bool:
    """The native body must run on a CPU with AVX-512 or AVX2 + FMA (bf16, Llama-family sizes the shipped models
    have)."""
    return why_not_hardware() is None and os.environ.get("ANYDRAFT_NATIVE", "1") != "0"

NATALIA = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?\\nAnswer:")


def run_cli(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_with_no_model_flags_uses_the_heterogeneous_default_pair(capsys):
    result = run_cli(capsys, ["generate", "--json", NATALIA])
    assert (result["target"], result["draft"]) == ("qwen3-target", "smollm2-draft")
    assert result["draft_info"]["vocab_mode"] == "tli"
    # adaptive speculation (the default) chose k per step; its histogram covers every verification step
    assert sum(result["metrics"]["k_histogram"].values()) == result["metrics"]["target_forwards"]
    # the pair's agreement, at a fixed k (adaptive's choices depend on this machine's timings)
    fixed = run_cli(capsys, ["generate", "--json", "--no-adaptive", "-k", "3", NATALIA])
    assert fixed["metrics"]["acceptance_length"] >= 2.0
    completion = result["outputs"][0]
    assert completion["token_ids"] and completion["text"].strip() and completion["finish_reason"] in ("stop", "length")
    assert result["prompt_token_ids"] and result["prompt"] == NATALIA.replace("\\n", "\n")
    # which kernels ran is part of the output (native on an AVX-512 or AVX2 CPU, else the PyTorch path and why)
    kernels = result["metrics"]["kernels"]
    assert set(kernels) == {"target", "draft"} and all(k["body"] for k in kernels.values())
    if native_expected():
        assert kernels["target"]["body"] == "native" and kernels["draft"]["body"] == "native", kernels


def test_generate_default_pair_is_lossless_against_the_target_alone(capsys):
    spec = run_cli(capsys, ["generate", "--json", "--max-tokens", "48", NATALIA])
    alone = run_cli(capsys, ["generate", "--json", "--draft", "none", "--max-tokens", "48", NATALIA])
    assert alone["metrics"]["acceptance_length"] == 1.0
    # bf16: with the native kernels every row is computed the same way whatever the batch shape (exact); on
    # the PyTorch path a verification forward may round differently and flip a near-tie, on this prompt none.
    assert spec["outputs"][0]["token_ids"] == alone["outputs"][0]["token_ids"]


def test_seeded_sampling_with_the_default_pair_writes_the_target_alone_s_tokens(capsys):
    """Coupled draws with noise keyed by output position (sampling.draw_keys): a seeded sampled request gets the
    target alone's tokens whatever the draft proposed and whichever k adaptive speculation chose."""
    if not (native_expected() and why_not_screened_head() is None):
        pytest.skip("hardware: coupled draws need the native sampling head (AVX-512 VNNI); the PyTorch path samples "
                    "by rejection, whose tokens depend on the drafts")
    sampled = ["generate", "--json", "--temperature", "0.7", "--max-tokens", "48", NATALIA]
    spec = run_cli(capsys, sampled + ["--seed", "3"])
    alone = run_cli(capsys, sampled + ["--seed", "3", "--draft", "none"])
    other_seed = run_cli(capsys, sampled + ["--seed", "4", "--draft", "none"])
    assert spec["metrics"]["acceptance_length"] > 1.0   # drafts decided tokens
    assert spec["outputs"][0]["token_ids"] == alone["outputs"][0]["token_ids"]
    assert other_seed["outputs"][0]["token_ids"] != alone["outputs"][0]["token_ids"]   # the seed decides the text


def test_vocab_qwen3_smollm2_intersection(capsys, shared_dir):
    report = run_cli(capsys, ["vocab", str(shared_dir / "tokenizers" / "qwen3"),
                              str(shared_dir / "tokenizers" / "smollm2"), "--json"])
    assert 39_000 <= report["intersection"] <= 39_400


def test_eval_gsm8k_20_questions_compare_target(capsys):
    result = run_cli(capsys, ["eval", "gsm8k", "--num-questions", "20", "--compare-target", "--json",
                              "--no-progress", "--no-adaptive", "-k", "3"])
    for key in ("accuracy", "acceptance_length", "tokens_per_second", "exact_matches", "num_questions"):
        assert key in result, key
    assert result["num_questions"] == 20
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["target_alone"]["accuracy"] <= 1
    assert result["acceptance_length"] >= 2.0
    assert len(result["mismatches"]) == 20 - result["exact_matches"]
    if result["provenance"]["kernels"]["target"]["body"] == "native":
        assert result["exact_matches"] == 20, result["mismatches"]   # docs/guarantees.md: bf16 greedy exact when native
    else:   # the PyTorch path: any divergence must be at a near-tie of the target's logits
        assert all(m["near_tie"] for m in result["mismatches"]), result["mismatches"]
    assert "| model |" in result["markdown"]
