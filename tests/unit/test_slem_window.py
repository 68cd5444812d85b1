"""SLEM's text -> target tokens (vocab/slem_window.py), on the five shared tokenizers and hand-made text.

Three properties: proposals spell a prefix of the draft's text; on text the target tokenizer itself wrote, the
proposals are exactly its own next tokens (the look-back boundary); and a proposal never changes when the
draft's text grows (the right edge: no token a longer text would split differently).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.vocab.slem_window import SlemWindow

NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Space runs, tabs, newlines, emoji (with a modifier), CJK, combining marks, digits, contractions, a literal ▁.
PIECES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "é", "日本語", "中", "🎉", "👍🏽", "e\u0301", "€",
          "x", "Hello", " world", "12", "345", "=", "$", "'s", " don't", "\u2581", "ab", "\u00a0", "ß", ".", "?\n"]
ADVERSARIAL = "a  b\t\tc\n\n  \n日本語のテキスト 🎉👍🏽 e\u0301 € ß 12345.67 don't  \u2581x  "
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join)


@pytest.fixture(scope="module")
def window_of(load_tokenizer):
    built: dict[str, SlemWindow] = {}

    def get(name: str) -> SlemWindow:
        if name not in built:
            built[name] = SlemWindow(load_tokenizer(name))
        return built[name]

    return get


def spelled(window: SlemWindow, target_ids: list[int]) -> bytes:
    return b"".join(window.token_bytes(t) for t in target_ids)


@pytest.fixture(scope="module")
def gsm8k_answers(shared_dir) -> list[str]:
    with open(shared_dir / "data" / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["answer"] for _, line in zip(range(6), f)]


@pytest.mark.parametrize("name", NAMES)
def test_on_the_targets_own_text_proposals_are_its_next_tokens(name, window_of, load_tokenizer, gsm8k_answers):
    """Cut the target's own tokenization anywhere: the rest of the text, given as the draft's (final) text,
    comes back as exactly the target's remaining tokens; as a growing (non-final) text, as a prefix of them."""
    window, tokenizer = window_of(name), load_tokenizer(name)
    checked = 0
    for text in gsm8k_answers + [ADVERSARIAL]:
        target_ids = tokenizer.encode_fragment(text)
        for cut in range(1, len(target_ids)):
            rest = spelled(window, target_ids[cut:])
            assert window.propose(target_ids[:cut], rest, final=True, max_tokens=10**6) == target_ids[cut:]
            for length in (1, 4, 9):
                growing = window.propose(target_ids[:cut], rest[:length], final=False, max_tokens=10**6)
                assert growing == target_ids[cut:cut + len(growing)]
            checked += 1
    assert checked > 300


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(verified=texts, new=texts, more=texts)
def test_a_proposal_never_changes_when_the_text_grows(name, window_of, load_tokenizer, verified, new, more):
    _assert_proposals_stay(window_of(name), load_tokenizer(name), verified, new, more)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("verified, new, more", [(" ", "\n \n", " "), (".x\n\n.", "\n \n \n\n", "\t\n\n?\nx\t\t"),
                                                 (" \r\n\r\n", "\r\n\t", "\r\nx?\n    ")])
def test_a_run_of_whitespace_re_splits_as_a_whole(name, window_of, load_tokenizer, verified, new, more):
    """Texts the property above once found: qwen3's \\s*[\\r\\n]+ joins '\\n', ' ' and a later '\\n' into one
    pre-token, so a growing text ending in whitespace may not propose the first pre-tokens of its whitespace run."""
    _assert_proposals_stay(window_of(name), load_tokenizer(name), verified, new, more)


def _assert_proposals_stay(window, tokenizer, verified: str, new: str, more: str) -> None:
    verified_ids = tokenizer.encode_fragment(verified)
    data = new.encode("utf-8")
    longer = (new + more).encode("utf-8")
    proposals = window.propose(verified_ids, data, final=False, max_tokens=10**6)
    assert data.startswith(spelled(window, proposals))
    # Any cut of the text, even mid-character, proposes a prefix of what the whole longer text proposes.
    grown = window.propose(verified_ids, longer, final=True, max_tokens=10**6)
    assert grown[:len(proposals)] == proposals
    for cut in range(1, len(data)):
        part = window.propose(verified_ids, data[:cut], final=False, max_tokens=10**6)
        assert grown[:len(part)] == part, f"cut {cut} of {data!r}"


