"""`anydraft serve`: the OpenAI-compatible server (anydraft/serve/), flags named as vLLM's where it has them."""
from __future__ import annotations

import argparse
import json
import logging

from ..model.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from . import CliError
from .model_args import NO_DRAFT, add_cache_args


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible server (completions, chat, streaming, /metrics)",
                       description="Serve a target (and a draft of any vocabulary) over the OpenAI API. With no "
                                   f"model flags: the embedded pair {DEFAULT_TARGET} + {DEFAULT_DRAFT}.")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="target checkpoint dir or builtin name (same as --model)")
    p.add_argument("--model", default=None, help=f"target checkpoint dir or builtin name (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=None, help=f"draft checkpoint dir or builtin name (default {DEFAULT_DRAFT} "
                   "when no target is given; otherwise none); 'none' serves the target alone")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=None,
                   help="the most draft tokens per step (default: SpeculativeConfig's)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='vLLM style, e.g. \'{"model": "smollm2-draft", "num_speculative_tokens": 3}\' '
                        '(keys of anydraft SpeculativeConfig; "method" is accepted and ignored)')
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="draft k tokens every step (default: adaptive speculation picks 0..k per step)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--served-model-name", default=None, help="name clients use in 'model' (default: the target's)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 endpoints")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoding at once (default 64)")
    p.add_argument("--max-model-len", type=int, default=2048, help="prompt + output tokens per request")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="target tokens per step: k+1 per decoding request, the rest prompt chunks "
                        "(default max(2048, 2 * max_num_seqs * (k+1)))")
    add_cache_args(p)
    p.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | float64")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--reuse-reply-ids", action=argparse.BooleanOptionalAction, default=True,
                   help="a prompt that repeats the text of a finished request (a chat's next turn) is given the ids "
                        "the model generated for it, so its reply is a prefix-cache hit (default on; "
                        "docs/serving.md#memory-and-prefix-caching)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the server's log level")


def speculative_config(args: argparse.Namespace, target_given: bool) -> dict | None:
    if args.speculative_config is not None:
        if args.draft is not None:
            raise CliError("give the draft either with --speculative-config or with --draft, not both")
        try:
            spec = json.loads(args.speculative_config)
        except json.JSONDecodeError as e:
            raise CliError(f"--speculative-config is not valid JSON ({e})") from e
        if not isinstance(spec, dict):
            raise CliError("--speculative-config must be a JSON object")
        method = spec.pop("method", None)
        if method not in (None, "draft_model"):
            raise CliError(f"speculative method {method!r} is not supported; anydraft drafts with a model "
                           f"('draft_model')")
        spec.pop("use_heterogeneous_vocab", None)   # vLLM's switch for what anydraft always does
        return spec
    draft = args.draft if args.draft is not None else (None if target_given else DEFAULT_DRAFT)
    if draft == NO_DRAFT:
        draft = None
    if draft is None:
        return None
    spec = {"model": draft, "adaptive": args.adaptive}
    if args.num_speculative_tokens is not None:
        spec["num_speculative_tokens"] = args.num_speculative_tokens
    return spec


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serve.api_server import ServeConfig, create_app

    if args.model_tag and args.model and args.model_tag != args.model:
        raise CliError(f"two models given: {args.model_tag} and --model {args.model}")
    target = args.model or args.model_tag
    spec = speculative_config(args, target is not None)
    target = target or DEFAULT_TARGET
    config = ServeConfig(model=target, speculative_config=spec, served_model_name=args.served_model_name or target,
                         dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                         max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                         api_key=args.api_key, kv_cache_memory=args.kv_cache_memory,
                         enable_prefix_caching=args.enable_prefix_caching, reuse_reply_ids=args.reuse_reply_ids)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    failed: list[str] = []

    def stop(message: str) -> None:   # a model that cannot load (e.g. a KV budget that does not fit) ends the server
        failed.append(message)
        server.should_exit = True

    server = uvicorn.Server(uvicorn.Config(create_app(config, on_load_error=stop), host=args.host, port=args.port,
                                           log_level=args.log_level))
    server.run()
    if failed:
        raise CliError(f"the model failed to load: {failed[0]}")
    return 0
