"""Draft re-sync: the draft's ids spell the target's text, byte for byte, after every extend."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.vocab.bridge import VocabBridge
from anydraft.vocab.resync import DraftResync, ResyncState

# Each scheme on each side, and qwen3 (the largest vocabulary) as target and as draft.
PAIRS = [("qwen3", "llama2"), ("llama2", "qwen3"), ("mistral_v0.1", "smollm2"), ("gpt2", "mistral_v0.1"),
         ("smollm2", "gpt2"), ("llama2", "mistral_v0.1"), ("qwen3", "smollm2")]
PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIECES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "é", "ü", "日本語", "中", "🎉", "👍🏽", "e\u0301",
          "€", "x", "Hello", " world", "12", "=", "$", "<|im_end|>", "</s>", "\u2581", "ab", "\u00a0", "ß", "\x00"]


@pytest.fixture(scope="module")
def gsm8k_lines(shared_dir) -> list[str]:
    with open(shared_dir / "data" / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(40), f)]
    return [row["answer"] for row in rows] + [row["question"] for row in rows]


@pytest.fixture(scope="module")
def resync_of(load_tokenizer):
    built: dict[tuple[str, str], DraftResync] = {}

    def get(target: str, draft: str, window: int = 6) -> DraftResync:
        if (target, draft, window) not in built:
            target_tokenizer, draft_tokenizer = load_tokenizer(target), load_tokenizer(draft)
            bridge = VocabBridge.build(target_tokenizer, draft_tokenizer)
            built[target, draft, window] = DraftResync(bridge, target_tokenizer, draft_tokenizer, window=window)
        return built[target, draft, window]

    return get


def text_bytes(reference: dict[int, bytes], tokenizer, token_ids: list[int]) -> bytes:
    """Bytes by the independent reading for regular tokens; added tokens spell their content; specials nothing."""
    out = []
    for token_id in token_ids:
        if token_id in reference:
            out.append(reference[token_id])
        elif token_id not in tokenizer.special_ids:
            out.append(tokenizer._hf.id_to_token(token_id).encode("utf-8"))
    return b"".join(out)


def target_token_stream(tokenizer, segments: list[tuple[str, str]]) -> list[int]:
    """Target ids a model could emit: normal encodings, byte-by-byte spellings (splitting UTF-8
    characters across tokens) and special tokens (eos) in between."""
    single_byte = tokenizer.token_table.single_byte_ids()
    target_ids: list[int] = []
    for mode, text in segments:
        if mode == "bytes":
            target_ids += [single_byte[b] for b in text.encode("utf-8") if single_byte[b] is not None]
        elif mode == "eos":
            target_ids.append(tokenizer.eos_token_ids[0])
        else:
            target_ids += tokenizer.encode(text, add_special_tokens=False)
    return target_ids


SEGMENTS = st.lists(st.tuples(st.sampled_from(["text", "text", "bytes", "eos"]),
                              st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)
                              | st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)),
                    min_size=1, max_size=8)


def check_stream(resync: DraftResync, target_tok, draft_tok, target_ref, draft_ref, prompt: str,
                 target_ids: list[int], chunk_sizes: list[int]) -> ResyncState:
    state = resync.new_state(prompt)
    prompt_bytes = text_bytes(draft_ref, draft_tok, state.draft_ids)
    # Bytes the draft vocabulary has no token for (smollm2 lacks 0x04, 0xF1...) cannot be spelled.
    unspellable = bytes(b for b, token in enumerate(draft_tok.token_table.single_byte_ids()) if token is None)
    done, position, chunk_index = [], 0, 0
    while position < len(target_ids):
        size = chunk_sizes[chunk_index % len(chunk_sizes)] if chunk_sizes else 1
        chunk = target_ids[position: position + size]
        position, chunk_index = position + size, chunk_index + 1
        before = list(state.draft_ids)
        edit = resync.extend(state, chunk)
        done += chunk
        # The edit describes the change: rewind num_dropped, append `appended`.
        assert before[: len(before) - edit.num_dropped] + edit.appended == state.draft_ids
        expected = prompt_bytes + text_bytes(target_ref, target_tok, done)
        got = text_bytes(draft_ref, draft_tok, state.draft_ids) + state.pending
        assert got.translate(None, unspellable) == expected.translate(None, unspellable), (chunk, state.pending)
    return state


@pytest.mark.parametrize("target,draft", PAIRS)
def test_resync_invariant_property(resync_of, load_tokenizer, reference_token_bytes, target, draft):
    resync = resync_of(target, draft)
    target_tok, draft_tok = load_tokenizer(target), load_tokenizer(draft)
    target_ref, draft_ref = reference_token_bytes(target), reference_token_bytes(draft)

    @PROPERTY
    @given(segments=SEGMENTS, chunk_sizes=st.lists(st.integers(1, 5), max_size=4),
           prompt=st.sampled_from(["Question: 2+2?", " lead", "日本", "x\n", ""]))
    def run(segments, chunk_sizes, prompt):
        target_ids = target_token_stream(target_tok, segments)
        state = check_stream(resync, target_tok, draft_tok, target_ref, draft_ref, prompt, target_ids, chunk_sizes)
        if draft_tok.unk_token_id not in draft_tok.eos_token_ids:  # gpt2/smollm2 reuse eos as unk
            assert draft_tok.unk_token_id not in state.draft_ids[state.prompt_len:]  # never UNK for unknown text

    run()


@pytest.mark.parametrize("target,draft", PAIRS)
def test_resync_on_gsm8k(resync_of, load_tokenizer, reference_token_bytes, gsm8k_lines, target, draft):
    resync = resync_of(target, draft)
    target_tok, draft_tok = load_tokenizer(target), load_tokenizer(draft)
    for line in gsm8k_lines[:: 4]:
        target_ids = target_tok.encode(line, add_special_tokens=False)
        state = check_stream(resync, target_tok, draft_tok, reference_token_bytes(target),
                             reference_token_bytes(draft), "Question:", target_ids, [1, 3, 2])
        assert state.pending == b""


def test_intersection_tokens_map_one_to_one(resync_of, load_tokenizer):
    resync = resync_of("qwen3", "smollm2")
    qwen, smol = load_tokenizer("qwen3"), load_tokenizer("smollm2")
    state = resync.new_state("Hi")
    target_ids = qwen.encode(" The cat sat on the mat", add_special_tokens=False)
    edit = resync.extend(state, target_ids)
    assert edit.num_dropped == 0
    assert edit.appended == smol.encode(" The cat sat on the mat", add_special_tokens=False)


def test_no_dummy_prefix_mid_text(resync_of, load_tokenizer):
    """llama2 adds `▁` at the start of encoded text; a mid-text fragment must not get one."""
    resync = resync_of("qwen3", "llama2")
    qwen, llama = load_tokenizer("qwen3"), load_tokenizer("llama2")
    state = resync.new_state("Price")
    assert state.draft_ids == llama.encode("Price")
    prompt_bytes = resync.draft_text_bytes(state.draft_ids)
    assert prompt_bytes == b" Price"  # the draft's own prompt convention
    # "日本" splits into qwen3 tokens the draft has no counterpart for: they go through re-tokenization.
    resync.extend(state, qwen.encode(":日本語", add_special_tokens=False))
    assert resync.draft_text_bytes(state.draft_ids) + state.pending == b" Price:\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"


def test_split_multibyte_char_waits_for_completion(resync_of, load_tokenizer):
    resync = resync_of("qwen3", "llama2")
    qwen, llama = load_tokenizer("qwen3"), load_tokenizer("llama2")
    state = resync.new_state("a")
    target_ids = qwen.encode(" 🎉", add_special_tokens=False)
    assert [qwen.token_bytes(t) for t in target_ids] == [b" \xf0\x9f", b"\x8e", b"\x89"]  # splits the emoji
    edit = resync.extend(state, target_ids[:2])
    assert state.pending == b" \xf0\x9f\x8e" and edit.appended == []  # waits: no draft token for half a char
    edit = resync.extend(state, target_ids[2:])
    assert state.pending == b"" and edit.num_dropped == 0
    assert resync.draft_text_bytes(edit.appended) == " 🎉".encode("utf-8")
    assert llama.unk_token_id not in edit.appended
    # An incomplete tail at the end of generation can be flushed as byte tokens.
    resync.extend(state, target_ids[:1])
    edit = resync.flush(state)
    assert state.pending == b"" and resync.draft_text_bytes(edit.appended) == b" \xf0\x9f"


def test_special_target_tokens(resync_of, load_tokenizer):
    resync = resync_of("qwen3", "llama2")
    qwen, llama = load_tokenizer("qwen3"), load_tokenizer("llama2")
    state = resync.new_state("Hi")
    resync.extend(state, [qwen.eos_token_ids[0]])  # <|im_end|> pairs with </s> by role
    assert state.draft_ids[-1] == llama.eos_token_ids[0]
    length = len(state.draft_ids)
    edit = resync.extend(state, [qwen._hf.token_to_id("<|box_start|>")])  # no counterpart: skipped
    assert len(state.draft_ids) == length and edit.appended == []
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        resync.extend(state, [151700])


@pytest.mark.parametrize("target,draft,start", [("llama2", "qwen3", 151645), ("qwen3", "smollm2", 0),
                                                 ("mistral_v0.1", "gpt2", 50256), ("qwen3", "llama2", 1)])
def test_a_prompt_without_draft_text_starts_from_the_drafts_bos_or_end_token(resync_of, load_tokenizer, target,
                                                                             draft, start):
    """A prompt of special tokens only decodes to no text: the draft starts from its BOS (else its first end token),
    which spells nothing, so the invariant holds as the target's text follows."""
    resync = resync_of(target, draft)
    state = resync.new_state("")
    assert state.draft_ids == [start] and state.prompt_len == 1 and resync.draft_text_bytes(state.draft_ids) == b""
    target_tokenizer = load_tokenizer(target)
    target_ids = target_tokenizer.encode("Hello there", add_special_tokens=False)
    resync.extend(state, target_ids)
    spelled = b"".join(target_tokenizer.token_table.token_bytes[t] for t in target_ids)
    assert b"Hello there" in spelled and resync.draft_text_bytes(state.draft_ids) + state.pending == spelled


