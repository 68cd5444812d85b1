"""The public Python API, shaped like vLLM's: LLM(model, speculative_config) and generate(prompts, params)."""
from __future__ import annotations

import logging

from .cache_budget import CachePlan, block_rounded, plan_caches
from .config import EngineConfig, SamplingParams, SpeculativeConfig, parse_dtype, resolve_device
from .engine import Engine
from .heap import freeze_startup_heap, return_freed_memory
from .metrics import SpecStats
from .model.loader import DEFAULT_TARGET, resolve_model_path
from .model.runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput, logprob_dicts
from .spec_decode.factory import build_proposer
from .spec_decode.proposer import NoDraftProposer, draft_runner
from .tokenizer import Tokenizer


Prompt = str | dict
logger = logging.getLogger("anydraft")
_UNSIZED_POOL = 2   # blocks a runner loads with (the null block and one): its pool is sized after loading


def _prompt_token_ids(prompt: dict) -> list[int]:
    """vLLM's token prompt: {"prompt_token_ids": [...]}; anything else in the dict is refused by name."""
    unknown = set(prompt) - {"prompt_token_ids"}
    if unknown or "prompt_token_ids" not in prompt:
        raise ValueError(f"a dict prompt takes exactly one key, 'prompt_token_ids' (a list of target token ids); "
                         f"got keys {sorted(prompt)}")
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("prompt_token_ids must be a list of integer target token ids")
    return list(ids)


