"""The async engine: the engine's step loop in one background thread, one asyncio queue per request.

The HTTP handlers run on the event loop; the engine (caches, scheduler, proposer) is touched only by the
engine thread. Handlers hand it new requests and aborts through a thread-safe inbox, drained before every
step, so a request whose client went away leaves its cache row at the next step. After each step the thread
posts each updated request's delta (decided text, new ids, finish) to that request's asyncio queue.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..config import SamplingParams
from ..engine import Engine
from ..request import Request
from ..output_processor import OutputProcessor
from .metrics import ServerMetrics

logger = logging.getLogger("anydraft.serve")
LOG_INTERVAL_SECONDS = 10.0   # between the load log lines of a busy server (vLLM logs its stats as often)


@dataclass
class RequestDelta:
    request_id: int
    text: str                     # decided text since the previous delta
    target_ids: list[int]         # output ids since the previous delta
    finish_reason: str | None     # set on the last delta
    num_prompt_tokens: int
    num_output_tokens: int        # so far
    spec_decode: dict | None      # on the last delta: the request's speculative stats
    error: str | None = None      # the engine failed while running this request
    logprobs: list | None = None  # the logprob entries of target_ids, where the request asks for them
    prompt_logprobs: list | None = None   # on the first delta, where the request asks for them (None for token 0)


def num_drafts(stats) -> int:
    """Steps that drafted at least one token (vLLM's num_drafts); adaptive speculation may draft none in a step."""
    return stats.target_forwards - stats.k_histogram.get(0, 0)


def spec_decode_summary(request: Request) -> dict:
    """The per-request extra field of responses: AL and counts, defined in anydraft/metrics.py."""
    stats = request.stats
    return {"acceptance_length": round(stats.acceptance_length, 4), "num_drafts": num_drafts(stats),
            "num_draft_tokens": stats.num_drafted, "num_accepted_tokens": stats.num_accepted,
            "acceptance_by_position": [round(a, 4) for a in stats.acceptance_by_position]}


class AsyncEngine:
    def __init__(self, engine: Engine, metrics: ServerMetrics, on_finished=None):
        """on_finished(request): called on the engine thread when a request ends (finished, aborted or failed)."""
        self.engine, self.metrics, self.on_finished = engine, metrics, on_finished
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        # request_id -> (its loop, its queue, the request), from queued until its stream's last delta
        self._sinks: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Request]] = {}
        self._last_output: dict[int, float] = {}                                      # request_id -> time
        self._stopped = threading.Event()
        self._last_log = 0.0
        self._thread = threading.Thread(target=self._loop, name="anydraft-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._inbox.put(("wake", None, None))
        self._thread.join(timeout=30)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def new_request(self, prompt: str, params: SamplingParams, prompt_target_ids: list[int]) -> Request:
        """Validated on the caller's thread (a ValueError means a bad request); not queued yet."""
        return self.engine.new_request(prompt, params, prompt_target_ids)

    async def stream(self, requests: list[Request]) -> AsyncIterator[RequestDelta]:
        """Queue the requests (the n choices of one call) and yield their deltas, interleaved, until all have
        finished; leaving early (the client went away, the handler was cancelled) aborts those still running."""
        sink: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for request in requests:
            self._inbox.put(("add", request, (loop, sink)))
        running = {r.request_id: r for r in requests}
        try:
            while running:
                delta = await sink.get()
                if delta.finish_reason is not None:
                    running.pop(delta.request_id, None)
                yield delta
        finally:
            for request in running.values():
                self._inbox.put(("abort", request, None))

    # -- the engine thread --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            try:
                updated = self.engine.step()
            except Exception as e:   # a bug or a device error: fail the requests in flight, keep serving
                logger.exception("engine step failed")
                self._fail_all(f"the engine failed: {type(e).__name__}: {e}")
                continue
            now = time.perf_counter()
            for request in updated:
                try:
                    self._post(request, now)
                except Exception as e:   # a bug in one request's output: that request fails, the others go on
                    logger.exception("posting request %d's output failed", request.request_id)
                    self._fail(request, f"the server failed on this request's output: {type(e).__name__}: {e}")
            self.metrics.observe_spec(self.engine.stats)
            self.metrics.observe_queue(len(self.engine.scheduler.running), len(self.engine.scheduler.waiting))
            self.metrics.observe_caches(self.engine.kv_pools(), self.engine.scheduler.num_preemptions)
            if now - self._last_log >= LOG_INTERVAL_SECONDS:
                self._last_log = now
                logger.info(self.engine.load_summary())

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                kind, request, sink = item
                if kind == "add":
                    self._sinks[request.request_id] = (*sink, request)
                    self.engine.submit(request)
                elif kind == "abort" and request.request_id in self._sinks:
                    self.engine.abort(request)
                    self._finish(request, time.perf_counter())
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        self.metrics.observe_queue(len(self.engine.scheduler.running), len(self.engine.scheduler.waiting))

    def _post(self, request: Request, now: float) -> None:
        text, target_ids, logprobs = OutputProcessor.take_delta(request)
        first = request.request_id not in self._last_output   # no delta with tokens was posted before
        if target_ids:
            previous = self._last_output.get(request.request_id)
            self.metrics.observe_tokens(len(target_ids), previous is None, now - (previous or request.arrival))
            self._last_output[request.request_id] = now
        delta = RequestDelta(request.request_id, text, target_ids, request.finish_reason,
                             len(request.prompt_target_ids), len(request.output_target_ids),
                             spec_decode_summary(request) if request.finished else None, None, logprobs,
                             request.prompt_logprobs if first else None)
        loop, sink, _ = self._sinks[request.request_id]
        loop.call_soon_threadsafe(sink.put_nowait, delta)
        if request.finished:
            self._finish(request, now)

    def _finish(self, request: Request, now: float) -> None:
        self._sinks.pop(request.request_id, None)
        self._last_output.pop(request.request_id, None)
        self.metrics.observe_finished(request.finish_reason, len(request.prompt_target_ids), now - request.arrival)
        self._notify_finished(request)

    def _notify_finished(self, request: Request) -> None:
        if self.on_finished is None:
            return
        try:
            self.on_finished(request)
        except Exception:   # a listener's bug must not stop the engine thread (every stream would hang)
            logger.exception("on_finished failed for request %d", request.request_id)

    def _fail_all(self, message: str) -> None:
        """Every request with a stream still open: queued, running, or finished in the failed step unposted."""
        scheduled = list(self.engine.scheduler.running.values()) + list(self.engine.scheduler.waiting)
        for request in {id(r): r for r in scheduled + [r for _, _, r in self._sinks.values()]}.values():
            self._fail(request, message)

    def _fail(self, request: Request, message: str) -> None:
        """End the request (if still running) and its stream with the error, once."""
        self.engine.abort(request)
        request.finish_reason = "abort"   # whatever the engine had decided, the client gets the error
        loop, sink, _ = self._sinks.pop(request.request_id, (None, None, None))
        if sink is not None:
            failed = RequestDelta(request.request_id, "", [], "abort", len(request.prompt_target_ids),
                                  len(request.output_target_ids), None, message)
            loop.call_soon_threadsafe(sink.put_nowait, failed)
        self._last_output.pop(request.request_id, None)
        self._notify_finished(request)
