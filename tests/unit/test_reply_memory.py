"""The reply memory (anydraft/serve/reply_memory.py): a prompt that repeats a finished request's text gets that
request's ids, then its own text encoded as a continuation; what did not finish whole, or whose ids do not spell
the text the client got, is not kept; entries go least recently used first within a token budget."""
from __future__ import annotations

import asyncio
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


def watch(memory, request, add_special_tokens: bool = False) -> None:
    """What the server does when a request's stream starts."""
    async def no_deltas():
        return
        yield

    async def stream():
        async for _ in memory.watching([request], add_special_tokens, no_deltas()):
            pass
    asyncio.run(stream())


def pieces(tokenizer, text: str) -> list[int]:
    """text written one character at a time: ids a model may generate, not the tokenizer's encoding of it."""
    return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]


def chat_turn(tokenizer, memory, request_id: int, reply: str, **kw):
    prompt = f"<|im_start|>user\nJanet has {request_id} apples.<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, _ = memory.encode(prompt, False)
    request = finished(request_id, prompt, prompt_ids, kw.pop("output_ids", None) or pieces(tokenizer, reply),
                       reply, **kw)
    watch(memory, request)
    memory.remember(request)
    return prompt, request


def test_a_repeated_reply_reads_the_generated_ids_then_the_new_text(qwen3):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    reply = "#### 12 = <<3*4=12>>12"
    prompt, request = chat_turn(qwen3, memory, 1, reply)
    next_prompt = prompt + reply + TEMPLATE_TAIL
    ids, num_reused = memory.encode(next_prompt, False)
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
    ids, num_reused = memory.encode(prompt + reply + TEMPLATE_TAIL, False)
    assert num_reused == len(request.prompt_target_ids) + len(pieces(qwen3, reply))
    assert ids[num_reused] == eos and ids.count(eos) == 3   # once after the reply, as the template writes it


@pytest.mark.parametrize("case", ["stop string cut the text", "ends inside a character", "holds a special token",
                                  "aborted", "never watched"])
def test_what_does_not_spell_its_text_or_did_not_finish_is_not_kept(qwen3, case):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    prompt = "Question: how many?\nAnswer:"
    prompt_ids = qwen3.encode(prompt)
    text = " 12 apples\nQuestion:"
    output_ids = qwen3.encode(text, add_special_tokens=False)
    reason = "length"
    if case == "stop string cut the text":
        text, reason = " 12 apples", "stop"   # stop=["\nQuestion:"]: the ids spell more than the client got
    elif case == "ends inside a character":   # cut after the first byte of "世": the text shows U+FFFD
        first_byte = next(i for i in range(qwen3.vocab_size) if qwen3.token_bytes(i) == "世".encode()[:1])
        output_ids, text = qwen3.encode(" 12 ", add_special_tokens=False) + [first_byte], " 12 \ufffd"
    elif case == "holds a special token":   # ignore_eos: the text leaves the end-of-turn token out
        output_ids = output_ids[:3] + qwen3.encode("<|im_end|>", add_special_tokens=False) + output_ids[3:]
    elif case == "aborted":
        reason = "abort"
    request = finished(3, prompt, prompt_ids, output_ids, text, reason)
    if case != "never watched":
        watch(memory, request, add_special_tokens=True)
    memory.remember(request)
    assert len(memory) == 0
    assert memory.encode(prompt + text + " more", True) == (qwen3.encode(prompt + text + " more"), 0)


def test_a_completions_entry_is_not_a_chat_prompts(qwen3):
    """A completion's prompt ids start with what encode() adds (BOS where the tokenizer adds one), a chat's come
    from its template: an entry is used only for prompts encoded the same way."""
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    prompt, reply = "Question: how many?\nAnswer:", "#### 4"
    request = finished(6, prompt, qwen3.encode(prompt), pieces(qwen3, reply), reply)
    watch(memory, request, add_special_tokens=True)
    memory.remember(request)
    assert memory.encode(prompt + reply + " next", True)[1] > 0
    assert memory.encode(prompt + reply + " next", False) == (qwen3.encode(prompt + reply + " next", False), 0)


def test_the_longest_remembered_text_wins_and_an_edited_reply_misses(qwen3):
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    prompt, first = chat_turn(qwen3, memory, 4, "#### 4")
    turn2 = prompt + "#### 4" + TEMPLATE_TAIL
    turn2_ids, _ = memory.encode(turn2, False)
    second = finished(5, turn2, turn2_ids, pieces(qwen3, "#### 8"), "#### 8")
    watch(memory, second)
    memory.remember(second)
    _, num_reused = memory.encode(turn2 + "#### 8" + TEMPLATE_TAIL, False)
    assert num_reused == len(turn2_ids) + len(pieces(qwen3, "#### 8"))
    _, num_reused = memory.encode(turn2 + "#### 9" + TEMPLATE_TAIL, False)   # a regenerated turn 2: turn 1 only
    assert num_reused == len(first.prompt_target_ids) + len(first.output_target_ids)
    assert memory.encode(prompt + "### 4" + TEMPLATE_TAIL, False)[1] == 0


def test_entries_leave_least_recently_used_first_within_the_token_budget(qwen3):
    sizes = []
    memory = ReplyMemory(qwen3, max_tokens=10_000)
    for i in range(3):
        prompt, request = chat_turn(qwen3, memory, 10 + i, f"#### {i}")
        sizes.append(len(request.prompt_target_ids) + len(request.output_target_ids))
    # Room for two of the three: using the first makes the second the least recently used.
    small = ReplyMemory(qwen3, max_tokens=sizes[0] + sizes[2] + 1)
    prompts = [chat_turn(qwen3, small, 10 + i, f"#### {i}")[0] for i in range(2)]
    assert small.encode(prompts[0] + "#### 0", False)[1] == sizes[0]
    chat_turn(qwen3, small, 12, "#### 2")
    assert len(small) == 2
    assert small.encode(prompts[1] + "#### 1", False)[1] == 0
    assert small.encode(prompts[0] + "#### 0", False)[1] == sizes[0]


@pytest.mark.parametrize("name", ["qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2"])
def test_a_continuation_encodes_as_the_whole_text_does(load_tokenizer, name):
    """What follows the remembered ids is encoded mid-text: split at a space, and across special tokens (each
    piece after one normalized as encode() does it), the ids are the whole text's own."""
    tokenizer = load_tokenizer(name)
    end = tokenizer.decode([tokenizer.eos_token_ids[0]], skip_special_tokens=False)
    head, tail = "Natalia sold clips to 48 of her friends", f" in April,{end} and then{end}[INST] half as many."
    ids = tokenizer.encode(head, add_special_tokens=False) + tokenizer.encode_continuation(tail)
    assert ids == tokenizer.encode(head + tail, add_special_tokens=False)
