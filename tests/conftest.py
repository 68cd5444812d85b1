"""Shared fixtures: the ../shared directory (real tokenizers, GSM8K) and tokenizers parsed once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
TOKENIZER_NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED_DIR / "tokenizers").is_dir():
        pytest.skip(f"shared data not found at {SHARED_DIR}")
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
