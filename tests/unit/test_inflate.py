"""The cost-emulated target computes the same logits as the trained one, and costs more."""

import pytest
import torch

from anydraft.bench.inflate import inflate_model, parameter_count, parse_inflate_spec
from anydraft.model.config import ModelConfig
from anydraft.model.kv_cache import KVCache
from anydraft.model.llama import CausalLM


def tiny_model(arch="Qwen3ForCausalLM", dtype=torch.float32, seed=0) -> CausalLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(architecture=arch, vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                      qk_norm=arch == "Qwen3ForCausalLM")
    model = CausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.to(dtype).eval().requires_grad_(False)


def cached_logits(model: CausalLM, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Prefill `split` tokens, then decode the rest one at a time through a KV cache."""
    cfg = model.cfg
    dtype = next(model.parameters()).dtype
    cache = KVCache(cfg.num_hidden_layers, 1, 64, cfg.num_key_value_heads, cfg.head_dim, dtype, "cpu")
    outs = []
    for chunk in [ids[:, :split]] + [ids[:, i:i + 1] for i in range(split, ids.shape[1])]:
        win = cache.window([0], chunk.shape[1])
        outs.append(model.logits(model(chunk, cache, win)))
        cache.advance([0], chunk.shape[1])
    return torch.cat(outs, dim=1)


def test_parse_spec():
    spec = parse_inflate_spec("24x8192")
    assert (spec.num_layers, spec.intermediate_size) == (24, 8192) and str(spec) == "24x8192"
    for bad in ("", "24", "x8", "24*8", "ax3"):
        with pytest.raises(ValueError, match="LAYERSxINTERMEDIATE"):
            parse_inflate_spec(bad)


def test_smaller_than_trained_is_rejected():
    with pytest.raises(ValueError, match="at least the trained size"):
        inflate_model(tiny_model(), parse_inflate_spec("1x64"))


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "LlamaForCausalLM"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_identical_after_inflation(arch, dtype):
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    model = tiny_model(arch, dtype)
    before_plain = model.logits(model(ids))
    before_cached = cached_logits(model, ids, 5)
    size_before = parameter_count(model)
    inflate_model(model, parse_inflate_spec("5x256"))
    assert model.cfg.num_hidden_layers == 5 and model.cfg.intermediate_size == 256
    assert len(model.model.layers) == 5
    assert parameter_count(model) > 3 * size_before
    # Zero contributions add exactly +0.0, so the logits are bit-identical (not merely close).
    assert torch.equal(model.logits(model(ids)), before_plain)
    assert torch.equal(cached_logits(model, ids, 5), before_cached)