class LLM:
    """A target model, optionally with a draft of any vocabulary.

    >>> llm = LLM(model="qwen3-target", speculative_config={"model": "smollm2-draft", "num_speculative_tokens": 3})
    >>> out = llm.generate(["Question: ...\\nAnswer:"], SamplingParams(temperature=0, max_tokens=64))

    Args (one line each; docs/configuration.md is generated from them):
        model: the target: a checkpoint directory, a builtin name or SMALL@SHAPE (grown on first use).
        speculative_config: the draft, a SpeculativeConfig or its dict; None decodes with the target alone.
        dtype: the target's dtype (EngineConfig.dtype).
        device: cpu | cuda; None = cuda when present (EngineConfig.device).
        max_model_len: prompt + output tokens per request.
        max_num_seqs: requests decoding at once; `anydraft serve` defaults to 64.
        tokenizer: a tokenizer directory; None = the target's own.
        max_num_batched_tokens: target tokens per step; None = max(2048, 2 * max_num_seqs * (k + 1)).
        kv_cache_memory: bytes or "4GiB" for both KV block pools (EngineConfig.kv_cache_memory).
        enable_prefix_caching: reuse the KV of prompt prefixes seen before, target and draft.
    """

    def __init__(self, model: str = DEFAULT_TARGET, speculative_config: dict | SpeculativeConfig | None = None,
                 dtype: str = "bfloat16", device: str | None = None, max_model_len: int = 2048,
                 max_num_seqs: int = 8, tokenizer: str | None = None, max_num_batched_tokens: int | None = None,
                 kv_cache_memory: int | str | None = None, enable_prefix_caching: bool = True):
        self.engine_config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, dtype=dtype,
                                          device=device, kv_cache_memory=kv_cache_memory,
                                          enable_prefix_caching=enable_prefix_caching)
        self.speculative_config = SpeculativeConfig.from_any(speculative_config)
        torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
        target_path = resolve_model_path(model)
        self.tokenizer = Tokenizer.from_dir(tokenizer or target_path)
        k = 0 if self.speculative_config is None else self.speculative_config.num_speculative_tokens
        # + k: room for a verification forward's k+1 tokens when the sequence is one short of max_model_len.
        # Both models load with a token pool; their pools are sized from the memory left once both are loaded.
        self.target = ModelRunner.load(target_path, torch_dtype, torch_device, max_num_seqs, max_model_len + k,
                                       num_token_rows=self.tokenizer.vocab_size, num_blocks=_UNSIZED_POOL)
        if self.speculative_config is None:
            self.proposer, self.draft_info = NoDraftProposer(torch_device, self.target.vocab_rows), {"vocab_mode": None}
        else:
            self.proposer, self.draft_info = build_proposer(self.speculative_config, self.target, self.tokenizer,
                                                            max_num_seqs, max_model_len, draft_num_blocks=_UNSIZED_POOL)
        self.cache_plan = self._allocate_caches(torch_device, max_model_len, k)
        adaptive = self.speculative_config is not None and self.speculative_config.adaptive
        self.engine = Engine(self.target, self.tokenizer, self.proposer, max_model_len, max_num_batched_tokens,
                             adaptive=adaptive, prefix_caching=enable_prefix_caching)
        freeze_startup_heap()   # loaded: the collector need not walk what loading built at every full collection
        return_freed_memory()

    def _allocate_caches(self, device, max_model_len: int, k: int) -> CachePlan:
        """Size the target's and the draft's block pools from one budget, allocate them, and log what fits."""
        cfg, draft = self.engine_config, self.draft_runner
        # Loading's freed buffers go back first: held by the C heap they would raise the start's peak by their size
        # under the pools, and hide that much of the free memory the default budget is a share of.
        return_freed_memory()
        plan = plan_caches(cfg.kv_cache_memory, device, self.target.bytes_per_token,
                           block_rounded(cfg.max_num_seqs, self.target.cache.max_len), max_model_len + k,
                           draft.bytes_per_token if draft else 0,
                           block_rounded(cfg.max_num_seqs, draft.cache.max_len) if draft else 0,
                           self.draft_info.get("draft_tokens_per_target_token", 1.0))
        self.target.allocate_cache(plan.target_blocks)
        if draft is not None:
            draft.allocate_cache(plan.draft_blocks)
            draft.cache.prefix_caching = cfg.enable_prefix_caching
        logger.info(plan.describe(max_model_len))
        return plan

    @property
    def draft_runner(self) -> ModelRunner | None:
        """The draft model's runner, where the draft is a model with a KV cache of its own."""
        return draft_runner(self.proposer)

    def generate(self, prompts: Prompt | list[Prompt], sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 progress=None) -> list[RequestOutput]:
        """All prompts join the running batch (up to max_num_seqs at once); outputs come back in prompt order.
        A prompt is text or, as in vLLM, {"prompt_token_ids": [target ids]}."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
        requests = []
        try:
            for prompt, request_params in zip(prompts, params):
                if isinstance(prompt, dict):
                    requests.append(self.engine.add_request(None, request_params, _prompt_token_ids(prompt)))
                else:
                    requests.append(self.engine.add_request(prompt, request_params))
        except Exception:
            for request in requests:  # a refused prompt refuses the call: queue none of its prompts
                self.engine.abort(request)
            raise
        self.engine.run(progress)
        return [self._request_output(request) for request in requests]

    def _request_output(self, request) -> RequestOutput:
        metrics = {**request.stats.to_dict(), "vocab_mode": self.draft_info.get("vocab_mode")}
        logprobs = (None if request.logprobs is None
                    else logprob_dicts(request.logprobs, request.output_target_ids, self.tokenizer))
        completion = CompletionOutput(0, request.text, list(request.output_target_ids), request.finish_reason,
                                      request.stop_reason, logprobs)
        prompt_logprobs = (None if request.prompt_logprobs is None
                           else logprob_dicts(request.prompt_logprobs, request.prompt_target_ids, self.tokenizer))
        return RequestOutput(str(request.request_id), request.prompt, list(request.prompt_target_ids), [completion],
                             finished=request.finished, metrics=metrics, prompt_logprobs=prompt_logprobs)

    @property
    def kernels(self) -> dict:
        """Which kernels the target (and the draft) run on, as ModelRunner.kernels reports them."""
        runners = {"target": self.target, "draft": self.draft_runner}
        return {name: runner.kernels for name, runner in runners.items() if runner is not None}

    @property
    def stats(self) -> SpecStats:
        """Aggregate statistics over everything this LLM generated (time split, AL, acceptance by position)."""
        return self.engine.stats
