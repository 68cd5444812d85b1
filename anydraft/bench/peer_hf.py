"""HF transformers peer: assisted generation on the same checkpoints, batch 1, as transformers ships it.

Same vocabulary: `generate(assistant_model=draft)`. Other vocabulary: universal assisted generation,
`generate(assistant_model=draft, tokenizer=..., assistant_tokenizer=...)`, which transformers routes to
its UAG path for greedy (re-tokenizing text) and to its TLI path for do_sample. transformers reads the
drafting settings from the *assistant's* generation_config (generate() kwargs do not reach it), so k is
pinned there: num_assistant_tokens=k, a constant schedule, no confidence early-stop. `pin_k=False` keeps
transformers' defaults (20 tokens, stopping early below 0.4 draft confidence) to show HF at its own best.
AL = new tokens / target forwards (a forward hook counts the target's calls; each assisted step is one).
Prompts come as target ids (anydraft's tokenization), so every contender decodes the same input tokens.
"""
from __future__ import annotations

import statistics
import time


def _load(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch_dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def _same_vocab(tokenizer_a, tokenizer_b) -> bool:
    return tokenizer_a.get_vocab() == tokenizer_b.get_vocab()


class HFPeer:
    """One target (and optionally one draft) loaded with AutoModelForCausalLM."""

    def __init__(self, target_path: str, draft_path: str | None, dtype: str = "bfloat16"):
        self.target, self.target_tokenizer = _load(target_path, dtype)
        self.draft, self.draft_tokenizer = (None, None) if draft_path is None else _load(draft_path, dtype)
        self.same_vocab = self.draft is not None and _same_vocab(self.target_tokenizer, self.draft_tokenizer)
        self.target_forwards = 0
        self.target.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.target_forwards += 1

    def _generate_kwargs(self, k: int, temperature: float, max_tokens: int) -> dict:
        kwargs = dict(max_new_tokens=max_tokens, do_sample=temperature > 0,
                      pad_token_id=self.target_tokenizer.pad_token_id or self.target_tokenizer.eos_token_id)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        if self.draft is not None:
            kwargs.update(assistant_model=self.draft)
            if not self.same_vocab:
                kwargs.update(tokenizer=self.target_tokenizer, assistant_tokenizer=self.draft_tokenizer)
        return kwargs

    def _one_pass(self, prompt_target_ids: list[list[int]], kwargs: dict) -> tuple[int, int, float, list]:
        import torch
        tokens = forwards = 0
        seconds, outputs = 0.0, []
        for ids in prompt_target_ids:
            inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
            self.target_forwards = 0
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.target.generate(**inputs, **kwargs)
            seconds += time.perf_counter() - start
            new_ids = out[0, inputs["input_ids"].shape[1]:].tolist()
            tokens += len(new_ids)
            forwards += self.target_forwards
            outputs.append(new_ids)
        return tokens, forwards, seconds, outputs

    def _configure_draft(self, k: int, pin_k: bool) -> None:
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

    def measure(self, prompt_target_ids: list[list[int]], k: int, max_tokens: int, repeats: int,
                temperature: float = 0.0, pin_k: bool = True) -> dict:
        if self.draft is not None:
            self._configure_draft(k, pin_k)
        kwargs = self._generate_kwargs(k, temperature, max_tokens)
        self._one_pass(prompt_target_ids[:1], {**kwargs, "max_new_tokens": min(16, max_tokens)})   # warm-up
        passes = [self._one_pass(prompt_target_ids, kwargs) for _ in range(repeats)]
        tokens, forwards, _, outputs = passes[0]
        tokens_per_second = [p[0] / p[2] for p in passes]
        path = "target alone" if self.draft is None else (
            "assisted (same vocab)" if self.same_vocab else ("UAG" if temperature == 0 else "TLI (do_sample)"))
        return {
            "k": (k if pin_k else "HF default") if self.draft is not None else 0, "hf_path": path,
            "tokens_per_second_median": statistics.median(tokens_per_second),
            "tokens_per_second_best": max(tokens_per_second),
            "tokens_per_second_all": tokens_per_second,
            "seconds_median": statistics.median(p[2] for p in passes),
            "generated_tokens": tokens,
            "acceptance_length": tokens / forwards if forwards else None,
            "acceptance_by_position": None,
            "target_forwards": forwards,
            "output_target_ids": outputs,
        }
