"""Growth plans (no weights): the real shapes' sizes, what each shipped model grows into, and clear refusals."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from anydraft.cli import main
from anydraft.model.config import ModelConfig
from anydraft.checkpoints.grow import GrowError, _bf16_squares, grown_config, plan_growth
from anydraft.checkpoints.shapes import SHAPES, get_shape

MODELS = Path(__file__).resolve().parents[2] / "models"
# Sizes as the model cards state them (Qwen3: non-embedding parameters; SmolLM2: all, tied head counted once).
PUBLISHED_PARAMETERS = {"qwen3-0.6b": (0.44e9, True), "qwen3-1.7b": (1.4e9, True), "smollm2-135m": (134.5e6, False),
                        "smollm2-360m": (362e6, False), "smollm2-1.7b": (1.71e9, False)}


def small_config(name: str, **changes) -> ModelConfig:
    cfg = ModelConfig.from_dict(json.loads((MODELS / name / "config.json").read_text()))
    return dataclasses.replace(cfg, **changes)


@pytest.mark.parametrize("small, shape", [("qwen3-target", "qwen3-0.6b"), ("qwen3-target", "qwen3-1.7b"),
                                          ("qwen3-draft", "qwen3-0.6b"), ("smollm2-draft", "smollm2-135m"),
                                          ("smollm2-target", "smollm2-360m"), ("smollm2-target", "smollm2-1.7b")])
def test_grown_config_has_the_shape_and_keeps_rope(small, shape):
    raw = json.loads((MODELS / small / "config.json").read_text())
    plan = plan_growth(ModelConfig.from_dict(raw), get_shape(shape))
    grown = ModelConfig.from_dict(grown_config(plan, raw))
    real = SHAPES[shape]
    for name in ("architecture", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings"):
        assert getattr(grown, name) == getattr(real, name), name
    assert grown.rope_theta == raw["rope_theta"] and grown.eos_token_id == raw["eos_token_id"]
    # Each small query head has its own slot, in a group whose KV head is a copy of its own KV head.
    group, big_group = 3, real.num_attention_heads // real.num_key_value_heads
    assert len(set(plan.q_slots)) == 3
    for small_head, slot in enumerate(plan.q_slots):
        assert plan.kv_sources[slot // big_group] == small_head // group


def test_epsilon_and_constants_keep_every_norm_exact():
    """Qwen3 into qwen3-0.6b: hidden norms and q/k norms agree on one epsilon (module docstring of grow.py)."""
    plan = plan_growth(small_config("qwen3-target"), get_shape("qwen3-0.6b"))
    eps, h, big_h = 1e-6, 192, 1024
    alpha = plan.hidden_copies * h / big_h
    constants = sum(c * c for c in plan.hidden_constants)
    assert plan.rms_norm_eps == pytest.approx(eps * 64 / 128, rel=1e-15)               # q/k norms over 128 dims
    assert constants / big_h + plan.rms_norm_eps == pytest.approx(alpha * eps, rel=1e-7)  # hidden norms
    assert plan.hidden_copies * h + len(plan.hidden_constants) <= big_h
    llama = plan_growth(small_config("smollm2-draft"), get_shape("smollm2-135m"))
    assert (llama.hidden_copies, llama.hidden_constants, llama.rms_norm_eps) == (3, (), 1e-6)


@pytest.mark.parametrize("total", [6.4e-5, 4.48e-4, 1.28e-4, 3e-9, 0.5])
def test_constants_are_bf16_values_whose_squares_sum_to_the_target(total):
    values = _bf16_squares(total)
    for v in values:
        assert torch.tensor(v, dtype=torch.bfloat16).item() == v
    assert math.fsum(v * v for v in values) == pytest.approx(total, rel=2 ** -23)
    assert math.fsum(v * v for v in values) <= total


def test_parameter_counts_match_the_published_models():
    for name, (count, non_embedding) in PUBLISHED_PARAMETERS.items():
        shape = SHAPES[name]
        ours = shape.parameter_count() - (shape.vocab_size * shape.hidden_size if non_embedding else 0)
        assert ours == pytest.approx(count, rel=0.02), name


def test_unknown_shape_lists_the_known_ones(capsys, tmp_path):
    with pytest.raises(ValueError, match="known shapes: qwen3-0.6b, qwen3-1.7b, smollm2-135m"):
        get_shape("qwen3-8b")
    assert main(["grow", "qwen3-target", "--shape", "llama-70b", "--out", str(tmp_path / "x")]) == 2
    assert "smollm2-1.7b" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("changes, shape, dimension", [
    (dict(hidden_size=1152, num_attention_heads=18, num_key_value_heads=6), "qwen3-0.6b", "hidden_size"),
    (dict(vocab_size=151669), "qwen3-1.7b", "vocab_size"),
    (dict(num_hidden_layers=29), "qwen3-0.6b", "num_hidden_layers"),
    (dict(intermediate_size=4096), "qwen3-0.6b", "intermediate_size"),
    (dict(head_dim=48), "qwen3-0.6b", "head_dim"),
    (dict(tie_word_embeddings=False), "qwen3-0.6b", "tie_word_embeddings"),
    (dict(architecture="LlamaForCausalLM", qk_norm=False), "qwen3-0.6b", "architecture"),
    # 4 KV heads of one query head each need 4 KV heads; smollm2-135m has 3 (groups of 3).
    (dict(num_attention_heads=4, num_key_value_heads=4), "smollm2-135m", "num_key_value_heads"),
])
def test_what_cannot_be_grown_names_the_dimension(changes, shape, dimension):
    small = "smollm2-target" if get_shape(shape).architecture == "LlamaForCausalLM" else "qwen3-target"
    with pytest.raises(GrowError, match=f"{shape}: {dimension}:"):
        plan_growth(small_config(small, **changes), get_shape(shape))


def test_qwen3_head_norm_epsilon_out_of_reach_names_hidden_size():
    """head_dim 128 -> 128 needs hidden norms at full epsilon: only whole copies reach it, 1024/192 is not."""
    with pytest.raises(GrowError, match="qwen3-0.6b: hidden_size:"):
        plan_growth(small_config("qwen3-target", head_dim=128, num_attention_heads=2, num_key_value_heads=1),
                    get_shape("qwen3-0.6b"))


def test_bench_pairs_a_grown_target_with_its_familys_grown_draft():
    from anydraft.cli.bench_cmd import default_same_vocab_draft
    assert default_same_vocab_draft("qwen3-target") == "qwen3-draft"
    assert default_same_vocab_draft("qwen3-target@qwen3-1.7b") == "qwen3-draft@qwen3-0.6b"
    assert default_same_vocab_draft("smollm2-target@smollm2-1.7b") == "smollm2-draft@smollm2-135m"
    assert default_same_vocab_draft("mistral-target") == "mistral-draft"
    assert default_same_vocab_draft("mistral-target@qwen3-1.7b") is None   # no mistral-family shape to grow into
    assert default_same_vocab_draft("some/dir") is None
