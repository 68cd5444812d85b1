"""HF transformers peer: assisted generation on the same checkpoints, batch 1, as transformers ships it.

Same vocabulary: `generate(assistant_model=draft)`. Other vocabulary: universal assisted generation,
`generate(assistant_model=draft, tokenizer=..., assistant_tokenizer=...)`, which transformers routes to
its UAG path for greedy (re-tokenizing text) and to its TLI path for do_sample. transformers reads the
drafting settings from the *assistant's* generation_config (generate() kwargs do not reach it), so k is
pinned there: num_assistant_tokens=k, a constant schedule, no confidence early-stop. `pin_k=False` keeps
transformers' defaults (20 tokens, stopping early below 0.4 draft confidence) to show HF at its own best.
AL = new tokens / target forwards (a forward hook counts the target's calls; each assisted step is one, and
HF has no separate prompt forward, so each is a verification forward: the same AL as ours and vLLM's).
Prompts come as target ids (anydraft's tokenization), so every contender decodes the same input tokens.
"""
from __future__ import annotations

import time

from ..tokenizer import Tokenizer, same_vocabulary


def _load(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch_dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


class HFPeer:
    """One target (and optionally one draft) loaded with AutoModelForCausalLM."""

    def __init__(self, target_path: str, draft_path: str | None, dtype: str = "bfloat16"):
        self.target, self.target_tokenizer = _load(target_path, dtype)
        self.draft, self.draft_tokenizer = (None, None) if draft_path is None else _load(draft_path, dtype)
        # anydraft's own rule (tokenizer.same_vocabulary): HF then gets the same-vocab path exactly when we do
        self.same_vocab = draft_path is not None and same_vocabulary(Tokenizer.from_dir(target_path),
                                                                     Tokenizer.from_dir(draft_path))
        self.target_forwards = 0
        self.target.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.target_forwards += 1

    def generate_kwargs(self, temperature: float, max_tokens: int) -> dict:
        kwargs = dict(max_new_tokens=max_tokens, do_sample=temperature > 0,
                      pad_token_id=self.target_tokenizer.pad_token_id or self.target_tokenizer.eos_token_id)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        if self.draft is not None:
            kwargs.update(assistant_model=self.draft)
            if not self.same_vocab:
                kwargs.update(tokenizer=self.target_tokenizer, assistant_tokenizer=self.draft_tokenizer)
        return kwargs

    def generate(self, prompt_target_ids: list[int], kwargs: dict) -> tuple[list[int], int, float]:
        """(new target ids, target forwards, seconds) for one prompt alone."""
        import torch
        inputs = {"input_ids": torch.tensor([prompt_target_ids]),
                  "attention_mask": torch.ones(1, len(prompt_target_ids), dtype=torch.long)}
        self.target_forwards = 0
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(**inputs, **kwargs)
        seconds = time.perf_counter() - start
        return out[0, len(prompt_target_ids):].tolist(), self.target_forwards, seconds

    def configure_draft(self, k: int, pin_k: bool) -> None:
        from transformers import GenerationConfig
        config = self.draft.generation_config
        if pin_k:
            config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
            config.assistant_confidence_threshold = 0.0
        else:
            defaults = GenerationConfig()
            config.num_assistant_tokens = defaults.num_assistant_tokens
            config.num_assistant_tokens_schedule = defaults.num_assistant_tokens_schedule
            config.assistant_confidence_threshold = defaults.assistant_confidence_threshold

    def path_name(self, use_draft: bool, temperature: float) -> str:
        if not use_draft or self.draft is None:
            return "target alone"
        return "assisted (same vocab)" if self.same_vocab else ("UAG" if temperature == 0 else "TLI (do_sample)")


class HFContender:
    """One way of running an HFPeer (target alone, assisted with k pinned, assisted at HF defaults) as a bench
    contender; several share one loaded peer."""

    def __init__(self, peer: HFPeer, prompt_target_ids: list[list[int]], k: int, max_tokens: int,
                 temperature: float = 0.0, pin_k: bool = True):
        self.system = "hf"
        self.peer, self.prompt_target_ids = peer, prompt_target_ids
        self.use_draft = k > 0
        self.k = (k if pin_k else "HF default") if self.use_draft else 0
        self.pin_k, self.num_tokens = pin_k, k
        kwargs = peer.generate_kwargs(temperature, max_tokens)
        if not self.use_draft:
            kwargs = {key: value for key, value in kwargs.items()
                      if key not in ("assistant_model", "tokenizer", "assistant_tokenizer")}
        self.kwargs = kwargs
        self.hf_path = peer.path_name(self.use_draft, temperature)
        if not self.use_draft:
            self.name = "HF target alone"
        else:
            self.name = f"HF assisted ({self.hf_path}{'' if pin_k else ', HF default drafting'})"

    def _generate(self, group: list[int], kwargs: dict):
        from .contenders import GroupRun
        if len(group) != 1:   # transformers: "assisted generate is only supported for batch_size = 1"
            raise ValueError("HF assisted generation runs one prompt at a time (batch size 1)")
        if self.use_draft:
            self.peer.configure_draft(self.num_tokens, self.pin_k)
        new_ids, forwards, seconds = self.peer.generate(self.prompt_target_ids[group[0]], kwargs)
        return GroupRun([new_ids], seconds, target_forwards=forwards)

    def warm_up(self, group: list[int]) -> None:
        self._generate(group, {**self.kwargs, "max_new_tokens": min(16, self.kwargs["max_new_tokens"])})

    def run(self, group: list[int]):
        return self._generate(group, self.kwargs)
