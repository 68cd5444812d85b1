"""The model runner against transformers: every supported architecture, tied/untied heads, RoPE scaling,
sharded checkpoints, the KV cache path (ragged batch, rewind), padding rows and load errors."""
from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from anydraft.model.config import ModelConfig, UnsupportedModelError
from anydraft.model.llama import CausalLM
from anydraft.model.loader import load_model
from anydraft.model.packed_linear import can_pack, pack_linears
from anydraft.model.runner import ModelRunner


ARCHS = {
    "LlamaForCausalLM": dict(),
    "MistralForCausalLM": dict(),
    "Qwen2ForCausalLM": dict(attention_bias=True),
    "Qwen3ForCausalLM": dict(qk_norm=True),
}
ROPE_SCALINGS = [None, {"rope_type": "linear", "factor": 2.0},
                 {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}]


def write_random_checkpoint(path, arch, tie, rope_scaling=None, shards=1, seed=0):
    cfg = ModelConfig(architecture=arch, vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tie,
                      rope_theta=5000.0, rope_scaling=rope_scaling, **ARCHS[arch])
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    state = {}
    for name, tensor in model.state_dict().items():
        # Random norms and biases too, so every parameter path is exercised.
        state[name] = torch.randn_like(tensor) * 0.5 + (1.0 if name.endswith("norm.weight") else 0.0)
    if tie:
        state.pop("lm_head.weight")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    names = sorted(state)
    if shards == 1:
        save_file(state, str(path / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: state[n] for n in names[i::shards]}
            save_file(part, str(path / file))
            weight_map.update({n: file for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def hf_logits(path, input_ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids).logits


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tmp_path, arch, tie):
    path = write_random_checkpoint(tmp_path / "ckpt", arch, tie)
    input_ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    model, _ = load_model(path, torch.float32, torch.device("cpu"))
    ours = model.logits(model(input_ids))
    assert torch.allclose(ours, hf_logits(path, input_ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_runner_inference_layout_gives_the_same_logits(tmp_path, monkeypatch, arch, dtype):
    """The runner fuses q/k/v and gate/up; logits stay bit-identical to the model as loaded (the layout
    training uses). In bf16 on CPU both sides get the same kernels (pack_linears: fp32 GEMM for small
    weights, oneDNN-prepacked otherwise), so what is compared is the fusion. The native body, which has
    its own kernels, is compared in test_native_decoder.py."""
    monkeypatch.setenv("ANYDRAFT_NATIVE", "0")
    path = write_random_checkpoint(tmp_path / "ckpt", arch, tie=True)
    input_ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(4))
    plain, _ = load_model(path, dtype, torch.device("cpu"))
    if can_pack(torch.device("cpu"), dtype):
        pack_linears(plain)
    runner = ModelRunner.load(path, dtype, torch.device("cpu"), max_batch=2, max_len=32)
    assert runner.model.model.layers[0].self_attn.q_proj is None   # fused
    with torch.inference_mode():
        assert torch.equal(runner.model.logits(runner.model(input_ids)), plain.logits(plain(input_ids)))
        cached = runner.logits(runner.forward([0, 1], input_ids))
    assert torch.equal(cached.argmax(-1), plain.logits(plain(input_ids)).argmax(-1))


@pytest.mark.parametrize("rope_scaling", ROPE_SCALINGS[1:])
def test_rope_scaling_matches_transformers(tmp_path, rope_scaling):
    path = write_random_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", False, rope_scaling)
    input_ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    model, _ = load_model(path, torch.float32, torch.device("cpu"))
    assert torch.allclose(model.logits(model(input_ids)), hf_logits(path, input_ids), atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    single = write_random_checkpoint(tmp_path / "single", "Qwen3ForCausalLM", False, seed=3)
    sharded = write_random_checkpoint(tmp_path / "sharded", "Qwen3ForCausalLM", False, shards=3, seed=3)
    input_ids = torch.arange(20)[None] * 7 % 300
    a, _ = load_model(single, torch.float32, torch.device("cpu"))
    b, _ = load_model(sharded, torch.float32, torch.device("cpu"))
    assert torch.equal(a.logits(a(input_ids)), b.logits(b(input_ids)))


def test_cached_ragged_batch_and_rewind_equal_full_forward(tmp_path):
    """Rows of different lengths decode through the cache; a rewind then re-feed gives the same logits."""
    path = write_random_checkpoint(tmp_path / "ckpt", "Qwen2ForCausalLM", True)
    runner = ModelRunner.load(path, torch.float64, torch.device("cpu"), max_batch=3, max_len=64)
    seqs = [list(range(5, 17)), list(range(40, 47)), list(range(100, 121))]
    full = [runner.logits(runner.model(torch.tensor([s])))[0] for s in seqs]
    runner.prefill_rows([0, 1, 2], [s[:-4] for s in seqs]) if hasattr(runner, "prefill_rows") else \
        [runner.prefill(r, s[:-4]) for r, s in enumerate(seqs)]
    # 4 more tokens per row in one ragged-free forward; then rewind 3 and feed them again one by one.
    step = torch.tensor([s[-4:] for s in seqs])
    out = runner.logits(runner.forward([0, 1, 2], step))
    for r, s in enumerate(seqs):
        assert torch.allclose(out[r], full[r][-4:], atol=1e-10)
    runner.cache.rewind([0, 1, 2], [3, 3, 3])
    assert runner.cache.lengths[:3] == [len(s) - 3 for s in seqs]
    for i in range(3, 0, -1):
        out = runner.logits(runner.forward([0, 1, 2], torch.tensor([[s[-i]] for s in seqs])))
        for r, s in enumerate(seqs):
            assert torch.allclose(out[r, 0], full[r][-i], atol=1e-10)
    with pytest.raises(ValueError, match="cannot rewind"):
        runner.cache.rewind([0], [1000])


def test_padding_rows_are_never_chosen(tmp_path):
    path = write_random_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", False)
    runner = ModelRunner.load(path, torch.float32, torch.device("cpu"), 1, 32, num_token_rows=250)
    with torch.no_grad():
        runner.model.lm_head.weight[250:] = 100.0  # padding rows would win every argmax if not masked
    logits = runner.logits(runner.forward([0], torch.tensor([[1, 2, 3]])))
    assert logits.shape[-1] == 300
    assert torch.isinf(logits[..., 250:]).all() and (logits.argmax(-1) < 250).all()


def test_bfloat16_and_float64_load_in_the_asked_dtype(tmp_path):
    path = write_random_checkpoint(tmp_path / "ckpt", "Qwen3ForCausalLM", True)
    for dtype in (torch.bfloat16, torch.float64):
        runner = ModelRunner.load(path, dtype, torch.device("cpu"), 1, 16)
        assert {p.dtype for p in runner.model.parameters()} == {dtype}
        assert runner.cache.k.dtype == dtype


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    path = write_random_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", False)
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="Qwen3ForCausalLM"):
        load_model(path, torch.float32, torch.device("cpu"))


def test_missing_weights_are_an_error(tmp_path):
    path = write_random_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", False)
    (path / "model.safetensors").unlink()
    with pytest.raises(UnsupportedModelError, match="safetensors"):
        load_model(path, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("num_new", [1, 4])
def test_additive_window_mask_attends_exactly_as_a_bool_mask(num_new):
    """CacheWindow.mask is additive (built once per forward); attention must give the very same bf16 output
    as with the bool mask it replaces."""
    from anydraft.model.kv_cache import KVCache
    cache = KVCache(1, 2, 64, 1, 16, torch.bfloat16, "cpu")
    cache.lengths = [37, 20]
    win = cache.window([0, 1], num_new)
    visible = win.mask == 0
    assert set(win.mask.unique().tolist()) == {0.0, float("-inf")} and win.mask.dtype == torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, num_new, 16, generator=generator).bfloat16()
    k, v = (torch.randn(2, 1, win.num_keys, 16, generator=generator).bfloat16() for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v, attn_mask=win.mask, enable_gqa=True),
                       sdpa(q, k, v, attn_mask=visible, enable_gqa=True))
    assert visible[1, 0, -1].sum() == 20 + num_new   # row 1 sees its 20 cached keys and the new ones
