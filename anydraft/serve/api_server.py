"""The OpenAI-compatible HTTP API (FastAPI on uvicorn): translates requests and streams to the async engine.

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with stream: true as server-sent events
ending in `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus text). The model loads in a
background thread after the socket is up; until it is ready every endpoint but /metrics answers 503.
Every failure answers OpenAI's error body ({"error": {"message", "type", "param", "code"}}): a 4xx for what the
client sent, a 500 for a server fault; a stream that fails after it started ends with that body as its last
event before `data: [DONE]` (docs/errors.md).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SpeculativeConfig
from ..tokenizer import TokenizerError
from .async_engine import AsyncEngine, RequestDelta
from .logprob_format import CompletionLogprobs, chat_logprobs
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics
from .protocol import ApiError, ChatCompletionRequest, CompletionRequest, validation_error
from .reply_memory import ReplyMemory

logger = logging.getLogger("anydraft.serve")


@dataclass
class ServeConfig:
    """What `anydraft serve` loads and how it answers (vLLM's names)."""
    model: str
    speculative_config: dict | None
    served_model_name: str
    dtype: str = "bfloat16"
    device: str | None = None
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    api_key: str | None = None
    kv_cache_memory: int | str | None = None
    enable_prefix_caching: bool = True
    reuse_reply_ids: bool = True   # a prompt repeating a finished request's text gets its generated ids
    llm_kwargs: dict = field(default_factory=dict)


class ServerState:
    """The loaded model, or why it is not there yet."""

    def __init__(self, config: ServeConfig, on_load_error=None):
        self.config = config
        self.on_load_error = on_load_error   # called with the message when loading fails (the CLI exits)
        self.engine: AsyncEngine | None = None
        self.tokenizer = None
        self.replies: ReplyMemory | None = None
        self.load_error: str | None = None
        spec = SpeculativeConfig.from_any(config.speculative_config)   # validated here: a bad one fails at start
        k = 0 if spec is None else spec.num_speculative_tokens
        self.metrics = ServerMetrics(config.served_model_name, k)

    def load(self) -> None:
        from ..llm import LLM
        c = self.config
        try:
            llm = LLM(model=c.model, speculative_config=c.speculative_config, dtype=c.dtype, device=c.device,
                      max_model_len=c.max_model_len, max_num_seqs=c.max_num_seqs,
                      max_num_batched_tokens=c.max_num_batched_tokens, kv_cache_memory=c.kv_cache_memory,
                      enable_prefix_caching=c.enable_prefix_caching, **c.llm_kwargs)
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            logger.exception("loading the model failed")
            if self.on_load_error is not None:
                self.on_load_error(self.load_error)
            return
        self.tokenizer = llm.tokenizer
        if c.reuse_reply_ids and c.enable_prefix_caching:   # the ids only help where the cache holds their KV
            self.replies = ReplyMemory(llm.tokenizer, llm.engine.target.cache.num_tokens)
        engine = AsyncEngine(llm.engine, self.metrics, None if self.replies is None else self.replies.remember)
        engine.start()
        self.engine = engine
        logger.info("ready: %s (%s)", c.served_model_name, llm.draft_info.get("vocab_mode") or "target alone")

    def ready(self) -> AsyncEngine:
        if self.engine is None:
            raise ApiError(503, f"the model failed to load: {self.load_error}" if self.load_error
                           else "the model is still loading; retry shortly")
        return self.engine


def create_app(config: ServeConfig, load_in_background: bool = True, on_load_error=None) -> FastAPI:
    """The app; it loads the model at startup (in the background: /health answers 503 until it is ready).
    on_load_error(message): called where loading fails, e.g. to stop the server."""
    state = ServerState(config, on_load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = threading.Thread(target=state.load, name="anydraft-load", daemon=True)
        loader.start()
        if not load_in_background:
            await asyncio.to_thread(loader.join)
        yield
        if state.engine is not None:
            await asyncio.to_thread(state.engine.stop)

    app = FastAPI(title="anydraft", lifespan=lifespan)
    app.state.anydraft = state

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_, e: RequestValidationError):
        return error_response(validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        message = str(e.detail)
        if e.status_code == 400 and message == "There was an error parsing the body":   # FastAPI's, for non-UTF-8
            message += " (not UTF-8, or nested too deeply); send a JSON object in UTF-8"
        return error_response(ApiError(e.status_code, message), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def server_fault(_, e: Exception):   # a bug: still the error body (Starlette re-raises it to the log)
        return error_response(ApiError(500, f"internal server error: {type(e).__name__}: {e}"))

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if config.api_key and request.url.path.startswith("/v1"):
            if request.headers.get("authorization", "") != f"Bearer {config.api_key}":
                return error_response(ApiError(401, "invalid or missing API key (Authorization: Bearer ...)"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        state.ready()
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        state.ready()
        return {"object": "list", "data": [{"id": config.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "anydraft", "root": config.model,
                                            "max_model_len": state.engine.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        engine = _checked(state, body)
        prompt, prompt_ids = body.prompt_input()
        text_specials = None if prompt is None else True   # a completion's text gets what encode() adds (BOS)
        if prompt_ids is None:
            prompt_ids = _encode(state, prompt, "prompt", text_specials) if prompt else []
        return await _serve(state, engine, body, raw, prompt, prompt_ids, body.max_tokens, chat=False,
                            text_specials=text_specials)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        engine = _checked(state, body)
        if state.tokenizer.chat_template is None:
            raise ApiError(400, f"this model's tokenizer ({config.model}) has no chat template, so chat completions "
                                f"cannot be formatted; use /v1/completions")
        try:
            prompt = state.tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
        except (TokenizerError, TemplateError) as e:
            raise ApiError(400, f"the model's chat template cannot format these messages: {e}", "messages") from e
        text_specials = False   # the template writes the specials itself
        prompt_ids = _encode(state, prompt, "messages", text_specials)
        return await _serve(state, engine, body, raw, prompt, prompt_ids, body.requested_max_tokens, chat=True,
                            text_specials=text_specials)

    return app


def error_response(e: ApiError, headers: dict | None = None) -> JSONResponse:
    """The error body as ASCII JSON: a message may quote what the client sent, which need not be valid UTF-8."""
    return _AsciiJSONResponse(e.body(), status_code=e.status, headers=headers)


class _AsciiJSONResponse(JSONResponse):
    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True).encode("ascii")


def _encode(state: ServerState, text: str, field_name: str, add_special_tokens: bool) -> list[int]:
    """The prompt's target ids: a finished request's generated ids for the text it repeats (the reply memory)."""
    try:
        if state.replies is None:
            return state.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        prompt_ids, num_reused = state.replies.encode(text, add_special_tokens)
        state.metrics.observe_reply_reuse(num_reused)
        return prompt_ids
    except ValueError as e:   # text the tokenizer refuses (a lone surrogate), should the models let one through
        raise ApiError(400, f"{field_name}: {e}", field_name) from e


def _checked(state: ServerState, body) -> AsyncEngine:
    engine = state.ready()
    name = state.config.served_model_name
    if body.model is not None and body.model not in (name, state.config.model):
        raise ApiError(404, f"the model '{body.model}' does not exist; this server serves '{name}'", "model")
    body.refuse_unsupported()
    return engine


async def _serve(state: ServerState, engine: AsyncEngine, body, raw: Request, prompt: str | None, prompt_ids: list[int],
                 max_tokens: int | None, chat: bool, text_specials: bool | None):
    """text_specials: how the prompt's text was encoded (add_special_tokens), None for a prompt of token ids."""
    max_model_len = engine.max_model_len
    if prompt_ids and len(prompt_ids) < max_model_len:
        room = max_model_len - len(prompt_ids)
        if max_tokens is not None and max_tokens > room:
            name = body.max_tokens_field
            raise ApiError(400, f"this model's maximum context length is {max_model_len} tokens; the prompt has "
                                f"{len(prompt_ids)} and {name} asks for {max_tokens} more; lower {name} to "
                                f"at most {room} or shorten the prompt", name)
        max_tokens = room if max_tokens is None else max_tokens
    try:
        requests = [engine.new_request(prompt, body.sampling_params(1 if max_tokens is None else max_tokens, i),
                                       prompt_ids) for i in range(body.n)]
    except ValueError as e:
        raise ApiError(400, str(e), "logit_bias" if str(e).startswith("logit_bias")
                       else "messages" if chat else "prompt") from e
    echo = None if chat or not body.echo else (requests[0].prompt, requests[0].prompt_target_ids)
    reply = _Reply(state.config.served_model_name, chat, {r.request_id: i for i, r in enumerate(requests)},
                   len(prompt_ids), state.tokenizer, bool(body.logprobs if chat else body.logprobs is not None), echo)
    deltas = engine.stream(requests)
    if text_specials is not None and state.replies is not None:
        deltas = state.replies.watching(requests, text_specials, deltas)
    if body.stream:
        return StreamingResponse(reply.sse(deltas, body.include_usage), media_type="text/event-stream")
    return await reply.whole(deltas, raw)


class _Reply:
    """One response (n choices) in the OpenAI shape, whole or as server-sent events."""

    def __init__(self, model: str, chat: bool, index_of: dict[int, int], num_prompt_tokens: int, tokenizer=None,
                 logprobs: bool = False, echo: tuple[str, list[int]] | None = None):
        self.model, self.chat, self.index_of = model, chat, index_of
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = {i: 0 for i in index_of.values()}
        self.tokenizer, self.logprobs, self.echo = tokenizer, logprobs, echo   # echo: (prompt text, prompt ids)
        self.offsets = {i: CompletionLogprobs(tokenizer) for i in index_of.values()}   # text_offset per choice

    def _text(self, delta: RequestDelta, first: bool) -> str:
        """The delta's text, after the prompt's on a choice's first delta where echo asks."""
        return (self.echo[0] if first and self.echo else "") + delta.text

    def _logprobs(self, index: int, delta: RequestDelta, first: bool) -> dict | None:
        """The delta's tokens' logprobs in the endpoint's shape (with echo, the prompt's first); None unasked."""
        if not self.logprobs:
            return None
        entries, ids = delta.logprobs or [], delta.target_ids
        if self.chat:
            return {"content": chat_logprobs(self.tokenizer, entries, ids)}
        parts = []
        if first and self.echo:
            parts.append(self.offsets[index].part(delta.prompt_logprobs or [], self.echo[1]))
        parts.append(self.offsets[index].part(entries, ids))
        return CompletionLogprobs.join(parts)

    def _usage(self) -> dict:
        completion = sum(self.num_output_tokens.values())
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.num_prompt_tokens + completion}

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _index(self, delta: RequestDelta) -> int:
        index = self.index_of[delta.request_id]
        self.num_output_tokens[index] = delta.num_output_tokens
        if delta.error:
            raise ApiError(500, delta.error)
        return index

    async def sse(self, deltas, include_usage: bool):
        first = set()
        try:
            async for delta in deltas:
                index = self._index(delta)
                if not delta.text and delta.finish_reason is None and index in first and not (
                        self.logprobs and delta.target_ids):
                    continue   # tokens whose text is still held back (partial UTF-8, a possible stop string)
                choice = {"index": index, "logprobs": self._logprobs(index, delta, index not in first),
                          "finish_reason": delta.finish_reason}
                if self.chat:
                    choice["delta"] = {"content": delta.text} if index in first else \
                        {"role": "assistant", "content": delta.text}
                else:
                    choice["text"] = self._text(delta, index not in first)
                if delta.spec_decode is not None:
                    choice["spec_decode"] = delta.spec_decode
                first.add(index)
                chunk = {**self._head(True), "choices": [choice]}
                if include_usage:
                    chunk["usage"] = None
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            if include_usage:
                yield f"data: {json.dumps({**self._head(True), 'choices': [], 'usage': self._usage()})}\n\n"
        except ApiError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except Exception as e:   # the headers are sent: the error goes in the stream, not in a dropped connection
            logger.error("stream failed", exc_info=e)
            yield f"data: {json.dumps(ApiError(500, f'internal server error: {type(e).__name__}: {e}').body())}\n\n"
        yield "data: [DONE]\n\n"

    async def whole(self, deltas, raw: Request):
        texts = {i: [] for i in self.num_output_tokens}
        logprobs = {i: [] for i in self.num_output_tokens}
        finals: dict[int, RequestDelta] = {}

        async def collect():
            async for delta in deltas:
                index = self._index(delta)
                first = not texts[index]
                texts[index].append(self._text(delta, first))
                logprobs[index].append(self._logprobs(index, delta, first))
                if delta.finish_reason is not None:
                    finals[index] = delta

        task = asyncio.create_task(collect())
        while not task.done():   # a client that leaves before the answer frees its rows too
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await raw.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return Response(status_code=499)
        task.result()
        choices = []
        for index in sorted(texts):
            text, final = "".join(texts[index]), finals[index]
            choice = {"index": index, "logprobs": self._joined_logprobs(logprobs[index]),
                      "finish_reason": final.finish_reason, "spec_decode": final.spec_decode}
            choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
            choices.append(choice)
        return {**self._head(False), "choices": choices, "usage": self._usage()}

    def _joined_logprobs(self, parts: list[dict | None]) -> dict | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [token for part in parts for token in part["content"]]}
        return CompletionLogprobs.join(parts)
