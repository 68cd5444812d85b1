"""Bad input never makes a 5xx: a catalogue of what a client can send (lone surrogates in every text field, odd
token-id prompts, out-of-range and non-finite numbers, unsupported options, malformed bodies, unknown routes) to
one live server with a chat template; each answer is a 2xx or a 4xx with OpenAI's error body naming the field,
and the odd-but-valid requests (text content parts, a surrogate pair, top_k above the vocabulary) succeed. Also:
an unexpected exception is a JSON 500, and a stream that fails after it started ends with an error event."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from anydraft.serve.api_server import ServeConfig, _Reply, create_app

DROP = object()   # an override that removes the field
COMPLETION = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


@dataclass
class Case:
    name: str
    path: str = "/v1/completions"
    body: object = None           # JSON-encoded with json.dumps (lone surrogates become "\udcxx" escapes)
    raw: bytes | None = None      # sent as is instead of body
    status: int = 200
    words: str = ""               # in the error message (lowercase compare)
    param: str | None = None      # the error's param, when the error names a field
    method: str = "POST"
    headers: dict = field(default_factory=dict)


def completion(**overrides) -> dict:
    body = {**COMPLETION, **overrides}
    return {k: v for k, v in body.items() if v is not DROP}


def chat(**overrides) -> dict:
    body = {**CHAT, **overrides}
    return {k: v for k, v in body.items() if v is not DROP}


def user(content) -> list[dict]:
    return [{"role": "user", "content": content}]


H = "/v1/chat/completions"
SURROGATE = "surrogate"
CATALOGUE = [
    # lone UTF-16 surrogates: valid JSON, not valid Unicode
    Case("prompt lone low surrogate", body=completion(prompt="ab\udcff"), status=400, words=SURROGATE, param="prompt"),
    Case("prompt lone high surrogate", body=completion(prompt="\ud83d"), status=400, words=SURROGATE, param="prompt"),
    Case("prompt list with a surrogate", body=completion(prompt=["a\udc80"]), status=400, words=SURROGATE,
         param="prompt.0"),
    Case("stop surrogate", body=completion(stop="\udcff"), status=400, words=SURROGATE, param="stop"),
    Case("stop list surrogate", body=completion(stop=["ok", "\udcff"]), status=400, words=SURROGATE, param="stop.1"),
    Case("model surrogate", body=completion(model="tiny\udcff"), status=400, words=SURROGATE, param="model"),
    Case("user surrogate", body=completion(user="\udcff"), status=400, words=SURROGATE, param="user"),
    Case("chat content surrogate", H, chat(messages=user("x\udcff")), status=400, words=SURROGATE,
         param="messages.0.content"),
    Case("chat text part surrogate", H, chat(messages=user([{"type": "text", "text": "\udcff"}])), status=400,
         words=SURROGATE, param="messages.0.content.0.text"),
    Case("chat role surrogate", H, chat(messages=[{"role": "us\udcffer", "content": "Hi"}]), status=400,
         words="role", param="messages.0.role"),
    Case("surrogate pair is an emoji", body=completion(prompt="smile \ud83d\ude00")),
    Case("NUL characters", body=completion(prompt="a\u0000b")),
    # token-id prompts
    Case("ids outside the vocabulary", body=completion(prompt=[10 ** 9]), status=400, words="outside the target",
         param="prompt"),
    Case("negative id", body=completion(prompt=[5, -1]), status=400, words="outside the target", param="prompt"),
    Case("id beyond 64 bits", body=completion(prompt=[2 ** 70]), status=400, words="not a 64-bit integer",
         param="prompt.0"),
    Case("empty id list", body=completion(prompt=[]), status=400, words="empty", param="prompt"),
    Case("nested id lists", body=completion(prompt=[[1, 2], [3]]), status=400, words="prompt", param="prompt"),
    Case("a batch of one id list", body=completion(prompt=[[1, 2]])),
    Case("mixed ids and text", body=completion(prompt=[1, "a"]), status=400, words="prompt", param="prompt"),
    Case("two prompts", body=completion(prompt=["a", "b"]), status=400, words="one request per prompt",
         param="prompt"),
    Case("only the end-of-text id", body=completion(prompt=[151643])),
    Case("special-token text", body=completion(prompt="<|endoftext|><|im_start|>")),
    Case("empty prompt", body=completion(prompt=""), status=400, words="prompt is empty", param="prompt"),
    Case("no prompt", body=completion(prompt=DROP), status=400, words="field required", param="prompt"),
    Case("prompt over max_model_len", body=completion(prompt="one two three " * 60), status=400,
         words="too long for max_model_len", param="prompt"),
    Case("prompt of a megabyte", body=completion(prompt="word " * 200_000), status=400, words="too long",
         param="prompt"),
    # lengths
    Case("huge max_tokens", body=completion(max_tokens=10 ** 30), status=400, words="lower max_tokens",
         param="max_tokens"),
    Case("max_tokens 0", body=completion(max_tokens=0), status=400, words="greater than or equal to 1",
         param="max_tokens"),
    Case("max_tokens negative", body=completion(max_tokens=-5), status=400, words="max_tokens", param="max_tokens"),
    Case("max_tokens fractional", body=completion(max_tokens=1.5), status=400, words="integer", param="max_tokens"),
    Case("max_tokens as a word", body=completion(max_tokens="many"), status=400, words="integer",
         param="max_tokens"),
    # sampling numbers
    Case("temperature negative", body=completion(temperature=-1), status=400, words="temperature",
         param="temperature"),
    Case("temperature NaN", raw=b'{"model": "tiny", "prompt": "a", "max_tokens": 2, "temperature": NaN}',
         status=400, words="finite", param="temperature"),
    Case("temperature Infinity", raw=b'{"model": "tiny", "prompt": "a", "max_tokens": 2, "temperature": Infinity}',
         status=400, words="finite", param="temperature"),
    Case("temperature 1e999 overflows to inf", raw=b'{"model": "tiny", "prompt": "a", "max_tokens": 2, '
                                                   b'"temperature": 1e999}', status=400, param="temperature"),
    Case("temperature 1e300", body=completion(temperature=1e300), status=400, words="less than or equal",
         param="temperature"),
    Case("temperature 1e30", body=completion(temperature=1e30, seed=1)),
    Case("temperature 1e-300", body=completion(temperature=1e-300, seed=1)),
    Case("temperature 1e-40 (float32 subnormal)", body=completion(temperature=1e-40, seed=1)),
    Case("top_p 0", body=completion(top_p=0, temperature=1), status=400, words="greater than 0", param="top_p"),
    Case("top_p above 1", body=completion(top_p=1.5, temperature=1), status=400, words="top_p", param="top_p"),
    Case("top_p NaN", raw=b'{"model": "tiny", "prompt": "a", "max_tokens": 2, "top_p": NaN}', status=400,
         param="top_p"),
    Case("top_p tiny", body=completion(top_p=1e-9, temperature=1, seed=1)),
    Case("top_k -2", body=completion(top_k=-2, temperature=1), status=400, words="top_k", param="top_k"),
    Case("top_k -1 (off)", body=completion(top_k=-1, temperature=1, seed=1)),
    Case("top_k 1", body=completion(top_k=1, temperature=1, seed=1)),
    Case("top_k above the vocabulary", body=completion(top_k=10 ** 7, temperature=1, seed=1)),
    Case("top_k 2**62", body=completion(top_k=2 ** 62, temperature=1, seed=1)),
    Case("top_k beyond 64 bits", body=completion(top_k=2 ** 64, temperature=1), status=400, param="top_k"),
    Case("top_k fractional", body=completion(top_k=2.5), status=400, words="integer", param="top_k"),
    Case("seed beyond 64 bits", body=completion(seed=2 ** 64, temperature=1), status=400, param="seed"),
    Case("seed below -2**63", body=completion(seed=-2 ** 63 - 1, temperature=1), status=400, param="seed"),
    Case("seed + n overflows", body=completion(seed=2 ** 64 - 1, n=2, temperature=1), status=400, words="seed",
         param="seed"),
    Case("seed negative", body=completion(seed=-7, temperature=1)),
    Case("n 0", body=completion(n=0), status=400, param="n"),
    Case("n 65", body=completion(n=65), status=400, param="n"),
    Case("n 2", body=completion(n=2, temperature=1, seed=3)),
    # stop strings
    Case("stop with 100 entries", body=completion(stop=[f"stop{i}" for i in range(100)])),
    Case("stop empty string", body=completion(stop="")),
    Case("stop list of empty strings", body=completion(stop=["", ""])),
    Case("stop a number", body=completion(stop=5), status=400, param="stop"),
    # options this server does not implement
    Case("logprobs", body=completion(logprobs=2)),
    Case("logprobs over 20", body=completion(logprobs=21), status=400, words="less than or equal to 20",
         param="logprobs"),
    Case("echo", body=completion(echo=True)),
    Case("suffix", body=completion(suffix="end"), status=400, words="not supported", param="suffix"),
    Case("best_of", body=completion(best_of=3), status=400, words="best_of", param="best_of"),
    Case("penalties and a logit bias", body=completion(presence_penalty=0.5, frequency_penalty=-0.5,
                                                       repetition_penalty=1.2, logit_bias={"13": -100, "+20": 5})),
    Case("chat penalties", H, chat(presence_penalty=1.0, logit_bias={"13": 2.5})),
    Case("presence_penalty above 2", body=completion(presence_penalty=2.5), status=400, words="less than or equal to 2",
         param="presence_penalty"),
    Case("frequency_penalty below -2", body=completion(frequency_penalty=-3), status=400,
         words="greater than or equal to -2", param="frequency_penalty"),
    Case("repetition_penalty 0", body=completion(repetition_penalty=0), status=400, words="greater than 0",
         param="repetition_penalty"),
    Case("logit_bias key not an id", body=completion(logit_bias={"hello": 1}), status=400, words="token ids",
         param="logit_bias"),
    Case("logit_bias id outside the vocabulary", body=completion(logit_bias={"10000000": 1}), status=400,
         words="outside the target vocabulary", param="logit_bias"),
    Case("logit_bias value above 100", body=completion(logit_bias={"13": 101}), status=400, words="[-100, 100]",
         param="logit_bias"),
    Case("logit_bias value NaN", raw=b'{"model": "tiny", "prompt": "a", "logit_bias": {"13": NaN}}', status=400,
         param="logit_bias"),
    Case("logit_bias not an object", body=completion(logit_bias=[1, 2]), status=400, param="logit_bias"),
    Case("penalty NaN", raw=b'{"model": "tiny", "prompt": "a", "presence_penalty": NaN}', status=400,
         param="presence_penalty"),
    Case("penalties 0 are no-ops", body=completion(presence_penalty=0, frequency_penalty=0.0)),
    Case("chat logprobs", H, chat(logprobs=True, top_logprobs=2)),
    Case("chat top_logprobs without logprobs", H, chat(top_logprobs=2), status=400, words="needs logprobs",
         param="top_logprobs"),
    Case("chat tools", H, chat(tools=[{"type": "function", "function": {"name": "f"}}]), status=400,
         words="not supported", param="tools"),
    Case("chat response_format json", H, chat(response_format={"type": "json_object"}), status=400,
         words="not supported", param="response_format"),
    Case("chat response_format text", H, chat(response_format={"type": "text"})),
    # model
    Case("unknown model", body=completion(model="gpt-4"), status=404, words="does not exist", param="model"),
    Case("no model", body=completion(model=DROP)),
    # streaming
    Case("stream with a bad temperature", body=completion(stream=True, temperature=-1), status=400,
         param="temperature"),
    Case("stream with a surrogate", H, chat(stream=True, messages=user("\udcff")), status=400, words=SURROGATE,
         param="messages.0.content"),
    Case("stream_options without stream", body=completion(stream_options={"include_usage": True}), status=400,
         words="stream: true", param="stream_options"),
    Case("stream_options a number", body=completion(stream=True, stream_options=3), status=400,
         param="stream_options"),
    Case("stream_options include_usage a word", body=completion(stream=True, stream_options={"include_usage": "x"}),
         status=400, param="stream_options.include_usage"),
    Case("stream_options unknown key", body=completion(stream=True, stream_options={"continuous_usage": True})),
    Case("stream a word", body=completion(stream="yes please"), status=400, param="stream"),
    Case("chat stream", H, chat(stream=True, stream_options={"include_usage": True})),
    # chat messages
    Case("messages empty", H, chat(messages=[]), status=400, words="at least 1", param="messages"),
    Case("messages missing", H, chat(messages=DROP), status=400, words="field required", param="messages"),
    Case("messages not a list", H, chat(messages="Hi"), status=400, param="messages"),
    Case("message a string", H, chat(messages=["Hi"]), status=400, param="messages.0"),
    Case("role missing", H, chat(messages=[{"content": "Hi"}]), status=400, words="field required",
         param="messages.0.role"),
    Case("role unknown", H, chat(messages=[{"role": "wizard", "content": "Hi"}]), status=400, words="user",
         param="messages.0.role"),
    Case("content null", H, chat(messages=[{"role": "user", "content": None}])),
    Case("content a number", H, chat(messages=user(5)), status=400, param="messages.0.content"),
    Case("content text parts", H, chat(messages=user([{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]))),
    Case("content image part", H, chat(messages=user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])),
         status=400, words="'image_url' are not supported", param="messages.0.content.0"),
    Case("content part without text", H, chat(messages=user([{"type": "text"}])), status=400, words="needs",
         param="messages.0.content.0"),
    Case("content part without type", H, chat(messages=user([{"text": "Hi"}])), status=400, words="field required",
         param="messages.0.content.0.type"),
    Case("system, assistant and developer turns", H, chat(messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "developer", "content": "Dev"},
        {"role": "user", "content": "Again"}])),
    Case("tool turn and null assistant content", H, chat(messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
        {"role": "tool", "content": "42"}, {"role": "user", "content": "So?"}])),
    Case("max_completion_tokens 0", H, chat(max_completion_tokens=0), status=400, param="max_completion_tokens"),
    Case("max_completion_tokens huge", H, chat(max_completion_tokens=10 ** 12), status=400,
         words="lower max_completion_tokens", param="max_completion_tokens"),
    # bodies that are not a request
    Case("malformed JSON", raw=b'{"model": "tiny", "prompt": "a",', status=400, words="not valid JSON at character"),
    Case("body a list", body=[1, 2], status=400, words="send a JSON object"),
    Case("body a string", body="prompt", status=400),
    Case("body null", raw=b"null", status=400),
    Case("body empty", raw=b"", status=400),
    Case("body not UTF-8", raw=b'{"model": "tiny", "prompt": "\xff\xfe"}', status=400, words="UTF-8"),
    Case("body deeply nested", raw=b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", status=400,
         words="nested too deeply"),
    Case("content-type text/plain", body=completion(), headers={"Content-Type": "text/plain"}, status=400,
         words="Content-Type: application/json"),
    Case("content-type form", raw=b"prompt=Hello&max_tokens=2", headers={"Content-Type":
                                                                         "application/x-www-form-urlencoded"},
         status=400),
    # routes and methods
    Case("models", "/v1/models", method="GET"),
    Case("POST /v1/models", "/v1/models", body={}, status=405, words="method not allowed"),
    Case("GET /v1/completions", method="GET", status=405, words="method not allowed"),
    Case("unknown route /tokenize", "/tokenize", body={"prompt": "a"}, status=404, words="not found"),
    Case("unknown route /v1/embeddings", "/v1/embeddings", body={"input": "a"}, status=404, words="not found"),
    Case("no API key", body=completion(), headers={"Authorization": ""}, status=401, words="api key"),
]


def send(server, case: Case) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json", **case.headers}
    content = case.raw if case.raw is not None else (None if case.body is None else json.dumps(case.body))
    return httpx.request(case.method, server.base_url + case.path, headers=headers, content=content, timeout=120)


def sse_events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


def test_the_catalogue_is_large():
    assert len(CATALOGUE) >= 28 and len({c.name for c in CATALOGUE}) == len(CATALOGUE)


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda c: c.name)
def test_bad_input_is_never_a_5xx(tiny_chat_server, case):
    response = send(tiny_chat_server, case)
    assert response.status_code < 500, (case.name, response.status_code, response.text[:500])
    assert response.status_code == case.status, (case.name, response.text[:500])
    if case.status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["code"] == case.status and isinstance(error["type"], str) and error["message"], error
        assert case.words.lower() in error["message"].lower(), (case.name, error)
        if case.param is not None:
            assert error["param"] == case.param, (case.name, error)
        return
    if case.method == "GET":
        assert response.json()["data"][0]["id"] == "tiny"
    elif (case.body or {}).get("stream"):
        events = sse_events(response.text)
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
        assert any(json.loads(e)["choices"] for e in events[:-1])
    else:
        choices = response.json()["choices"]
        assert len(choices) == (case.body or {}).get("n", 1) and all(c["finish_reason"] for c in choices)


def test_text_content_parts_read_as_their_joined_text(tiny_chat_server):
    client = tiny_chat_server.client()
    kwargs = dict(model="tiny", max_tokens=6, temperature=0)
    by_string = client.chat.completions.create(messages=user("Hello there"), **kwargs)
    by_parts = client.chat.completions.create(
        messages=user([{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]), **kwargs)
    assert by_parts.choices[0].message.content == by_string.choices[0].message.content
    assert by_parts.usage.prompt_tokens == by_string.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(messages=user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
                                       **kwargs)


def test_the_server_logged_no_traceback_and_still_serves(tiny_chat_server):
    """Runs after the catalogue (same file, in order): no request reached the catch-all handler."""
    ok = tiny_chat_server.client().completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1
    assert "Traceback" not in tiny_chat_server.log_path.read_text(errors="replace")


# -- the last line of defence, without a model -------------------------------------------------------------------
def test_an_unexpected_exception_is_a_json_500():
    app = create_app(ServeConfig(model="/nonexistent", speculative_config=None, served_model_name="m"))

    @app.get("/boom")
    async def boom():
        raise RuntimeError("kaboom")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal server error: RuntimeError: kaboom",
                                         "type": "InternalServerError", "param": None, "code": 500}}


def test_a_stream_that_fails_ends_with_an_error_event_then_done():
    async def failing_deltas():
        raise RuntimeError("the device went away")
        yield   # an async generator

    async def collect():
        reply = _Reply("m", chat=True, index_of={0: 0}, num_prompt_tokens=3)
        return [event async for event in reply.sse(failing_deltas(), include_usage=True)]

    events = sse_events("".join(asyncio.run(collect())))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 500 and "the device went away" in error["message"]

