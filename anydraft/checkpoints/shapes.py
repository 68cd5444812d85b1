"""Real architectures' shapes (sizes from their published config.json) that a small checkpoint can grow into."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int                 # embedding / output rows
    tie_word_embeddings: bool
    source: str                     # the Hugging Face repository whose config.json these sizes are

    def parameter_count(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        norms = 2 * h + (2 * d if self.architecture == "Qwen3ForCausalLM" else 0)
        layer = attention + 3 * h * self.intermediate_size + norms
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("qwen3-0.6b", "Qwen3ForCausalLM", 1024, 28, 16, 8, 128, 3072, 151936, True, "Qwen/Qwen3-0.6B"),
    Shape("qwen3-1.7b", "Qwen3ForCausalLM", 2048, 28, 16, 8, 128, 6144, 151936, True, "Qwen/Qwen3-1.7B"),
    Shape("smollm2-135m", "LlamaForCausalLM", 576, 30, 9, 3, 64, 1536, 49152, True, "HuggingFaceTB/SmolLM2-135M"),
    Shape("smollm2-360m", "LlamaForCausalLM", 960, 32, 15, 5, 64, 2560, 49152, True, "HuggingFaceTB/SmolLM2-360M"),
    Shape("smollm2-1.7b", "LlamaForCausalLM", 2048, 24, 32, 32, 64, 8192, 49152, True, "HuggingFaceTB/SmolLM2-1.7B"),
)}


def get_shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; known shapes: {', '.join(SHAPES)}") from None
