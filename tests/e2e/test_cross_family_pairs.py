"""Cross-family pairs of the shipped models: a byte-level BPE model (qwen3) with a SentencePiece one
(mistral: `▁` word marks, `<0xNN>` byte fallback, a BOS), both directions, greedy and lossless."""
from __future__ import annotations

import json

import pytest

from anydraft.cli import main

NATALIA = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?\\nAnswer:")
# the drafts were distilled from another family's target: they agree with it on most tokens (k = 3)
AL_FLOOR = 2.0


def run_cli(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("target,draft", [("qwen3-target", "mistral-draft"), ("mistral-target", "qwen3-draft")])
def test_cross_family_pair_is_lossless_against_the_target_alone(capsys, target, draft):
    common = ["generate", "--json", "--target", target, "--max-tokens", "48", NATALIA]
    spec = run_cli(capsys, common + ["--draft", draft, "--no-adaptive", "-k", "3"])
    alone = run_cli(capsys, common + ["--draft", "none"])
    assert spec["draft_info"]["vocab_mode"] == "tli"
    assert spec["outputs"][0]["token_ids"] == alone["outputs"][0]["token_ids"]
    assert spec["metrics"]["acceptance_length"] >= AL_FLOOR
