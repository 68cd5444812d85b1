"""`anydraft vocab`: plain and JSON reports, the cache flag, and user errors (exit 2, one line, no traceback)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from anydraft.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_json(capsys, *argv: str) -> dict:
    assert main(["vocab", *argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    return json.loads(out[0])


def test_json_report_and_cache(shared_dir, tmp_path, capsys):
    qwen, llama, smol = (str(shared_dir / "tokenizers" / n) for n in ("qwen3", "llama2", "smollm2"))
    report = run_json(capsys, qwen, llama, "--cache-dir", str(tmp_path))
    assert report["intersection"] >= 26_000
    assert {"target_vocab", "draft_vocab", "intersection", "build_seconds", "pct_target", "pct_draft",
            "unmatched_target", "unmatched_draft", "cached"} <= report.keys()
    assert report["target_vocab"] == 151669 and report["draft_vocab"] == 32000 and report["cached"] is False
    again = run_json(capsys, qwen, llama, "--cache-dir", str(tmp_path))
    assert again["cached"] is True and again["intersection"] == report["intersection"]
    report = run_json(capsys, qwen, smol, "--no-cache", "--target-rows", "151936", "--cache-dir", str(tmp_path))
    assert 39_000 <= report["intersection"] <= 39_400 and report["cached"] is False
    assert report["target_vocab_rows"] == 151936
    assert len(list(tmp_path.iterdir())) == 1  # --no-cache neither read nor wrote


def test_plain_report(shared_dir, tmp_path, capsys):
    gpt2, mistral = (str(shared_dir / "tokenizers" / n) for n in ("gpt2", "mistral_v0.1"))
    assert main(["vocab", gpt2, mistral, "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "intersection  21240 tokens" in out and "% of target" in out and "unmatched draft" in out
    assert "bridge built in" in out
    assert main(["vocab", gpt2, gpt2, "--cache-dir", str(tmp_path)]) == 0
    assert "identical vocabularies" in capsys.readouterr().out


@pytest.mark.parametrize("setup,message", [
    ("missing", "tokenizer.json: missing"),
    ("corrupt", "not valid JSON"),
    ("rows", "--target-rows must be positive"),
])
def test_user_errors_exit_2(shared_dir, tmp_path, capsys, setup, message):
    gpt2 = str(shared_dir / "tokenizers" / "gpt2")
    bad = tmp_path / "bad"
    bad.mkdir()
    argv = ["vocab", str(bad), gpt2, "--no-cache"]
    if setup == "corrupt":
        (bad / "tokenizer.json").write_text("{oops")
    if setup == "rows":
        argv = ["vocab", gpt2, gpt2, "--target-rows", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anydraft vocab: error: ") and message in err[0]


def test_error_in_a_real_process_has_no_traceback(tmp_path):
    """Through the installed entry point's code path in a fresh interpreter: one line on stderr."""
    result = subprocess.run([sys.executable, "-c", "import sys; from anydraft.cli import main; sys.exit(main())",
                             "vocab", str(tmp_path), str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "tokenizer.json: missing" in result.stderr


def test_corpus_coverage_report(shared_dir, tmp_path, capsys):
    """--draft-vocab-corpus: the share of the corpus's target tokens the draft can propose, and per head cut."""
    gpt2, mistral = (str(shared_dir / "tokenizers" / n) for n in ("gpt2", "mistral_v0.1"))
    corpus = tmp_path / "train.jsonl"
    corpus.write_text("\n".join((shared_dir / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:200]))
    report = run_json(capsys, gpt2, mistral, "--draft-vocab-corpus", str(corpus), "--cache-dir", str(tmp_path))
    coverage = report["draft_vocab_corpus"]
    assert 50 < coverage["proposable_pct"] < 100   # some GPT-2 tokens of this text have no Mistral twin
    assert [c["size"] for c in coverage["cuts"]] == [2048, 4096, 8192, 16384]   # < the 20k-token intersection
    percents = [c["coverage_pct"] for c in coverage["cuts"]]
    assert percents == sorted(percents) and percents[-1] == 100.0   # a few thousand tokens used in 200 records
    assert coverage["size_for_coverage"]["0.99"] <= coverage["size_for_coverage"]["0.999"] <= coverage["distinct_used"] + 5
    assert main(["vocab", gpt2, mistral, "--draft-vocab-corpus", str(corpus), "--cache-dir", str(tmp_path)]) == 0
    assert "99% needs" in capsys.readouterr().out
