"""Completions on a tiny random qwen3-vocabulary target (float64) with a TLI draft: streamed text equals the
whole response and `LLM.generate`, byte-level tokens that are partial UTF-8 included; stop strings, n, seeds,
include_usage; bad requests are 4xx with a message and the server keeps serving."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from anydraft.config import SamplingParams
from anydraft.model.kv_cache import BLOCK_TOKENS

from tiny_models import gsm8k_questions, tokenizer_of

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    questions = gsm8k_questions(4, start=20)
    return [questions[0], "Prix: 12 € — naïve café 世界", " ".join(questions[1].split()[:10]), "A"]


def _stream_text(client, **kwargs) -> tuple[str, list, object]:
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    return text, chunks, chunks[-1].usage


def _is_partial_utf8(token_bytes: bytes) -> bool:
    try:
        token_bytes.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_greedy_stream_equals_whole_equals_llm_generate(tiny_server, tiny_llm, tiny_ckpts, prompts):
    client = tiny_server.client()
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = tiny_llm.generate(prompts, greedy)
    tokenizer = tokenizer_of(tiny_ckpts.qwen3_target)
    # The outputs exercise the hold-back: tokens that are incomplete UTF-8 on their own.
    partial = [t for out in expected for t in out.outputs[0].token_ids if _is_partial_utf8(tokenizer.token_bytes(t))]
    assert partial
    for prompt, out in zip(prompts, expected):
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"ignore_eos": True})
        text, chunks, usage = _stream_text(client, model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"ignore_eos": True})
        assert whole.choices[0].text == text == out.outputs[0].text
        assert whole.usage.completion_tokens == usage.completion_tokens == len(out.outputs[0].token_ids) == MAX_TOKENS
        assert whole.usage.prompt_tokens == usage.prompt_tokens == len(out.prompt_token_ids)
        last_choice = [c for c in chunks if c.choices][-1].choices[0]
        assert whole.choices[0].finish_reason == "length" == last_choice.finish_reason
        # Each chunk is whole characters: no replacement character unless the text itself has one there.
        assert sum(c.choices[0].text.count("\ufffd") for c in chunks if c.choices) == text.count("\ufffd")
        spec = whole.choices[0].model_extra["spec_decode"]
        assert spec["num_draft_tokens"] == 3 * spec["num_drafts"]   # k = 3 every step (not adaptive here)
        assert spec["num_accepted_tokens"] <= spec["num_draft_tokens"] and 1 <= spec["acceptance_length"] <= 4


def test_stop_string_is_never_streamed(tiny_server, tiny_llm, prompts):
    client = tiny_server.client()
    [free] = tiny_llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    full = free.outputs[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip() and stop in full
    expected = full[:full.find(stop)]
    text, chunks, _ = _stream_text(client, model="tiny", prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0,
                                   stop=["<none>", stop], extra_body={"ignore_eos": True})
    whole = client.completions.create(model="tiny", prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0,
                                      stop=["<none>", stop], extra_body={"ignore_eos": True})
    assert text == whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "stop"
    assert not any(stop in c.choices[0].text for c in chunks if c.choices)


def test_n_choices_with_a_seed_reproduce_and_match_llm_generate(tiny_server, tiny_llm, prompts):
    """Choice i samples with seed + i; a seeded request reproduces whatever shares its batch."""
    client = tiny_server.client()
    kwargs = dict(model="tiny", prompt=prompts[2], max_tokens=24, temperature=1.0, seed=11, n=3)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1
    streamed = {i: "" for i in range(3)}
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert [streamed[i] for i in range(3)] == texts
    outs = tiny_llm.generate([prompts[2]] * 3, [SamplingParams(temperature=1.0, max_tokens=24, seed=11 + i)
                                                for i in range(3)])
    assert [o.outputs[0].text for o in outs] == texts
    assert first.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in outs)


def test_chat_without_a_template_is_a_clear_400(tiny_server):
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        tiny_server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])


def _post(server, body, key=None, raw: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or server.api_key}", "Content-Type": "application/json"}
    return httpx.post(server.base_url + "/v1/completions", headers=headers, timeout=120,
                      content=raw if raw is not None else json.dumps(body))


@pytest.mark.parametrize("case, body, raw, status, words", [
    ("malformed JSON", None, '{"model": "tiny", "prompt": "a",', 400, "JSON"),
    ("wrong type", {"model": "tiny", "prompt": "a", "max_tokens": "many"}, None, 400, "max_tokens"),
    ("wrong type nested", {"model": "tiny", "prompt": "a", "stream_options": 3, "stream": True}, None, 400,
     "stream_options"),
    ("negative temperature", {"model": "tiny", "prompt": "a", "temperature": -1}, None, 400, "temperature"),
    ("max_tokens over the context", {"model": "tiny", "prompt": "a b c", "max_tokens": 500}, None, 400,
     "maximum context length is 128"),
    ("empty prompt", {"model": "tiny", "prompt": ""}, None, 400, "prompt is empty"),
    ("prompt over max_model_len", {"model": "tiny", "prompt": "one two three " * 60}, None, 400,
     "too long for max_model_len 128"),
    ("logprobs over 20", {"model": "tiny", "prompt": "a", "logprobs": 21}, None, 400, "logprobs"),
    ("unknown model", {"model": "gpt-4", "prompt": "a"}, None, 404, "does not exist"),
    ("no prompt", {"model": "tiny"}, None, 400, "prompt"),
])
def test_bad_requests_are_4xx_with_a_message(tiny_server, case, body, raw, status, words):
    response = _post(tiny_server, body, raw=raw)
    assert response.status_code == status, (case, response.text)
    error = response.json()["error"]
    assert words.lower() in error["message"].lower(), (case, error)
    ok = _post(tiny_server, {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_wrong_api_key_is_401(tiny_server):
    response = _post(tiny_server, {"model": "tiny", "prompt": "a"}, key="wrong")
    assert response.status_code == 401 and "API key" in response.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(tiny_server.base_url + "/health").status_code == 200   # not behind the key


def test_concurrent_greedy_streams_equal_llm_generate(tiny_server, tiny_llm, prompts):
    """More requests than rows (4): they queue, join as rows free up, and each stream is still exact."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [o.outputs[0].text for o in tiny_llm.generate(prompts, params)]

    async def run():
        client = tiny_server.async_client()

        async def one(prompt):
            text = []
            async for chunk in await client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                                               temperature=0, stream=True,
                                                               extra_body={"ignore_eos": True}):
                text += [c.text for c in chunk.choices]
            return "".join(text)

        return await asyncio.gather(*(one(p) for p in prompts * 3))

    assert asyncio.run(run()) == expected * 3


