"""The reply memory (anydraft/serve/reply_memory.py): a prompt that repeats a finished request's text gets that
request's ids, then its own text encoded as a continuation; what did not finish whole, or whose ids do not spell
the text the client got, is not kept; entries go least recently used first within a token budget."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from anydraft.serve.reply_memory import ReplyMemory

TEMPLATE_TAIL = "<|im_end|>\n<|im_start|>user\nAnd how many are left?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def qwen3(load_tokenizer):
    return load_tokenizer("qwen3")


def finished(request_id: int, prompt: str, prompt_ids: list[int], output_ids: list[int], text: str,
             finish_reason: str = "length", stop_reason=None):
    return SimpleNamespace(request_id=request_id, prompt=prompt, prompt_target_ids=prompt_ids,
                           output_target_ids=output_ids, text=text, finish_reason=finish_reason,
                           stop_reason=stop_reason)


def pieces(tokenizer, text: str) -> list[int]:
    """text written one character at a time: ids a model may generate, not the tokenizer's encoding of it."""
    return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]


def chat_turn(tokenizer, memory, request_id: int, reply: str, **kw):
    prompt = f"<|im_start|>user\nJanet has {request_id} apples.<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, _ = memory.encode(prompt, lambda t: tokenizer.encode(t, add_special_tokens=False))
    request = finished(request_id, prompt, prompt_ids, kw.pop("output_ids", None) or pieces(tokenizer, reply),
                       reply, **kw)
    memory.watch(request)
    memory.remember(request)
    return prompt, request


def test_a_repeated_reply_reads_the_generated_ids_then_the_new_text(qwen3):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    reply = "#### 12 = <<3*4=12>>12"
    prompt, request = chat_turn(qwen3, memory, 1, reply)
    next_prompt = prompt + reply + TEMPLATE_TAIL
    ids, num_reused = memory.encode(next_prompt, lambda t: pytest.fail("a remembered prefix was encoded afresh"))
    known = request.prompt_target_ids + request.output_target_ids
    assert num_reused == len(known) and ids[:num_reused] == known
    assert ids[num_reused:] == qwen3.encode(TEMPLATE_TAIL, add_special_tokens=False)   # <|im_end|> parsed as special
    # Control: the re-encoded text reads other ids for the same text (which is what the memory is for).
    fresh = qwen3.encode(next_prompt, add_special_tokens=False)
    assert fresh != ids and qwen3.decode(fresh, False) == qwen3.decode(ids, False) == next_prompt


def test_the_stop_token_is_left_to_the_template(qwen3):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    eos = qwen3.encode("<|im_end|>", add_special_tokens=False)[0]
    reply = "It is 7."
    prompt, request = chat_turn(qwen3, memory, 2, reply, output_ids=pieces(qwen3, reply) + [eos],
                                finish_reason="stop", stop_reason=eos)
    ids, num_reused = memory.encode(prompt + reply + TEMPLATE_TAIL, lambda t: [])
    assert num_reused == len(request.prompt_target_ids) + len(pieces(qwen3, reply))
    assert ids[num_reused] == eos and ids.count(eos) == 3   # once after the reply, as the template writes it


@pytest.mark.parametrize("case", ["stop string cut the text", "aborted", "never watched"])
def test_what_did_not_finish_whole_is_not_kept(qwen3, case):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    prompt = "Question: how many?\nAnswer:"
    prompt_ids = qwen3.encode(prompt)
    output_ids = qwen3.encode(" 12 apples\nQuestion:", add_special_tokens=False)
    text = " 12 apples\nQuestion:"
    reason = "length"
    if case == "stop string cut the text":
        text, reason = " 12 apples", "stop"   # stop=["\nQuestion:"]: the ids spell more than the client got
    elif case == "aborted":
        reason = "abort"
    request = finished(3, prompt, prompt_ids, output_ids, text, reason)
    if case != "never watched":
        memory.watch(request)
    memory.remember(request)
    assert len(memory) == 0
    assert memory.encode(prompt + text + " more", lambda t: ["fresh"]) == (["fresh"], 0)


def test_the_longest_remembered_text_wins_and_an_edited_reply_misses(qwen3):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    encode = lambda t: qwen3.encode(t, add_special_tokens=False)   # noqa: E731
    prompt, first = chat_turn(qwen3, memory, 4, "#### 4")
    turn2 = prompt + "#### 4" + TEMPLATE_TAIL
    turn2_ids, _ = memory.encode(turn2, encode)
    second = finished(5, turn2, turn2_ids, pieces(qwen3, "#### 8"), "#### 8")
    memory.watch(second)
    memory.remember(second)
    _, num_reused = memory.encode(turn2 + "#### 8" + TEMPLATE_TAIL, encode)
    assert num_reused == len(turn2_ids) + len(pieces(qwen3, "#### 8"))
    _, num_reused = memory.encode(turn2 + "#### 9" + TEMPLATE_TAIL, encode)   # a regenerated turn 2: turn 1 only
    assert num_reused == len(first.prompt_target_ids) + len(first.output_target_ids)
    assert memory.encode(prompt + "### 4" + TEMPLATE_TAIL, lambda t: ["fresh"]) == (["fresh"], 0)


def test_entries_leave_least_recently_used_first_within_the_token_budget(qwen3):
    sizes = []
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    for i in range(3):
        prompt, request = chat_turn(qwen3, memory, 10 + i, f"#### {i}")
        sizes.append(len(request.prompt_target_ids) + len(request.output_target_ids))
    # Room for two of the three: using the first makes the second the least recently used.
    small = ReplyMemory(qwen3, max_tokens=sizes[0] + sizes[2] + 1)
    prompts = [chat_turn(qwen3, small, 10 + i, f"#### {i}")[0] for i in range(2)]
    assert small.encode(prompts[0] + "#### 0", lambda t: [])[1] == sizes[0]
    chat_turn(qwen3, small, 12, "#### 2")
    assert len(small) == 2
    assert small.encode(prompts[1] + "#### 1", lambda t: ["fresh"]) == (["fresh"], 0)
    assert small.encode(prompts[0] + "#### 0", lambda t: [])[1] == sizes[0]


@pytest.mark.parametrize("name", ["qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2"])
def test_a_continuation_encodes_its_text_without_a_dummy_space(load_tokenizer, name):
    """What follows the remembered ids is encoded mid-text: ids + continuation decode to the whole text, as the
    whole text's own encoding does (a SentencePiece dummy prefix would add a space there)."""
    tokenizer = load_tokenizer(name)
    head, tail = "Natalia sold clips to 48 of her friends", " in April, and then she sold half as many."
    ids = tokenizer.encode(head) + tokenizer.encode_continuation(tail)
    assert tokenizer.decode(ids) == tokenizer.decode(tokenizer.encode(head + tail)) == head + tail
