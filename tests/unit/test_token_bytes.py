"""Token bytes and the Tokenizer wrapper on the five real tokenizers; bad tokenizer directories."""
from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.tokenizer import Tokenizer, TokenizerError
from anydraft.vocab.token_bytes import ByteScheme, TokenKind, incomplete_utf8_tail

NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Characters that stress byte handling: multi-byte UTF-8 (2, 3, 4 bytes), whitespace runs, CRLF, combining marks.
TRICKY = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "é", "ü", "日本", "語", "🎉", "👍🏽", "e\u0301", "€",
                          "x", "Hello", " world", "12", "$", "<|im_end|>", "</s>", "\u00a0", "ß"])
TRICKY_TEXT = st.lists(TRICKY, max_size=12).map("".join) | st.text(max_size=30)


@pytest.mark.parametrize("name", NAMES)
def test_regular_token_bytes_match_reference(load_tokenizer, reference_token_bytes, name):
    table = load_tokenizer(name).token_table
    reference = reference_token_bytes(name)
    assert {i: table.token_bytes[i] for i in reference} == reference
    assert all(table.token_kinds[i] in (TokenKind.REGULAR, TokenKind.BYTE_FALLBACK) for i in reference)


@pytest.mark.parametrize("name", NAMES)
def test_token_bytes_agree_with_library_decode(load_tokenizer, name):
    """Where a token is complete UTF-8, the tokenizers library's own decode spells the same text."""
    tokenizer = load_tokenizer(name)
    table = tokenizer.token_table
    checked = 0
    for token_id in range(0, table.vocab_size, 37):  # a spread sample keeps this fast
        data = table.token_bytes[token_id]
        if table.token_kinds[token_id] != TokenKind.REGULAR:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        decoded = tokenizer.decode([token_id])
        if tokenizer.byte_scheme is ByteScheme.METASPACE and text.startswith(" "):
            text = text[1:]  # the SentencePiece decoder strips one leading space
        assert decoded == text, (token_id, data)
        checked += 1
    assert checked > 500


def test_schemes_and_sizes(load_tokenizer):
    sizes = {name: load_tokenizer(name).vocab_size for name in NAMES}
    assert sizes == {"qwen3": 151669, "smollm2": 49152, "llama2": 32000, "mistral_v0.1": 32000, "gpt2": 50257}
    assert load_tokenizer("qwen3").byte_scheme is ByteScheme.BYTE_LEVEL
    assert load_tokenizer("llama2").byte_scheme is ByteScheme.METASPACE


def test_gpt2_table_examples(load_tokenizer):
    tokenizer = load_tokenizer("gpt2")
    vocab = json.loads((tokenizer.path / "tokenizer.json").read_text())["model"]["vocab"]
    assert tokenizer.token_bytes(vocab["Ġthe"]) == b" the"
    assert tokenizer.token_bytes(vocab["Ċ"]) == b"\n"
    assert tokenizer.token_bytes(vocab["ĉ"]) == b"\t"


def test_partial_utf8_tokens_stay_bytes(load_tokenizer):
    table = load_tokenizer("qwen3").token_table
    partial = [b for b, kind in zip(table.token_bytes, table.token_kinds)
               if kind == TokenKind.REGULAR and incomplete_utf8_tail(b)]
    assert len(partial) > 100
    assert all(isinstance(b, bytes) for b in partial)


@pytest.mark.parametrize("name", ["llama2", "mistral_v0.1"])
def test_canonical_id_is_what_the_tokenizer_produces(load_tokenizer, name):
    tokenizer = load_tokenizer(name)
    table = tokenizer.token_table
    byte_piece = tokenizer._hf.token_to_id("<0x41>")
    regular_piece = tokenizer._hf.token_to_id("A")
    assert table.token_bytes[byte_piece] == table.token_bytes[regular_piece] == b"A"
    assert table.canonical_ids[b"A"] == regular_piece == tokenizer.encode_fragment("A")[0]
    # Every byte string shared by several ids: the canonical one is the tokenizer's own choice.
    groups: dict[bytes, list[int]] = {}
    for token_id, data in enumerate(table.token_bytes):
        if table.token_kinds[token_id] in (TokenKind.REGULAR, TokenKind.BYTE_FALLBACK):
            groups.setdefault(data, []).append(token_id)
    shared = {data: ids for data, ids in groups.items() if len(ids) > 1}
    assert len(shared) > 50
    for data, candidates in shared.items():
        produced = tokenizer.encode_fragment(data.decode("utf-8"))
        assert produced == [table.canonical_ids[data]], (data, candidates, produced)