def test_a_prompt_of_token_ids_equals_its_text(tiny_server, tiny_ckpts, prompts):
    client = tiny_server.client()
    target_ids = tokenizer_of(tiny_ckpts.qwen3_target).encode(prompts[2])
    by_text = client.completions.create(model="tiny", prompt=prompts[2], max_tokens=12, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=target_ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(target_ids)
    with pytest.raises(openai.BadRequestError, match="outside the target vocabulary"):
        client.completions.create(model="tiny", prompt=[10 ** 9], max_tokens=4)


def test_a_shared_prefix_hits_the_drafts_prefix_cache_too(tiny_server, tiny_llm, tiny_ckpts):
    """Fixed k here, so every request drafts and its draft reads its prompt: a second prompt sharing a prefix finds
    the draft's own tokens of that prefix cached (the TLI draft re-tokenizes the text), as the target finds its
    own; the texts stay those of LLM.generate."""
    client = tiny_server.client()
    prefix = " ".join(gsm8k_questions(2, start=400))[:300]
    prompts = [f"{prefix} {q[:40]}" for q in gsm8k_questions(2, start=410)]
    hits = 'anydraft:prefix_cache_hits_total{cache="%s"'
    before = {c: tiny_server.metric(hits % c) for c in ("target", "draft")}
    texts = [client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0).choices[0].text
             for p in prompts]
    gained = {c: tiny_server.metric(hits % c) - before[c] for c in ("target", "draft")}
    prefix_tokens = len(tokenizer_of(tiny_ckpts.qwen3_target).encode(prefix))
    assert prefix_tokens >= 48 and gained["target"] >= prefix_tokens - 32, (gained, prefix_tokens)
    assert gained["draft"] >= 16, gained     # at least one full block of the draft's own ids
    params = SamplingParams(temperature=0, max_tokens=6)
    assert texts == [o.outputs[0].text for o in tiny_llm.generate(prompts, params)]


