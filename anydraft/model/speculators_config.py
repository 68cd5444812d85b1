"""What the config.json of a speculators-format drafter (EAGLE-3, DSpark) says, validated.

The format is the `speculators` package's (0.9): `speculators_model_type`, a `speculators_config` naming the
verifier (the target) and the proposal method, a `transformer_layer_config` (an HF decoder config written as
a diff against its class defaults), `draft_vocab_size`, and the target layers whose hidden states the draft
reads. Errors name the file and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import ModelConfig, UnsupportedModelError

SPECULATORS_KINDS = ("eagle3", "dspark")
# transformer_layer_config is written with to_diff_dict(): fields equal to the HF class defaults are left out.
# The defaults of the decoder classes speculators builds its draft layers from (transformers' LlamaConfig /
# Qwen3Config), for the fields our module reads.
_LAYER_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-6,
                  rope_theta=10000.0, rope_scaling=None, attention_bias=False, max_position_embeddings=2048),
    "qwen3": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, rms_norm_eps=1e-6,
                  rope_theta=10000.0, rope_scaling=None, attention_bias=False, max_position_embeddings=32768),
}
_ARCHITECTURE = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Flags of the format that change the computation; the ones not implemented here are refused by name.
_EAGLE3_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm")
_DSPARK_HEAD_TYPES = ("vanilla",)


class SpeculatorsFormatError(ValueError):
    """A speculators checkpoint that breaks what its format promises, or that this runner cannot reproduce."""


def is_speculators_checkpoint(path: Path) -> bool:
    config_file = Path(path) / "config.json"
    try:
        return "speculators_model_type" in json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError):
        return False


@dataclass
class SpeculatorsConfig:
    path: Path                      # the config.json
    kind: str                       # "eagle3" | "dspark"
    layer: ModelConfig              # the draft decoder layers' shape (vocab_size = the verifier's vocabulary)
    draft_vocab_size: int           # output head rows; == layer.vocab_size means no d2t table
    aux_layer_ids: list[int]        # target layers whose input residual the draft reads (0 = embeddings)
    target_hidden_size: int         # the verifier's hidden size (the aux states' width, each)
    verifier_name_or_path: str | None
    verifier_architectures: list[str]
    num_speculative_tokens: int     # what the checkpoint was trained to propose per step
    norm_before_residual: bool = False
    norm_output: bool = False
    # DSpark (DFlash backbone + Markov bias)
    block_size: int = 0
    mask_token_id: int | None = None
    sample_from_anchor: bool = True
    markov_rank: int = 0

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.layer.vocab_size

    def fail(self, field: str, message: str) -> SpeculatorsFormatError:
        return SpeculatorsFormatError(f"{self.path}: {field}: {message}")

    @classmethod
    def from_file(cls, config_file: Path) -> "SpeculatorsConfig":
        config_file = Path(config_file)
        try:
            raw = json.loads(config_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpeculatorsFormatError(f"{config_file}: cannot read the speculators config ({e})") from None

        def fail(field, message):
            return SpeculatorsFormatError(f"{config_file}: {field}: {message}")

        def need(mapping, key, prefix=""):
            if key not in mapping:
                raise fail(prefix + key, "missing")
            return mapping[key]

        kind = need(raw, "speculators_model_type")
        if kind not in SPECULATORS_KINDS:
            raise fail("speculators_model_type", f"{kind!r} is not supported; supported: {', '.join(SPECULATORS_KINDS)}")
        layer = cls._layer_config(need(raw, "transformer_layer_config"), fail)
        spec = need(raw, "speculators_config")
        verifier = need(spec, "verifier", "speculators_config.")
        methods = spec.get("proposal_methods") or []
        tokens = [m.get("speculative_tokens") for m in methods if isinstance(m, dict)]
        if not tokens or not isinstance(tokens[0], int) or tokens[0] < 1:
            raise fail("speculators_config.proposal_methods", "needs a method with speculative_tokens >= 1")
        draft_vocab_size = need(raw, "draft_vocab_size")
        if not isinstance(draft_vocab_size, int) or not 0 < draft_vocab_size <= layer.vocab_size:
            raise fail("draft_vocab_size", f"{draft_vocab_size!r} must be an integer in [1, "
                                           f"transformer_layer_config.vocab_size={layer.vocab_size}]")
        aux_field = "eagle_aux_hidden_state_layer_ids" if kind == "eagle3" else "aux_hidden_state_layer_ids"
        aux = raw.get(aux_field)
        if not aux or not all(isinstance(i, int) for i in aux) or len(set(aux)) != len(aux):
            raise fail(aux_field, f"{aux!r}: give the distinct target layer ids the draft reads (speculators "
                                  f"resolves a missing list from the verifier; write it into the config)")
        cfg = cls(path=config_file, kind=kind, layer=layer, draft_vocab_size=draft_vocab_size,
                  aux_layer_ids=list(aux), target_hidden_size=raw.get("target_hidden_size") or layer.hidden_size,
                  verifier_name_or_path=verifier.get("name_or_path"),
                  verifier_architectures=list(verifier.get("architectures") or []),
                  num_speculative_tokens=tokens[0], norm_before_residual=bool(raw.get("norm_before_residual")),
                  norm_output=bool(raw.get("norm_output")))
        if kind == "eagle3":
            for flag in _EAGLE3_UNSUPPORTED_FLAGS:
                if raw.get(flag):
                    raise fail(flag, "true is not supported by this runner (only the plain fc over the "
                                     "concatenated hidden states)")
        else:
            cfg.block_size = need(raw, "block_size")
            if not isinstance(cfg.block_size, int) or cfg.block_size < 2:
                raise fail("block_size", f"{cfg.block_size!r} must be an integer >= 2")
            cfg.mask_token_id = need(raw, "mask_token_id")
            if not isinstance(cfg.mask_token_id, int) or not 0 <= cfg.mask_token_id < layer.vocab_size:
                raise fail("mask_token_id", f"{cfg.mask_token_id!r} must be a token id in [0, {layer.vocab_size})")
            if "sample_from_anchor" not in raw:
                # DSpark's default (True) differs from DFlash's (False): the layout must be stated, not guessed.
                raise fail("sample_from_anchor", "missing; the block layout (anchor-first or 1+N) must be explicit")
            cfg.sample_from_anchor = bool(raw["sample_from_anchor"])
            cfg.markov_rank = int(raw.get("markov_rank", 256))
            head_type = raw.get("markov_head_type", "vanilla")
            if cfg.markov_rank > 0 and head_type not in _DSPARK_HEAD_TYPES:
                raise fail("markov_head_type", f"{head_type!r} is not supported; supported: {_DSPARK_HEAD_TYPES}")
            if raw.get("sliding_window") or layer.extra.get("sliding_window"):
                raise fail("transformer_layer_config.sliding_window", "sliding-window draft layers are not supported")
        return cfg

    @staticmethod
    def _layer_config(layer: dict, fail) -> ModelConfig:
        if not isinstance(layer, dict):
            raise fail("transformer_layer_config", "must be an object")
        model_type = layer.get("model_type", "qwen3")   # speculators' default layer class is Qwen3Config
        if model_type not in _LAYER_DEFAULTS:
            raise fail("transformer_layer_config.model_type",
                       f"{model_type!r} is not supported; supported: {', '.join(_LAYER_DEFAULTS)}")
        values = {**_LAYER_DEFAULTS[model_type], **{k: v for k, v in layer.items() if v is not None or
                                                    k not in _LAYER_DEFAULTS[model_type]}}
        values["architectures"] = [_ARCHITECTURE[model_type]]
        values["num_key_value_heads"] = values["num_key_value_heads"] or values["num_attention_heads"]
        values["head_dim"] = values["head_dim"] or values["hidden_size"] // values["num_attention_heads"]
        values["tie_word_embeddings"] = False
        try:
            cfg = ModelConfig.from_dict(values)
        except (UnsupportedModelError, KeyError, TypeError) as e:
            raise fail("transformer_layer_config", str(e)) from None
        cfg.extra = {"sliding_window": layer.get("sliding_window") if layer.get("use_sliding_window") else None}
        return cfg

    def check_target(self, target_cfg: ModelConfig) -> None:
        """The verifier this draft was trained for must have the target's hidden size, vocabulary and layers."""
        if self.target_hidden_size != target_cfg.hidden_size:
            raise self.fail("target_hidden_size" if self.target_hidden_size != self.layer.hidden_size
                            else "transformer_layer_config.hidden_size",
                            f"the verifier's hidden size {self.target_hidden_size} differs from the target's "
                            f"{target_cfg.hidden_size}: this draft was trained for another target")
        if self.layer.vocab_size != target_cfg.vocab_size:
            raise self.fail("transformer_layer_config.vocab_size",
                            f"the verifier's vocabulary has {self.layer.vocab_size} rows, the target's "
                            f"{target_cfg.vocab_size}: this draft was trained for another target")
        bad = [i for i in self.aux_layer_ids if not 0 <= i <= target_cfg.num_hidden_layers]
        if bad:
            raise self.fail("aux layer ids", f"{bad} outside [0, {target_cfg.num_hidden_layers}] (the target has "
                                             f"{target_cfg.num_hidden_layers} layers)")
        if self.verifier_architectures and target_cfg.architecture not in self.verifier_architectures:
            raise self.fail("speculators_config.verifier.architectures",
                            f"{self.verifier_architectures} does not include the target's {target_cfg.architecture}")