@pytest.mark.parametrize("name, expected", [
    # byte-level BPE: pre-tokens are final once another starts after them; gpt2 keeps a number whole (" 12" could
    # become " 123"), qwen3 and smollm2 split digits one by one (" ", "1" are final; "2" could still be "23")
    ("gpt2", [" apples", " and", " he", " buys"]),
    ("qwen3", [" apples", " and", " he", " buys", " ", "1"]),
    ("smollm2", [" apples", " and", " he", " buys", " ", "1"]),
    # SentencePiece: only a ▁ after another char is a boundary no piece spans: the last word "▁12" is held back
    ("llama2", ["▁app", "les", "▁and", "▁he", "▁bu", "ys"]),
    ("mistral_v0.1", ["▁ap", "ples", "▁and", "▁he", "▁bu", "ys"]),
])
def test_the_last_word_waits_for_what_follows(name, expected, window_of, load_tokenizer):
    window, tokenizer = window_of(name), load_tokenizer(name)
    verified_ids = tokenizer.encode_fragment("Tom has 3")
    proposals = window.propose(verified_ids, b" apples and he buys 12", final=False, max_tokens=10)
    pieces = [tokenizer._hf.id_to_token(t).replace("\u0120", " ") for t in proposals]
    assert pieces == expected
    assert window.propose(verified_ids, b" apples and he buys 12", final=False, max_tokens=3) == proposals[:3]
    # At the end of the text (a special follows) the last word is final too.
    final = window.propose(verified_ids, b" apples and he buys 12", final=True, max_tokens=10)
    assert spelled(window, final) == b" apples and he buys 12"


@pytest.mark.parametrize("name", NAMES)
def test_text_ending_mid_character_proposes_no_part_of_it(name, window_of, load_tokenizer):
    window, tokenizer = window_of(name), load_tokenizer(name)
    verified_ids = tokenizer.encode_fragment("Party")
    emoji = "🎉".encode("utf-8")
    for cut in range(1, len(emoji)):
        proposals = window.propose(verified_ids, b" time, " + emoji[:cut], final=False, max_tokens=10)
        assert not any(b & 0x80 for b in spelled(window, proposals)), f"{name}: a byte of the cut emoji proposed"
    whole = window.propose(verified_ids, b" time, " + emoji + b" now", final=True, max_tokens=10)
    assert spelled(window, whole) == b" time, " + emoji + b" now"


@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_verified_text_ending_mid_character_is_completed_by_byte_tokens(name, window_of, load_tokenizer):
    """A byte-level target can have written the first bytes of a character (a random model does): the draft's
    text then begins with the rest of that character, which only byte tokens spell."""
    window, tokenizer = window_of(name), load_tokenizer(name)
    single_byte = tokenizer.token_table.single_byte_ids()
    emoji = "🎉".encode("utf-8")
    verified_ids = tokenizer.encode_fragment("Party ") + [single_byte[emoji[0]]]
    proposals = window.propose(verified_ids, emoji[1:] + b" time!", final=True, max_tokens=10)
    assert spelled(window, proposals) == emoji[1:] + b" time!"


@pytest.mark.parametrize("name", NAMES)
def test_max_tokens_and_empty_text(name, window_of, load_tokenizer):
    window, tokenizer = window_of(name), load_tokenizer(name)
    verified_ids = tokenizer.encode_fragment("Hello")
    assert window.propose(verified_ids, b"", final=False, max_tokens=5) == []
    assert window.propose(verified_ids, b" world and more", final=False, max_tokens=0) == []
    assert len(window.propose(verified_ids, b" world, and then some more words", final=False, max_tokens=2)) == 2
    # Invalid UTF-8 written by the draft: the text stops before it.
    proposals = window.propose(verified_ids, b" world, and \xff\xfe then", final=True, max_tokens=10)
    assert b" world, and ".startswith(spelled(window, proposals)) and proposals
