"""Issue 17's 'must show': `anydraft generate --target qwen3-target --draft qwen3-eagle3|qwen3-dspark --json`, with
the default settings (adaptive k on), on a GSM8K test question."""
from __future__ import annotations

import json

import pytest

from anydraft.cli import main

JANET = ("Question: Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
         "muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
         "per fresh duck egg. How much in dollars does she make every day at the farmers' market?\\nAnswer:")


def run_cli(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def target_alone():
    return {}


@pytest.mark.parametrize("draft, kind, k", [("qwen3-eagle3", "eagle3", 3), ("qwen3-dspark", "dspark", 4)])
def test_hidden_state_drafter_under_default_settings(capsys, target_alone, draft, kind, k):
    result = run_cli(capsys, ["generate", "--target", "qwen3-target", "--draft", draft, "--json", JANET])
    info, metrics = result["draft_info"], result["metrics"]
    assert (info["vocab_mode"], info["draft_vocab_size"]) == (kind, 8192)
    assert sum(metrics["k_histogram"].values()) == metrics["target_forwards"]
    if "alone" not in target_alone:
        target_alone["alone"] = run_cli(capsys, ["generate", "--target", "qwen3-target", "--draft", "none", "--json",
                                                 JANET])["outputs"][0]["token_ids"]
    assert result["outputs"][0]["token_ids"] == target_alone["alone"]   # bf16, native kernels: exact
    # The drafter's agreement at the k it was trained for (adaptive's choices depend on this machine's timings).
    fixed = run_cli(capsys, ["generate", "--target", "qwen3-target", "--draft", draft, "--json", "--no-adaptive",
                             "-k", str(k), JANET])
    assert fixed["metrics"]["acceptance_length"] >= 2.5
    assert fixed["outputs"][0]["token_ids"] == target_alone["alone"]
    print(f"\n[{draft}] default settings: AL {metrics['acceptance_length']}, k histogram {metrics['k_histogram']}; "
          f"fixed k={k}: AL {fixed['metrics']['acceptance_length']}")
