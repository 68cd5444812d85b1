"""Shared fixtures: the ../shared directory (real tokenizers, GSM8K) and tokenizers parsed once per session.

Two rules hold for the whole suite:
- Missing test data is an error, not a skip: without ../shared the run stops at once and names what is missing.
- A test may skip only for a documented hardware condition, its reason starting with "hardware:" (no AVX-512,
  no AVX512-VNNI, CUDA present or absent). Any other skip fails the run (see pytest_sessionfinish), so a
  green run never hides tests that did not run.
"""
from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
TOKENIZER_NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")
REQUIRED_DATA = [*(Path("tokenizers") / name / "tokenizer.json" for name in TOKENIZER_NAMES),
                 Path("data/gsm8k/train.jsonl"), Path("data/gsm8k/test.jsonl")]
HARDWARE_SKIP_PREFIX = "hardware:"


def pytest_configure(config):
    missing = [str(SHARED_DIR / p) for p in REQUIRED_DATA if not (SHARED_DIR / p).is_file()]
    if missing:
        raise pytest.UsageError(
            f"test data missing: {', '.join(missing)}. The tests need the project's shared data (tokenizers/ and "
            f"data/gsm8k/) in {SHARED_DIR}, beside this checkout.")


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    bad = [report for report in skipped if not _skip_reason(report).startswith(HARDWARE_SKIP_PREFIX)]
    if bad:
        for report in bad:
            reporter.write_line(f"NOT ALLOWED: {report.nodeid} skipped: {_skip_reason(report)}", red=True)
        reporter.write_line(f"{len(bad)} test(s) skipped for a reason other than '{HARDWARE_SKIP_PREFIX} ...'; "
                            f"a test must run or fail (tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _skip_reason(report) -> str:
    """The reason of a skipped report: longrepr is (file, line, 'Skipped: reason') for skips."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return SHARED_DIR


@pytest.fixture(scope="session")
def load_tokenizer(shared_dir):
    """name -> anydraft Tokenizer of ../shared/tokenizers/<name>, parsed once (qwen3 takes ~1 s)."""
    from anydraft.tokenizer import Tokenizer

    loaded: dict[str, Tokenizer] = {}

    def load(name: str) -> Tokenizer:
        if name not in loaded:
            loaded[name] = Tokenizer.from_dir(shared_dir / "tokenizers" / name)
        return loaded[name]

    return load


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """The GPT-2 byte<->unicode table, written out again here so the tests do not trust anydraft's copy."""
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in direct}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@pytest.fixture(scope="session")
def reference_token_bytes(shared_dir):
    """name -> {token id: bytes} for the regular (non-added) tokens, by a separate simple reading of
    tokenizer.json: byte-level pieces through the GPT-2 table, else `▁` -> space and `<0xNN>` -> byte."""
    import json
    import re

    unicode_to_byte = _gpt2_unicode_to_byte()
    computed: dict[str, dict[int, bytes]] = {}

    def reference(name: str) -> dict[int, bytes]:
        if name not in computed:
            tokenizer_json = json.loads((shared_dir / "tokenizers" / name / "tokenizer.json").read_text("utf-8"))
            added_ids = {a["id"] for a in tokenizer_json["added_tokens"]}
            byte_level = tokenizer_json["decoder"]["type"] == "ByteLevel"
            result = {}
            for piece, token_id in tokenizer_json["model"]["vocab"].items():
                if token_id in added_ids:
                    continue
                match = re.fullmatch(r"<0x([0-9A-F]{2})>", piece)
                if byte_level:
                    result[token_id] = bytes(unicode_to_byte[c] for c in piece)
                elif match:
                    result[token_id] = bytes([int(match.group(1), 16)])
                else:
                    result[token_id] = piece.replace("\u2581", " ").encode("utf-8")
            computed[name] = result
        return computed[name]

    return reference