def test_identity_bridge_passes_ids_through(load_tokenizer):
    gpt2 = load_tokenizer("gpt2")
    resync = DraftResync(VocabBridge.build(gpt2, gpt2), gpt2, gpt2)
    state = resync.new_state("Hello")
    target_ids = gpt2.encode(" world, again", add_special_tokens=False)
    assert resync.extend(state, target_ids).appended == target_ids
    with pytest.raises(ValueError, match="window"):
        DraftResync(VocabBridge.build(gpt2, gpt2), gpt2, gpt2, window=0)


@pytest.mark.parametrize("target,draft", [("qwen3", "llama2"), ("qwen3", "smollm2"), ("gpt2", "mistral_v0.1")])
def test_append_direct_is_extend_for_the_rows_it_takes(resync_of, load_tokenizer, target, draft):
    """append_direct (a batch's re-sync in a few calls) against extend row by row: the rows it takes end exactly as
    extend leaves them, having only appended; the rows it leaves (pending bytes, a token outside the draft's
    vocabulary, a special) are untouched. Both kinds occur (the test would pass vacuously otherwise)."""
    resync = resync_of(target, draft)
    target_tok = load_tokenizer(target)
    taken = {True: 0, False: 0}

    @PROPERTY
    @given(rows=st.lists(st.tuples(SEGMENTS, st.integers(0, 40), SEGMENTS, st.sampled_from(["Q: ", "日本", "x\n"])),
                         min_size=1, max_size=5))
    def run(rows):
        states, news = [], []
        for before, cut, after, prompt in rows:
            state = resync.new_state(prompt)
            resync.extend(state, target_token_stream(target_tok, before)[:cut])   # may end mid-character: pending
            states.append(state)
            news.append(target_token_stream(target_tok, after) or [target_tok.eos_token_ids[0]])
        split_char = resync.new_state("Q: ")   # and a row waiting for the rest of a character: bytes pending
        split_char.pending = "日".encode()[:2]
        states.append(split_char)
        news.append(news[0])
        by_extend = [ResyncState(list(s.draft_ids), s.pending, s.prompt_len, s.dropped_bytes) for s in states]
        olds = [list(s.draft_ids) for s in states]
        appended = resync.append_direct(states, news)
        for state, old, new, done, reference in zip(states, olds, news, appended, by_extend):
            taken[done] += 1
            if done:
                resync.extend(reference, new)
                assert state == reference and state.draft_ids[:len(old)] == old
            else:
                assert state.draft_ids == old and state.pending == reference.pending

    run()
    assert taken[True] and taken[False], taken


def test_append_direct_leaves_a_bad_id_to_extend(resync_of, load_tokenizer):
    resync = resync_of("qwen3", "llama2")
    states = [resync.new_state("Q: "), resync.new_state("A: ")]
    vocab_size = len(load_tokenizer("qwen3").token_table.token_kinds)
    for bad in (-1, vocab_size):
        assert resync.append_direct(states, [[100], [bad]]) == [False, False]
        with pytest.raises(ValueError, match="outside the target vocabulary"):
            resync.extend(states[1], [bad])
