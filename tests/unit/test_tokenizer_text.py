"""Text no tokenizer can encode (a lone UTF-16 surrogate) is a ValueError naming the character, on every encode
path; a surrogate pair (one character) and other valid text encode as before."""
from __future__ import annotations

import json

import pytest

from anydraft.tokenizer import Tokenizer, check_text


@pytest.fixture(params=["qwen3", "llama2"])
def tokenizer(request, load_tokenizer) -> Tokenizer:
    return load_tokenizer(request.param)


@pytest.mark.parametrize("text, where, code", [("ab\udcff", 2, "DCFF"), ("\ud83d", 0, "D83D"),
                                               ("ok \ude00\ud83d", 3, "DE00")])
def test_a_lone_surrogate_is_a_value_error_naming_it(tokenizer, text, where, code):
    pattern = rf"lone UTF-16 surrogate \(U\+{code} at character {where}\).*send valid text"
    with pytest.raises(ValueError, match=pattern):
        tokenizer.encode(text)
    with pytest.raises(ValueError, match=pattern):
        tokenizer.encode(text, add_special_tokens=False)
    with pytest.raises(ValueError, match=pattern):
        tokenizer.encode_fragment(text)
    with pytest.raises(ValueError, match=rf"texts\[1\] contains a lone UTF-16 surrogate \(U\+{code}"):
        tokenizer.encode_batch(["fine", text], add_special_tokens=False)


def test_valid_text_still_encodes(tokenizer):
    emoji = json.loads('"smile \\ud83d\\ude00"')   # a pair in JSON is one character, U+1F600
    assert emoji == "smile \U0001F600"
    assert tokenizer.decode(tokenizer.encode(emoji, add_special_tokens=False)) == emoji
    check_text(emoji)


def test_a_non_string_is_a_type_error(tokenizer):
    with pytest.raises(TypeError):
        tokenizer.encode(None)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        check_text(b"abc")
