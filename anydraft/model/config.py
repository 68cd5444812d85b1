"""Model architecture config: what `config.json` of a Llama-family checkpoint says, validated."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# HF architecture name -> the flags our one decoder module needs to reproduce it.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": dict(qk_norm=False, attention_bias=None),
    "MistralForCausalLM": dict(qk_norm=False, attention_bias=False),
    "Qwen2ForCausalLM": dict(qk_norm=False, attention_bias=True),
    "Qwen3ForCausalLM": dict(qk_norm=True, attention_bias=None),
}


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture or settings this runner cannot reproduce exactly."""


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int  # embedding / output rows (may exceed the tokenizer's size)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {self.architecture!r} is not supported; supported: "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise UnsupportedModelError(f"{name} must be positive, got {getattr(self, name)}")
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type"))
        if rope_type not in (None, "default", "linear", "llama3"):
            raise UnsupportedModelError(
                f"rope_scaling type {rope_type!r} is not supported; use none, 'linear' or 'llama3'")

    @classmethod
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs:
            raise UnsupportedModelError("config.json has no 'architectures' entry")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
        flags = SUPPORTED_ARCHITECTURES[arch]
        heads = cfg["num_attention_heads"]
        bias = flags["attention_bias"]
        if bias is None:
            bias = bool(cfg.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=bias,
            qk_norm=flags["qk_norm"],
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise UnsupportedModelError(f"{path}: no config.json (is this a HF checkpoint directory?)") from None
        except json.JSONDecodeError as e:
            raise UnsupportedModelError(f"{path}: invalid JSON ({e})") from None
        try:
            return cls.from_dict(cfg)
        except KeyError as e:
            raise UnsupportedModelError(f"{path}: missing key {e.args[0]!r}") from None

    def to_hf_dict(self) -> dict:
        """The config.json transformers (and vLLM) load as-is."""
        model_type = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                      "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[self.architecture]
        d = dict(
            architectures=[self.architecture], model_type=model_type, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            tie_word_embeddings=self.tie_word_embeddings, hidden_act="silu",
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
            torch_dtype="bfloat16", attention_dropout=0.0,
        )
        if self.architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
            d["attention_bias"] = self.attention_bias
        if self.architecture == "LlamaForCausalLM":
            d["mlp_bias"] = False
        if self.architecture == "MistralForCausalLM":
            d["sliding_window"] = None   # full attention, as our module computes (transformers' default is 4096)
        return d
