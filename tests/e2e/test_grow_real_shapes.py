"""Every real shape, at its real sizes: the grown shipped model's logits equal the small one's through transformers.

Full-size float32 models are heavy on this 2-core machine, so each is grown in memory (no checkpoint write;
the writer is tested on tiny shapes in tests/engine/test_grow_tiny.py) and the layers past the small model's
share one set of all-zero tensors; every layer still runs its real-size matmuls. One prompt of 12 tokens.
"""
from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
import transformers

from anydraft.model.config import ModelConfig
from anydraft.checkpoints.grow import grown_config, grown_tensors, plan_growth
from anydraft.model.loader import read_state_dict
from anydraft.checkpoints.shapes import SHAPES, get_shape

MODELS = Path(__file__).resolve().parents[2] / "models"
PROMPT = "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips"
# Smaller checkpoints for the larger shapes keep memory and time down; every shape appears once.
CASES = [("qwen3-target", "qwen3-0.6b"), ("qwen3-draft", "qwen3-1.7b"), ("smollm2-draft", "smollm2-135m"),
         ("smollm2-target", "smollm2-360m"), ("smollm2-draft", "smollm2-1.7b")]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: two spin-wait on each other at every op when the 2-core machine is loaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_shape_is_covered():
    assert {shape for _, shape in CASES} == set(SHAPES)


def grown_in_memory(small_dir: Path, shape_name: str) -> torch.nn.Module:
    raw = json.loads((small_dir / "config.json").read_text())
    plan = plan_growth(ModelConfig.from_dict(raw), get_shape(shape_name))
    config = grown_config(plan, raw)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = dict(grown_tensors(plan, read_state_dict(small_dir), share_zeros=True))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf_config)   # a buffer, built on meta above
    return model.eval()


@pytest.mark.parametrize("small, shape", CASES)
def test_grown_logits_equal_the_small_models_at_real_size(small, shape):
    small_dir = MODELS / small
    ids = torch.tensor([transformers.PreTrainedTokenizerFast(tokenizer_file=str(small_dir / "tokenizer.json"))
                        (PROMPT)["input_ids"][:12]])
    with torch.no_grad():
        reference = transformers.AutoModelForCausalLM.from_pretrained(small_dir, dtype=torch.float32)(ids).logits
        big = grown_in_memory(small_dir, shape)
        real = SHAPES[shape]
        assert (big.config.hidden_size, big.config.num_hidden_layers, big.config.intermediate_size) == \
            (real.hidden_size, real.num_hidden_layers, real.intermediate_size)
        assert big.model.layers[-1].self_attn.k_proj.weight.shape == (real.num_key_value_heads * real.head_dim,
                                                                      real.hidden_size)
        logits = big(ids).logits
    del big
    gc.collect()
    # float32 rounding: the logits reach ~10-14 here; observed differences are ~1e-5.
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-4)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
