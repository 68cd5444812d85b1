"""Logprobs through the server (tiny float64 target, TLI draft, speculation on): completions with logprobs and
echo give the prompt's and the output's logprobs equal to LLM.generate's (lm-eval's loglikelihood request: echo,
logprobs 1, max_tokens 1, and max_tokens 0), streamed as whole; chat logprobs streamed equal not streamed."""
from __future__ import annotations

import pytest

from anydraft.config import SamplingParams

from tiny_models import gsm8k_questions

# Server and LLM run the same engine settings but may batch differently: float64 sums in another order agree to
# rounding (tests/engine/test_logprobs.py).
TOLERANCE = 1e-12


def close(values, wanted) -> bool:
    return len(values) == len(wanted) and all(
        (a is None and b is None) or abs(a - b) <= TOLERANCE * max(1.0, abs(b)) for a, b in zip(values, wanted))


@pytest.fixture(scope="module")
def prompt() -> str:
    return gsm8k_questions(1, start=30)[0]


def test_completion_logprobs_with_echo_equal_llm_generate(tiny_server, tiny_llm, prompt):
    client = tiny_server.client()
    out = tiny_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5,
                                                   prompt_logprobs=5))[0]
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, logprobs=5,
                                      echo=True, extra_body={"ignore_eos": True})
    choice = whole.choices[0]
    assert choice.text == prompt + out.outputs[0].text
    lp = choice.logprobs
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    wanted = [None] + [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])] + \
        [d[t].logprob for d, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids)]
    assert close(lp.token_logprobs, wanted)
    assert lp.top_logprobs[0] is None and all(len(top) >= 5 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # Greedy output: each output token is its position's most likely one.
    for token_logprob, top in zip(lp.token_logprobs[len(out.prompt_token_ids):],
                                  lp.top_logprobs[len(out.prompt_token_ids):]):
        assert token_logprob == max(top.values())
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, logprobs=5,
                                            echo=True, stream=True, extra_body={"ignore_eos": True}))
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_the_loglikelihood_request_of_lm_eval(tiny_server, tiny_llm, prompt, max_tokens):
    """lm-eval sends the context and continuation as a batch of token-id lists (one at batch size 1) with echo,
    logprobs 1 and max_tokens 1 (or 0), and sums token_logprobs over the continuation's positions."""
    tokenizer = tiny_llm.tokenizer
    ids = tokenizer.encode(prompt)
    response = tiny_server.client().completions.create(model="tiny", prompt=[ids], max_tokens=max_tokens,
                                                       temperature=0, logprobs=1, echo=True, seed=1234)
    lp = response.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + max_tokens
    out = tiny_llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1,
                                                                        prompt_logprobs=1))[0]
    wanted = [None] + [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]
    assert close(lp.token_logprobs[:len(ids)], wanted)
    assert response.usage.completion_tokens == max_tokens


def test_max_tokens_zero_needs_echo(tiny_server, prompt):
    import openai
    with pytest.raises(openai.BadRequestError, match="only with echo"):
        tiny_server.client().completions.create(model="tiny", prompt=prompt, max_tokens=0)


def same_content(streamed, whole) -> bool:
    """Tokens, bytes and alternatives equal; logprobs to rounding (the second request's prompt comes from the prefix
    cache, so its prefill computes fewer positions: float64 sums of another shape)."""
    def tokens(content):
        return [(t.token, t.bytes, [(a.token, a.bytes) for a in t.top_logprobs]) for t in content]

    def values(content):
        return [v for t in content for v in [t.logprob] + [a.logprob for a in t.top_logprobs]]
    return tokens(streamed) == tokens(whole) and close(values(streamed), values(whole))


def test_chat_logprobs_streamed_equal_not_streamed(tiny_chat_server, prompt):
    client = tiny_chat_server.client()
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=10, temperature=0,
                  logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).choices[0]
    content = whole.logprobs.content
    assert len(content) == 10 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob == t.top_logprobs[0].logprob for t in content)   # greedy: the chosen token is the top one
    assert all(bytes(t.bytes).decode("utf-8", errors="replace") == t.token for t in content)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert same_content(streamed, content)
    # Sampled, seeded: the same tokens and logprobs either way, each the raw logprob (temperature does not enter).
    sampled = dict(kwargs, temperature=1.5, seed=7)
    whole = client.chat.completions.create(**sampled).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(stream=True, **sampled))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert same_content(streamed, whole)
