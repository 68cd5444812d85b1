"""The output processor: incremental detokenization (partial UTF-8 held back) and stop-string holdback."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from anydraft.output_processor import IncrementalDetokenizer, TextState

# Rare characters: even qwen3's large vocabulary spells them in several tokens that are partial UTF-8.
MULTIBYTE_TEXT = "Prix: 12 € — naïve café, 世界 你好 🙂🚀 and ünïcödé 𝔘𝔫𝔦 ꙮ 🪿🦜 ཀྲ ሰላም\n#### 42"


def _detokenizer(tokenizer) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tokenizer.token_table.token_bytes, frozenset(tokenizer.special_ids))


def test_incremental_text_equals_decode_and_never_shows_half_a_character(load_tokenizer):
    for name in ("qwen3", "gpt2", "smollm2"):
        tokenizer = load_tokenizer(name)
        target_ids = tokenizer.encode(MULTIBYTE_TEXT, add_special_tokens=False)
        # The text must exercise the hold-back: some token is an incomplete UTF-8 sequence on its own.
        partial = [t for t in target_ids if _is_partial_utf8(tokenizer.token_bytes(t))]
        assert partial, name
        detokenizer = _detokenizer(tokenizer)
        pieces = [detokenizer.add(t) for t in target_ids] + [detokenizer.flush()]
        assert "".join(pieces) == tokenizer.decode(target_ids) == MULTIBYTE_TEXT
        assert not any("\ufffd" in piece for piece in pieces)
        assert any(piece == "" for piece in pieces[:-1])   # held back while a character was incomplete


def test_special_tokens_add_no_text_and_invalid_bytes_match_decode(load_tokenizer):
    tokenizer = load_tokenizer("qwen3")
    target_ids = tokenizer.encode("a🪿b", add_special_tokens=False)
    emoji_ids = [t for t in target_ids if _is_partial_utf8(tokenizer.token_bytes(t))]
    # A lone piece of a character, then EOS, then text: decode replaces the broken bytes with U+FFFD.
    broken = [emoji_ids[0], tokenizer.eos_token_ids[0]] + tokenizer.encode(" ok", add_special_tokens=False)
    detokenizer = _detokenizer(tokenizer)
    text = "".join(detokenizer.add(t) for t in broken) + detokenizer.flush()
    assert text == tokenizer.decode(broken)
    assert "\ufffd" in text and "<|" not in text


def _is_partial_utf8(token_bytes: bytes) -> bool:
    try:
        token_bytes.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def _state(stops) -> TextState:
    return TextState(IncrementalDetokenizer([], frozenset()), list(stops))


def test_stop_string_split_across_pieces_is_held_then_cut():
    state = _state(["###"])
    assert not state.feed("The answer #")
    assert state.text == "The answer " and state.held == "#"
    assert not state.feed("#")
    assert state.text == "The answer "
    assert state.feed("# 42")
    assert state.text == "The answer " and state.held == ""


def test_held_text_is_released_when_it_cannot_become_a_stop():
    state = _state(["###", "STOP"])
    assert not state.feed("a ##")
    assert state.text == "a "
    assert not state.feed("x ST")
    assert state.text == "a ##x " and state.held == "ST"
    assert not state.close()
    assert state.text == "a ##x ST"


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.text(alphabet="ab#c", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="ab#c", min_size=1, max_size=4), max_size=3))
def test_holdback_matches_checking_the_whole_text_after_every_piece(pieces, stops):
    """Reference: after each piece, look for every stop in the whole text so far; cut at the earliest."""
    expected, seen = None, ""
    for piece in pieces:
        seen += piece
        found = [seen.find(s) for s in stops if s in seen]
        if found:
            expected = seen[:min(found)]
            break
    state = _state(stops)
    stopped = False
    for piece in pieces:
        stopped = state.feed(piece)
        # What is decided is always a prefix of the final text, and never contains a stop string.
        assert (expected or "".join(pieces)).startswith(state.text)
        assert not any(s in state.text for s in stops)
        if stopped:
            break
    if not stopped:
        assert not state.close()
    assert stopped == (expected is not None)
    assert state.text == (expected if expected is not None else "".join(pieces))
