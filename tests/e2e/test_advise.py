"""`anydraft advise` on the shipped models, as a user types it: every draft gets overlap, coverage, auto's mode,
a measured AL per k and a predicted speedup consistent with the reported costs; the ranking follows it."""
from __future__ import annotations

import json

import pytest

from anydraft.spec_decode.cost_model import ideal_speedup
from anydraft.cli import main

KS = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def report():
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["advise", "--target", "qwen3-target", "--drafts", "smollm2-draft,qwen3-draft,mistral-draft",
                     "--num-prompts",
                     "2", "--max-tokens", "24", "--json"])
    assert code == 0
    return json.loads(out.getvalue())


def test_every_draft_is_measured_and_ranked_by_predicted_speedup(report):
    drafts = report["drafts"]
    assert sorted(d["draft"] for d in drafts) == ["mistral-draft", "qwen3-draft", "smollm2-draft"]
    assert [d["rank"] for d in drafts] == [1, 2, 3]
    best = [d["best_predicted_speedup"] for d in drafts]
    assert best == sorted(best, reverse=True)
    costs = report["costs"]
    for d in drafts:
        assert [int(k) for k in d["acceptance_length"]] == KS
        for k in KS:
            al = d["acceptance_length"][str(k)]
            assert 1.0 <= al <= k + 1
            # A SLEM draft writes one token more than it proposes: k + 1 draft forwards per step, which the model
            # must charge (it ranked a SLEM draft too high when it charged k).
            forwards = k + 1 if d["measured_mode"] == "slem" else k
            assert d["draft_forwards"][str(k)] == forwards
            expected = ideal_speedup(al, costs["target_seconds"], costs["verify_seconds"][str(k)], d["draft_seconds"],
                                     k, forwards)
            assert d["predicted_speedup"][str(k)] == pytest.approx(expected, rel=1e-3)
        assert d["best_predicted_speedup"] == max(d["predicted_speedup"].values())
        assert d["predicted_speedup"][str(d["best_k"])] == d["best_predicted_speedup"]
        # the report rounds the ratio to 4 decimals: a ratio of 0.0348 is off by up to 1.4e-3 relative
        assert d["draft_to_target_cost_ratio"] == pytest.approx(d["draft_seconds"] / costs["target_seconds"], abs=5e-5)
        assert len(d["acceptance_by_position"]) == max(KS)
        head = ""
        if d["measured_mode"] == "slem":   # measured with the head auto gives SLEM: 99% of mistral's tokens -> 8192
            assert d["draft_head_rows_measured"] == 8192 == d["head_options"]["draft_vocab_size"]
            head = f" --draft-vocab-size 8192 --draft-vocab-corpus {d['head_options']['draft_vocab_corpus']}"
        assert d["command"] == (f"anydraft generate --target qwen3-target --draft {d['draft']} --vocab-mode "
                                f"{d['measured_mode']} -k {d['best_k']}{head}")
    assert report["provenance"]["git_commit"] and report["provenance"]["date"]
    assert "| rank | draft |" in report["markdown"]


def test_each_draft_gets_the_mode_auto_would_choose_and_why(report):
    by_name = {d["draft"]: d for d in report["drafts"]}
    same = by_name["qwen3-draft"]
    assert (same["auto_mode"], same["measured_mode"], same["same_vocabulary"]) == ("identity", "identity", True)
    assert same["tli_coverage"] is None and same["intersection_pct_of_draft"] == 100.0
    other = by_name["smollm2-draft"]
    # GSM8K train: qwen3 tokens 97.1% inside the intersection, smollm2's 99.5%: product 96.6%, above 95%
    assert (other["auto_mode"], other["measured_mode"], other["same_vocabulary"]) == ("tli", "tli", False)
    assert 0.95 <= other["tli_coverage"]["combined"] < 1.0
    assert other["tli_coverage"]["corpus"].endswith("train.jsonl")
    assert 39_000 <= other["intersection"] <= 39_400
    assert other["intersection_pct_of_target"] < other["intersection_pct_of_draft"] < 100   # 151k vs 49k tokens
    assert "same vocabulary" in same["auto_reason"] and "at least 95%" in other["auto_reason"]
    slem = by_name["mistral-draft"]   # qwen3 <-> mistral on GSM8K train: coverage ~94%, below 95%
    assert (slem["auto_mode"], slem["measured_mode"]) == ("slem", "slem") and slem["tli_coverage"]["combined"] < 0.95
    for d in (same, other, slem):
        assert 0 < d["head_rows_for_99pct"] < d["head_rows"]   # GSM8K uses few tokens


@pytest.mark.parametrize("drafts, message", [
    ("no-such-draft", "not a checkpoint directory nor a builtin model (qwen3-target, qwen3-draft"),
    ("qwen3-eagle3", "hidden-state drafter"),
    (",", "at least one draft"),
    ("qwen3-draft,qwen3-draft", "lists a draft twice"),
])
def test_bad_drafts_are_refused_before_loading_anything(capsys, drafts, message):
    assert main(["advise", "--target", "qwen3-target", "--drafts", drafts, "--num-prompts", "1"]) == 2
    assert message in capsys.readouterr().err
