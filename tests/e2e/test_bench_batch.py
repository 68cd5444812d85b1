"""`anydraft bench --batch-size 2` on the shipped pair: groups of two prompts decoded together by every anydraft
contender, the default adaptive engine beside fixed k, exact matches per prompt, and the JSON says the batch size."""
from __future__ import annotations

import json

from anydraft.cli import main


def test_bench_at_batch_two_writes_every_field(tmp_path, capsys):
    code = main(["bench", "--batch-size", "2", "--num-prompts", "2", "--max-tokens", "8", "--peers", "none",
                 "--sweep-k", "1", "--repeats", "1", "--out", str(tmp_path), "--tag", "b2"])
    assert code == 0
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "b2.json").read_text())
    cfg = result["config"]
    assert result["batch_size"] == 2 and cfg["batch_size"] == 2 and cfg["adaptive_k"] == 5
    assert cfg["pair"] == {"target": "shipped", "target_shape": None, "draft": "shipped", "draft_shape": None}
    assert "**Batch size 2** (groups of 2 prompts decoded together)" in table and "(shipped" in table
    runs = {run["name"]: run for run in result["runs"]}
    assert list(runs) == ["anydraft target alone", "anydraft same-vocab (identity)", "anydraft TLI",
                          "anydraft TLI adaptive (default)"]
    for run in runs.values():
        assert run["generated_tokens"] == 16 and len(run["per_group_steps"]) == 1   # one group of two prompts
        # Greedy bf16 on the native kernels (batch-invariant): every row reproduces the target alone, per prompt.
        assert run["exact_matches_vs_target_alone"] == 2
    adaptive = runs["anydraft TLI adaptive (default)"]
    assert adaptive["adaptive"] is True and adaptive["k"] == 5 and "ideal_speedup" not in adaptive
    histogram = {int(k): n for k, n in adaptive["k_histogram_first_repeat"].items()}
    assert set(histogram) <= set(range(6)) and sum(histogram.values()) == adaptive["target_forwards"]
    assert "<=5 adaptive" in table
    assert result["costs"]["rows"] == 2
    assert [row["k"] for row in result["sweep_k"]] == [1]
    sweep_adaptive = result["sweep_adaptive"]
    assert sweep_adaptive["best_fixed"]["k"] in (0, 1) and sweep_adaptive["vs_best_fixed"] > 0
    assert result["roofline"] is None and "batch-1" in result["skipped"]["roofline"]
