"""The issues' 'must show' commands, run as a user would type them, on the shipped models."""
from __future__ import annotations

import json


from anydraft.cli import main

NATALIA = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?\\nAnswer:")


def run_cli(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_with_no_model_flags_uses_the_heterogeneous_default_pair(capsys):
    result = run_cli(capsys, ["generate", "--json", NATALIA])
    assert (result["target"], result["draft"]) == ("qwen3-target", "smollm2-draft")
    assert result["draft_info"]["vocab_mode"] == "tli"
    assert result["metrics"]["acceptance_length"] >= 2.0
    assert result["token_ids"] and result["text"].strip()


def test_generate_default_pair_is_lossless_against_the_target_alone(capsys):
    spec = run_cli(capsys, ["generate", "--json", "--max-tokens", "48", NATALIA])
    alone = run_cli(capsys, ["generate", "--json", "--no-draft", "--max-tokens", "48", NATALIA])
    assert alone["metrics"]["acceptance_length"] == 1.0
    # bf16: a verification forward over k+1 positions may round differently from a 1-token decode, so a
    # near-tie could flip; on this prompt none does.
    assert spec["token_ids"] == alone["token_ids"]


def test_vocab_qwen3_smollm2_intersection(capsys, shared_dir):
    report = run_cli(capsys, ["vocab", str(shared_dir / "tokenizers" / "qwen3"),
                              str(shared_dir / "tokenizers" / "smollm2"), "--json"])
    assert 39_000 <= report["intersection"] <= 39_400


def test_eval_gsm8k_20_questions_compare_target(capsys):
    result = run_cli(capsys, ["eval", "gsm8k", "--num-questions", "20", "--compare-target", "--json",
                              "--no-progress"])
    for key in ("accuracy", "acceptance_length", "tokens_per_second", "exact_matches", "num_questions"):
        assert key in result, key
    assert result["num_questions"] == 20
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["target_alone"]["accuracy"] <= 1
    assert result["acceptance_length"] >= 2.0
    assert 0 <= result["exact_matches"] <= 20
    assert len(result["mismatches"]) == 20 - result["exact_matches"]
    for mismatch in result["mismatches"]:
        assert "first_divergence" in mismatch
    assert "| model |" in result["markdown"]