def test_special_and_added_tokens_are_flagged(load_tokenizer):
    qwen = load_tokenizer("qwen3")
    kinds = qwen.token_table.token_kinds
    assert kinds[qwen._hf.token_to_id("<|im_end|>")] == TokenKind.SPECIAL
    assert kinds[qwen._hf.token_to_id("<think>")] == TokenKind.ADDED
    assert qwen.token_bytes(qwen._hf.token_to_id("<think>")) == b"<think>"
    llama = load_tokenizer("llama2")
    assert llama.token_table.token_kinds[llama.bos_token_id] == TokenKind.SPECIAL
    with pytest.raises(ValueError, match="not in the vocabulary"):
        qwen.token_bytes(151669)


def test_special_ids_and_encode(load_tokenizer):
    qwen, llama, smol = load_tokenizer("qwen3"), load_tokenizer("llama2"), load_tokenizer("smollm2")
    assert qwen.eos_token_ids == [151645, 151643]  # <|im_end|> (config) then <|endoftext|>
    assert qwen.pad_token_id == 151643 and qwen.bos_token_id is None
    assert {151643, 151644, 151645} <= qwen.special_ids
    assert llama.bos_token_id == 1 and llama.eos_token_ids == [2]
    # llama2's post-processor already adds <s>: exactly one BOS, and none without special tokens.
    assert llama.encode("Hello world") == [1, 15043, 3186]
    assert llama.encode("Hello world", add_special_tokens=False) == [15043, 3186]
    assert smol.encode("Hello")[0] != smol.bos_token_id  # no add_bos_token in its config
    for name in NAMES:
        tokenizer = load_tokenizer(name)
        assert tokenizer.decode(tokenizer.encode("The cat sat.\n 12 + 7 = 19")) == "The cat sat.\n 12 + 7 = 19"


def test_chat_template(load_tokenizer):
    qwen = load_tokenizer("qwen3")
    text = qwen.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert text.startswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n") and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(TokenizerError, match="no chat_template"):
        load_tokenizer("gpt2").apply_chat_template([{"role": "user", "content": "hi"}])


def test_content_hash_ignores_path(load_tokenizer, tmp_path):
    source = load_tokenizer("gpt2").path
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / file, tmp_path / file)
    assert Tokenizer.from_dir(tmp_path).content_hash == load_tokenizer("gpt2").content_hash


@SLOW
@given(text=TRICKY_TEXT)
def test_fragment_encoding_round_trips_bytes(load_tokenizer, text):
    """encode_fragment spells the text byte for byte: no dummy prefix, no normalization."""
    for name in NAMES:
        tokenizer = load_tokenizer(name)
        if tokenizer.byte_scheme is ByteScheme.METASPACE and "\u2581" in text:
            continue  # a literal ▁ reads back as a space; re-sync spells it with byte tokens instead
        table = tokenizer.token_table
        # smollm2 has no token for a few bytes (0x04, 0xF1...): the tokenizer drops exactly those.
        spellable = bytes(b for b in text.encode("utf-8") if table.single_byte_ids()[b] is not None)
        assert b"".join(table.token_bytes[i] for i in tokenizer.encode_fragment(text)) == spellable, name


@settings(max_examples=25, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"), max_size=30))
def test_native_encoding_bytes(load_tokenizer, text):
    """Native encoding: byte-level tokenizers spell the text; SentencePiece ones add one leading space."""
    for name in ("smollm2", "gpt2", "llama2"):
        tokenizer = load_tokenizer(name)
        table = tokenizer.token_table
        spelled = b"".join(table.token_bytes[i] for i in tokenizer.encode(text, add_special_tokens=False))
        expected = bytes(b for b in text.encode("utf-8") if table.single_byte_ids()[b] is not None)
        if tokenizer.byte_scheme is ByteScheme.METASPACE and text:
            expected = b" " + expected
        assert spelled == expected, name


# --- bad directories -----------------------------------------------------------------------------
def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: missing"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(TokenizerError, match="not a directory"):
        Tokenizer.from_dir(tmp_path / "nope")


def test_corrupt_json(tmp_path, shared_dir):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    shutil.copy(shared_dir / "tokenizers" / "gpt2" / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: not valid JSON"):
        Tokenizer.from_dir(tmp_path)


def test_wordpiece_and_unigram_are_refused(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import Unigram, WordPiece

    HFTokenizer(WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: unsupported tokenizer: model type 'WordPiece'"):
        Tokenizer.from_dir(tmp_path)
    HFTokenizer(Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0)).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="Unigram model without byte_fallback"):
        Tokenizer.from_dir(tmp_path)
