"""Growth on tiny random checkpoints into tiny shapes: every compensation exercised where it matters.

A large RMSNorm epsilon (0.05) makes the epsilon rules visible; head dims double (rotary placement,
1/sqrt(head_dim), q/k norms); query groups shrink so KV heads are duplicated; hidden sizes are not
multiples of the small one. Checked in float64 through our module and in float32 through transformers, with controls that break
one rule each and must be caught. The checkpoint stores scale factors like √(d/D) rounded to float32, so
even in float64 the match is to float32 rounding (~1e-7 relative per stored factor), not bit-exact.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import anydraft.checkpoints.grow as grow
import anydraft.checkpoints.grown_checkpoint as grown_checkpoint
from anydraft.model.config import ModelConfig
from anydraft.checkpoints.grown_checkpoint import grow_checkpoint
from anydraft.model.llama import CausalLM
from anydraft.model.loader import load_model
from anydraft.checkpoints.shapes import SHAPES, Shape

from tiny_models import write_checkpoint

VOCAB, EPS = 101, 0.05
FLOAT32_ROUNDING = 2e-5      # logits here reach ~5-10; each broken rule below moves them by > 1e-3
IDS = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))

# name: (small architecture, small tied, small heads/kv heads, shape)
CASES = {
    "qwen3-untied": ("Qwen3ForCausalLM", False, (4, 1), Shape("tiny-qwen3", "Qwen3ForCausalLM", 156, 4, 6, 3, 16, 96,
                                                                VOCAB, False, "test")),
    "qwen3-tied": ("Qwen3ForCausalLM", True, (4, 2), Shape("tiny-qwen3-tied", "Qwen3ForCausalLM", 128, 3, 8, 4, 16,
                                                             80, VOCAB, True, "test")),
    "llama-tied": ("LlamaForCausalLM", True, (6, 2), Shape("tiny-llama", "LlamaForCausalLM", 108, 3, 9, 3, 16, 72,
                                                            VOCAB, True, "test")),
    "llama-tied-to-untied": ("LlamaForCausalLM", True, (6, 3), Shape("tiny-llama-untied", "LlamaForCausalLM", 96, 2,
                                                                       8, 4, 8, 64, VOCAB, False, "test")),
}


def make_small(directory: Path, architecture: str, tied: bool, heads: tuple[int, int], dtype=torch.float32) -> Path:
    cfg = ModelConfig(architecture=architecture, vocab_size=VOCAB, hidden_size=48, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=heads[0], num_key_value_heads=heads[1], head_dim=8,
                      rms_norm_eps=EPS, rope_theta=100.0, tie_word_embeddings=tied,
                      qk_norm=architecture == "Qwen3ForCausalLM")
    torch.manual_seed(0)
    model = CausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return write_checkpoint(directory, cfg, {k: v.to(dtype) for k, v in model.state_dict().items()}, None)


def our_logits(path: Path) -> torch.Tensor:
    model, _ = load_model(path, torch.float64, torch.device("cpu"))
    return model.logits(model(IDS))


def hf_logits(path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture
def grown(tmp_path, monkeypatch):
    """case -> (small dir, grown dir), the shapes registered for the test only."""
    def build(case: str, dtype=torch.float32) -> tuple[Path, Path]:
        architecture, tied, heads, shape = CASES[case]
        monkeypatch.setitem(SHAPES, shape.name, shape)
        small = make_small(tmp_path / f"small-{case}", architecture, tied, heads, dtype)
        grow_checkpoint(small, shape.name, tmp_path / f"grown-{case}", progress=False)
        return small, tmp_path / f"grown-{case}"
    return build


@pytest.mark.parametrize("case", list(CASES))
def test_grown_logits_equal_the_small_models(case, grown):
    small, big = grown(case)
    cfg = json.loads((big / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["head_dim"]) == (CASES[case][3].hidden_size, CASES[case][3].head_dim)
    reference = our_logits(small)
    assert reference.abs().max() > 1                    # not a model whose logits are all near zero
    torch.testing.assert_close(our_logits(big), reference, rtol=0, atol=FLOAT32_ROUNDING)
    torch.testing.assert_close(hf_logits(big), hf_logits(small), rtol=0, atol=FLOAT32_ROUNDING)


def test_bf16_checkpoint_keeps_non_power_of_two_scales_in_float32(grown):
    """Copies of bf16 weights stay bf16 (exact); norms scaled by √α or √(d/D) are stored in float32."""
    small, big = grown("qwen3-untied", torch.bfloat16)
    summary = json.loads((big / "grown.json").read_text())
    with safe_open(str(big / "model.safetensors"), framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert {dtypes[n] for n in summary["float32_tensors"]} == {"F32"}
    assert "model.layers.0.self_attn.k_norm.weight" in summary["float32_tensors"]
    assert dtypes["model.embed_tokens.weight"] == dtypes["model.layers.0.self_attn.q_proj.weight"] == "BF16"
    torch.testing.assert_close(our_logits(big), our_logits(small), rtol=0, atol=FLOAT32_ROUNDING)


def test_controls_each_broken_rule_is_caught(grown, monkeypatch, tmp_path):
    small, big = grown("qwen3-untied")
    reference = our_logits(small)
    # 1. the norms' epsilon left as the small model's
    config = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "rms_norm_eps": EPS}))
    assert (our_logits(big) - reference).abs().max() > 1e-3
    # 2. rotary pairs at the first d dims (other frequencies) instead of their own frequency
    monkeypatch.setattr(grow, "rotary_dim_map", lambda d, big_d: torch.cat([torch.arange(d // 2),
                                                                             big_d // 2 + torch.arange(d // 2)]))
    grow_checkpoint(small, CASES["qwen3-untied"][3].name, tmp_path / "wrong-rope", progress=False)
    assert (our_logits(tmp_path / "wrong-rope") - reference).abs().max() > 1e-3


def test_many_shards_load_and_a_failed_write_leaves_nothing(grown, monkeypatch, tmp_path):
    monkeypatch.setattr(grown_checkpoint, "SHARD_BYTES", 40_000)
    small, big = grown("llama-tied")
    index = json.loads((big / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3 and not (big / "model.safetensors").exists()
    torch.testing.assert_close(our_logits(big), our_logits(small), rtol=0, atol=FLOAT32_ROUNDING)

    calls = []
    real_save = grown_checkpoint._save_shard

    def save_then_fail(tensors, directory, number):
        calls.append(number)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return real_save(tensors, directory, number)

    monkeypatch.setattr(grown_checkpoint, "_save_shard", save_then_fail)
    before = set(tmp_path.iterdir())
    with pytest.raises(OSError, match="simulated"):
        grow_checkpoint(small, CASES["llama-tied"][3].name, tmp_path / "never", progress=False)
    assert set(tmp_path.iterdir()) == before        # neither the output nor a partial directory remains