def test_penalties_and_logit_bias_reach_the_engine(tiny_server, tiny_llm, prompts):
    """OpenAI's penalty fields, vLLM's repetition_penalty and a logit bias (string token ids) give the texts of
    LLM.generate with the same SamplingParams, streamed and whole; they differ from the unpenalized text."""
    client = tiny_server.client()
    fields = dict(presence_penalty=1.5, frequency_penalty=1.0)
    extra = {"repetition_penalty": 1.3, "ignore_eos": True}
    bias = {"13": 100.0, "11": -100.0}
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.3,
                            logit_bias={13: 100.0, 11: -100.0}, **fields)
    expected = tiny_llm.generate(prompts[:2], params)
    plain = tiny_llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for prompt, out, unpenalized in zip(prompts, expected, plain):
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, logit_bias=bias,
                                          extra_body=extra, **fields)
        text, _, _ = _stream_text(client, model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                  logit_bias=bias, extra_body=extra, **fields)
        assert whole.choices[0].text == text == out.outputs[0].text != unpenalized.outputs[0].text
        assert 13 in out.outputs[0].token_ids and 11 not in out.outputs[0].token_ids


def test_a_prompt_repeating_a_reply_reads_the_ids_the_model_generated(tiny_server, tiny_llm, tiny_ckpts):
    """The random target writes text in other pieces than its tokenizer reads it (partial UTF-8 among them): a
    prompt that repeats a finished completion's prompt and text is given the ids the model read and wrote, so
    those are prefix-cache hits, and the answer is LLM.generate's on exactly those ids."""
    client = tiny_server.client()
    tokenizer = tokenizer_of(tiny_ckpts.qwen3_target)
    # A reply is kept only where its ids spell its text's bytes (not one ending inside a character, which the text
    # shows as U+FFFD); the case that matters is one whose text encoded afresh reads other ids. The first greedy
    # reply of a few prompts and lengths that is both.
    candidates = [(" ".join(q.split()[:12]), n) for q in gsm8k_questions(8, start=430) for n in (40, 24, 12)]
    for prompt, max_tokens in candidates:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        generated = tiny_llm.generate([prompt], params)[0].outputs[0]
        spells = b"".join(tokenizer.token_bytes(i) for i in generated.token_ids) == generated.text.encode()
        if spells and tokenizer.encode(prompt + generated.text) != tokenizer.encode(prompt) + generated.token_ids:
            break
    else:
        pytest.fail("no candidate reply spells its text in other ids than its encoding")
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    assert first == generated.text
    known_ids = tokenizer.encode(prompt) + list(generated.token_ids)
    follow = prompt + first + " So the answer is"
    spliced = known_ids + tokenizer.encode_continuation(" So the answer is")
    assert spliced != tokenizer.encode(follow)   # control: the text encoded afresh reads other ids
    reused, hits = "anydraft:reply_reuse_tokens_total", 'anydraft:prefix_cache_hits_total{cache="target"'
    before = (tiny_server.metric(reused), tiny_server.metric(hits))
    second = client.completions.create(model="tiny", prompt=follow, max_tokens=8, temperature=0)
    assert tiny_server.metric(reused) - before[0] == len(known_ids)
    # Full blocks of what the first request's cache held (its prompt and output but the last token).
    assert tiny_server.metric(hits) - before[1] >= (len(known_ids) - 1) // BLOCK_TOKENS * BLOCK_TOKENS > 0
    assert second.usage.prompt_tokens == len(spliced)
    expected = tiny_llm.generate([{"prompt_token_ids": spliced}], SamplingParams(temperature=0, max_tokens=8))
    assert second.choices[0].text == expected[0].outputs[0].text
