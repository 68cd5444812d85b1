"""The output processor: incremental detokenization (partial UTF-8 held back) and stop-string holdback."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.config import SamplingParams
from anydraft.output_processor import IncrementalDetokenizer, OutputProcessor, TextState

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


def _reference_append(processor: OutputProcessor, request, target_id: int) -> None:
    """The rule token by token: EOS first, then length, then the text (a stop string wins the reason)."""
    request.output_target_ids.append(target_id)
    params, state = request.params, request.text_state
    if target_id in processor.eos_ids and not params.ignore_eos:
        request.finish_reason, request.stop_reason = "stop", target_id
    elif (len(request.output_target_ids) >= params.max_tokens
          or len(request.prompt_target_ids) + len(request.output_target_ids) >= processor.max_model_len):
        request.finish_reason = "length"
    if state.feed(state.detokenizer.add(target_id)) or (request.finish_reason is not None and state.close()):
        request.finish_reason, request.stop_reason = "stop", state.stopped_by


def _request(processor: OutputProcessor, params: SamplingParams, prompt_len: int):
    return SimpleNamespace(output_target_ids=[], params=params, prompt_target_ids=[0] * prompt_len,
                           text_state=processor.start(params, prompt_len), finish_reason=None, stop_reason=None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_steps_tokens_at_once_equal_them_one_by_one(qwen3_processor, data):
    """extend (a step's tokens in one call, text decoded once where no stop string can cut it) and extend_rows (a
    step's rows in one call, text decoded when read) end, cut and spell the output as the token-by-token rule does:
    EOS, ignore_eos, max_tokens, max_model_len, stop strings (also completing across steps and on the EOS token),
    characters split across tokens and steps."""
    processor, vocabulary = qwen3_processor
    target_ids = data.draw(st.lists(st.sampled_from(vocabulary), min_size=1, max_size=40))
    stops = data.draw(st.lists(st.sampled_from(["#", "##", " 4", "é", "🙂🚀", "\n#", "zz"]), max_size=2))
    params = SamplingParams(temperature=0, max_tokens=data.draw(st.integers(1, 45)), stop=stops,
                            ignore_eos=data.draw(st.booleans()))
    prompt_len = data.draw(st.integers(1, 8))
    steps = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=40))
    reference, batched = _request(processor, params, prompt_len), _request(processor, params, prompt_len)
    # The same tokens through extend_rows, beside a request without stop strings that takes every step's tokens.
    in_rows, other = _request(processor, params, prompt_len), _request(processor, replace(params, stop=[]), prompt_len)
    for target_id in target_ids:
        _reference_append(processor, reference, target_id)
        if reference.finish_reason is not None:
            break
    at, kept_total = 0, 0
    for size in steps * 40:
        if batched.finish_reason is not None or at >= len(target_ids):
            break
        piece = target_ids[at:at + size]
        kept = processor.extend(batched, piece)
        assert kept == len(batched.output_target_ids) - kept_total and 1 <= kept <= size
        assert kept == min(size, len(target_ids) - at) or batched.finish_reason is not None   # cut only at the end
        rows = [request for request in (in_rows, other) if request.finish_reason is None]
        kept_in_rows, ended = processor.extend_rows(rows, [piece] * len(rows))
        assert kept_in_rows[0] == kept and ended == [r for r in rows if r.finish_reason is not None]
        if data.draw(st.booleans()):   # text read mid-way (a stream) or not (decoded when the output ends)
            assert batched.text_state.text == in_rows.text_state.text
        at, kept_total = at + size, kept_total + kept
    if batched.finish_reason is None:   # both ran out of tokens unfinished: decide the held text the same way
        assert reference.finish_reason is None
        reference.text_state.close(), batched.text_state.close(), in_rows.text_state.close()
    for request in (batched, in_rows):
        assert request.output_target_ids == reference.output_target_ids
        assert request.text_state.text == reference.text_state.text
        assert (request.finish_reason, request.stop_reason) == (reference.finish_reason, reference.stop_reason)
    alone = _request(processor, other.params, prompt_len)   # `other`, token by token
    for target_id in target_ids[:len(other.output_target_ids)]:
        _reference_append(processor, alone, target_id)
    if other.finish_reason is None:
        alone.text_state.close(), other.text_state.close()
    assert other.output_target_ids == alone.output_target_ids and other.text_state.text == alone.text_state.text
    assert (other.finish_reason, other.stop_reason) == (alone.finish_reason, alone.stop_reason)


@pytest.fixture(scope="module")
def qwen3_processor(load_tokenizer):
    tokenizer = load_tokenizer("qwen3")
    processor = OutputProcessor(tokenizer, max_model_len=40)
    vocabulary = sorted(set(tokenizer.encode(MULTIBYTE_TEXT, add_special_tokens=False)))
    # Tokens that spell or end a stop string, and EOS, drawn as often as the rest together: most examples then end
    # inside a step, with tokens after the end to cut.
    endings = sorted(set(tokenizer.encode(" zz ## 4 #", add_special_tokens=False)) | set(tokenizer.eos_token_ids))
    return processor, vocabulary + endings * (len(vocabulary) // len(endings))
