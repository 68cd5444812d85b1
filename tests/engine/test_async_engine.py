"""The server's engine thread (anydraft/serve/async_engine.py) survives faults outside the engine step: a listener
that raises, or one request's output that cannot be posted, fails at most that request, and the next request is
served as LLM.generate serves it."""
from __future__ import annotations

import asyncio

import pytest

from anydraft.config import SamplingParams
from anydraft.output_processor import OutputProcessor
from anydraft.serve.async_engine import AsyncEngine
from anydraft.serve.metrics import ServerMetrics

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture
def served(ckpts, llms):
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_target, k=2)
    started: list[AsyncEngine] = []

    def start(on_finished=None) -> AsyncEngine:
        engine = AsyncEngine(llm.engine, ServerMetrics("tiny", 2), on_finished)
        engine.start()
        started.append(engine)
        return engine

    yield llm, start
    for engine in started:
        engine.stop()


def _run(engine: AsyncEngine, prompt: str) -> tuple[str, str | None, str | None]:
    """(text, finish_reason, error) of one request streamed to its end."""
    async def collect():
        text, reason, error = "", None, None
        async for delta in engine.stream([engine.new_request(prompt, PARAMS, None)]):
            text += delta.text
            reason, error = delta.finish_reason, delta.error or error
        return text, reason, error
    return asyncio.run(asyncio.wait_for(collect(), timeout=120))


def test_a_listener_that_raises_does_not_stop_the_engine_thread(served, prompts):
    llm, start = served
    expected = [o.outputs[0].text for o in llm.generate(prompts[1:3], PARAMS)]
    ended = []

    def listener(request):
        ended.append(request.request_id)
        raise RuntimeError("a listener bug")

    engine = start(listener)
    assert [_run(engine, p) for p in prompts[1:3]] == [(text, "length", None) for text in expected]
    engine.stop()   # the listener runs after the last delta is posted: wait for the thread
    assert len(ended) == 2


def test_a_request_whose_output_cannot_be_posted_fails_alone(served, prompts, monkeypatch):
    llm, start = served
    expected = llm.generate([prompts[2]], PARAMS)[0].outputs[0].text
    ended = []
    engine = start(lambda request: ended.append(request.finish_reason))
    real_take = OutputProcessor.take_delta
    faults = iter([True])

    def take_delta(request):
        if next(faults, False):
            raise ValueError("cannot detokenize")
        return real_take(request)

    monkeypatch.setattr(OutputProcessor, "take_delta", staticmethod(take_delta))
    text, reason, error = _run(engine, prompts[1])
    assert (reason, error) == ("abort", "the server failed on this request's output: ValueError: cannot detokenize")
    assert _run(engine, prompts[2]) == (expected, "length", None)
    engine.stop()
    assert ended == ["abort", "length"] and not llm.engine.has_unfinished()
