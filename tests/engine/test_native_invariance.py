"""The native kernels at real layer sizes (Qwen3-0.6B and 1.7B shapes, random weights): a row computed alone,
inside batches of several shapes, at any place in them, in a prefill, and with 1 or 2 threads is bit-identical;
the greedy head falls back to full logits (same ids) when its int8 screen cannot narrow a row."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from anydraft.bench.inflate import parameter_count
from anydraft.model.config import ModelConfig
from anydraft.model.llama import CausalLM
from anydraft.model.native_extension import cpu_has, has_avx512, load_extension, why_not_screened_head
from anydraft.model.native_head import NativeHead
from anydraft.model.runner import ModelRunner

from test_native_decoder import needs_native

pytestmark = needs_native

CPU = torch.device("cpu")
# (hidden, intermediate): Qwen3-0.6B and Qwen3-1.7B layers; heads 16 / 8 of 128 as both have.
SIZES = {"0.6B": (1024, 3072), "1.7B": (2048, 6144)}


class threads:
    """torch's intra-op threads set for a block, restored after (conftest keeps one)."""

    def __init__(self, count: int):
        self.count = count

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.count)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) / cols ** 0.5).bfloat16()


SHAPES = [(1024, 4096), (1024, 6144), (3072, 1024), (2048, 12288), (6144, 2048),
          (1040, 1000)]   # the last: a column tail (1040 % 32: always the AVX-512 path) and a row tail (% 16)


def check_linear(cols: int, rows: int) -> None:
    """The linear kernel every layer uses (head_logits is it without bias): each output row is the same function
    of its own input row whatever M, the row's place, or the threads."""
    extension = load_extension()
    weight = _weight(rows, cols, seed=rows + cols)
    x = torch.randn(17, cols, generator=torch.Generator().manual_seed(cols)).bfloat16()
    with threads(1):
        alone = torch.cat([extension.head_logits(x[i:i + 1], weight) for i in range(17)])
    for count in (1, 2):
        with threads(count):
            assert torch.equal(extension.head_logits(x, weight), alone)
            for size in (2, 3, 4, 5, 8, 16):
                order = torch.randperm(17, generator=torch.Generator().manual_seed(size))[:size]
                assert torch.equal(extension.head_logits(x[order], weight), alone[order]), (count, size)
    exact = x.double() @ weight.double().T
    assert ((alone.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()   # one bf16 rounding


@pytest.mark.parametrize("cols, rows", SHAPES)
def test_linear_rows_are_bit_identical_alone_in_any_batch_and_thread_count(cols, rows):
    check_linear(cols, rows)


def _lanes_then_tree(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The row-major kernel's documented arithmetic (linear.h), in PyTorch: each output's 16 fp32 lanes, lane i
    summing column pairs 16s + i of step s (the odd column's exact product, then the even one's), then
    reduce_tree's fixed tree and one bf16 rounding. [M, K] x [N, K] -> [M, N]."""
    steps = -(-x.shape[1] // 32)
    pad = steps * 32 - x.shape[1]
    xs = torch.nn.functional.pad(x.float(), (0, pad)).view(x.shape[0], 1, steps, 16, 2)
    ws = torch.nn.functional.pad(weight.float(), (0, pad)).view(1, weight.shape[0], steps, 16, 2)
    lanes = torch.zeros(x.shape[0], weight.shape[0], 16)
    for s in range(steps):
        lanes = lanes + xs[:, :, s, :, 1] * ws[:, :, s, :, 1]
        lanes = lanes + xs[:, :, s, :, 0] * ws[:, :, s, :, 0]
    t = lanes[..., :8] + lanes[..., 8:]
    u = t[..., :4] + t[..., 4:]
    return ((u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])).bfloat16()


@pytest.mark.parametrize("cols, rows", [(2048, 256), (1040, 100), (48, 37)])
def test_linear_rows_follow_the_documented_lane_order(cols, rows):
    """Off AMX, head_logits is linear.h's vector kernel: every output equals its documented arithmetic bit for
    bit at 1-9 rows (each register tile, a column tail of 16 past the last 32, a weight-row tail). Row 0 adds
    +-2^26 times equal weights in the first and last column pairs, so which small products survive depends on
    the order of the additions: the packed kernel's order gives other values there (the control)."""
    extension = load_extension()
    if extension.matmul_path(cols) == "amx":
        pytest.skip("hardware: AMX computes this width (tile dot products, another documented order)")
    weight = _weight(rows, cols, seed=rows + 7 * cols)
    weight[:, cols - 2] = weight[:, 0]
    x = torch.randn(9, cols, generator=torch.Generator().manual_seed(cols + 2)).bfloat16()
    x[0, 0], x[0, cols - 2] = 2.0 ** 26, -2.0 ** 26
    expected = _lanes_then_tree(x, weight)
    for size in range(1, 10):
        assert torch.equal(extension.head_logits(x[:size], weight), expected[:size]), size
    assert not torch.equal(expected[0], _pairs_in_k_order(x[:1], weight)[0])


def test_prefill_sized_batches_give_each_row_its_alone_value():
    """600 rows (more than one 256-row block of the AMX path): every row equals the row computed alone."""
    extension = load_extension()
    weight = _weight(1056, 1024, seed=5)   # 1056 rows: a weight-row tail past the last 32
    x = torch.randn(600, 1024, generator=torch.Generator().manual_seed(6)).bfloat16()
    together = extension.head_logits(x, weight)
    alone = torch.cat([extension.head_logits(x[i:i + 1], weight) for i in range(600)])
    assert torch.equal(together, alone)


def _pairs_in_k_order(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The AVX-512 packed kernel's documented arithmetic (vector_gemm.h), in PyTorch: for each output an fp32 sum
    over the input pairs in k order, each step adding the odd column's exact product, then the even one's
    (VDPBF16PS), then one bf16 rounding. [M, K] x [N, K] -> [M, N]."""
    xf, wf = x.float(), weight.float()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for p in range(0, x.shape[1], 2):
        acc = acc + xf[:, p + 1:p + 2] * wf[:, p + 1]   # bf16 x bf16 is exact in fp32: one rounding per addition
        acc = acc + xf[:, p:p + 1] * wf[:, p]
    return acc.bfloat16()


@pytest.mark.parametrize("cols, rows", [(1024, 4096), (2048, 12288), (6144, 2048), (1024, 1040), (1040, 1000)])
def test_body_weights_packed_give_each_row_its_alone_value_in_any_batch(cols, rows):
    """The body's linear layers read weights packed in the tile layout: every output equals that row computed
    alone, in batches of any size (600: prefill-sized; 1040 rows: a weight-row tail past the last 32) and with 1
    or 2 threads. Its value is the AMX path's row-major one (head_logits) where AMX runs the width, else the
    AVX-512 kernel's documented order (pairs in k order), bit for bit."""
    extension = load_extension()
    weight = _weight(rows, cols, seed=rows * 3 + cols)
    packed = extension.pack_body_weight(weight)
    assert packed is not None and packed.shape == ((rows + 31) // 32 * 2, cols // 2, 16, 2)
    x = torch.randn(600, cols, generator=torch.Generator().manual_seed(cols + 1)).bfloat16()
    picks = torch.randperm(600, generator=torch.Generator().manual_seed(2))[:12]
    with threads(1):
        alone = torch.cat([extension.body_linear(x[i:i + 1], packed, rows) for i in picks])
    expected = (extension.head_logits(x[picks], weight) if extension.matmul_path(cols) == "amx"
                else _pairs_in_k_order(x[picks], weight))
    assert torch.equal(alone, expected)
    for count in (1, 2):
        with threads(count):
            assert torch.equal(extension.body_linear(x, packed, rows)[picks], alone), count
            for size in (3, 8, 9, 17, 40):
                assert torch.equal(extension.body_linear(x[picks[:size]], packed, rows), alone[:size]), (count, size)
    assert extension.pack_body_weight(_weight(64, 47, seed=1)) is None   # odd width: no pairs, stays row-major


def test_the_packed_kernel_reference_tells_the_summation_order_apart():
    """Control for the test above: the pairs-in-k-order reference is not met by another order of the same sums
    (reversed pairs) on these weights, so an equality with it checks the order, not only the rounding."""
    weight = _weight(256, 2048, seed=3)
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(4)).bfloat16()
    reversed_order = _pairs_in_k_order(x.flip(1), weight.flip(1))
    assert not torch.equal(_pairs_in_k_order(x, weight), reversed_order)


def test_the_model_keeps_one_copy_of_a_packed_weight_and_its_pytorch_path_still_runs():
    """Where the native body packs a layer's weights, the model's modules hold only the packed copy (no second
    3.4 GB for a 1.7B model); the PyTorch forward (references) unpacks them to the very weights it had."""
    model = _layer_model(*SIZES["0.6B"], seed=5)
    model.fuse_projections()
    dense = {name: p.detach().clone() for name, p in model.named_parameters() if p.dim() == 2}
    count = parameter_count(model)
    ids = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        before = model(ids)
    runner = ModelRunner(model, max_batch=1, max_len=16)
    layer = runner.model.model.layers[0]
    assert [type(m).__name__ for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                       layer.mlp.down_proj)] == ["TileLinear"] * 4
    assert torch.equal(layer.mlp.down_proj.weight, dense["model.layers.0.mlp.down_proj.weight"])
    assert torch.equal(layer.self_attn.qkv_proj.weight, dense["model.layers.0.self_attn.qkv_proj.weight"])
    with torch.inference_mode():
        assert torch.equal(runner.model(ids), before)
    # The packed weights are buffers, not parameters; the count (the roofline's bytes) still holds every weight.
    assert sum(p.numel() for p in runner.model.parameters()) < count
    assert parameter_count(runner.model) == count


@pytest.mark.parametrize("setting, path", [
    pytest.param("1", "amx", marks=pytest.mark.skipif(not cpu_has("amx_bf16"), reason="hardware: no AMX")),
    ("0", "avx512" if has_avx512() else "avx2")])
def test_each_path_is_batch_invariant_when_forced(setting, path):
    """ANYDRAFT_NATIVE_AMX (read once per process): =1 takes the AMX tile kernel at every width that is a multiple
    of 32, =0 the AVX-512 kernel at every width; by default an AMX machine runs AMX from width 128, so without
    these the AVX-512 kernel would go untested at real widths there."""
    code = ("import sys; sys.path.insert(0, {here!r}); import test_native_invariance as t; "
            "from anydraft.model.native_extension import load_extension; "
            f"assert load_extension().matmul_path(1024) == {path!r}; "
            "[t.check_linear(c, r) for c, r in [(1024, 4096), (3072, 1024), (192, 512), (1040, 1000)]]")
    done = subprocess.run([sys.executable, "-c", code.format(here=str(Path(__file__).parent))], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "ANYDRAFT_NATIVE_AMX": setting})
    assert done.returncode == 0, done.stderr[-3000:]


def _layer_model(hidden: int, intermediate: int, seed: int = 0) -> CausalLM:
    cfg = ModelConfig(architecture="Qwen3ForCausalLM", vocab_size=512, hidden_size=hidden,
                      intermediate_size=intermediate, num_hidden_layers=1, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6)
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model.to(torch.bfloat16)


@pytest.fixture(scope="module", params=list(SIZES))
def runner(request):
    runner = ModelRunner(_layer_model(*SIZES[request.param]), max_batch=4, max_len=64)
    assert runner.kernels["body"] == "native", runner.kernels
    return runner


def test_body_rows_are_bit_identical_alone_batched_prefilled_and_threaded(runner):
    """Three requests: each token decoded alone (one thread) = the same tokens verified 4 at a time beside the
    other rows, in another order (two threads) = the prompt's prefill (many tokens of one request in one call,
    through the same kernels) = all three prompts prefilled together (one ragged sequence of their tokens)."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (11, 6, 9)]
    new = torch.randint(0, 512, (3, 4), generator=gen)

    def reset():
        for row in range(4):
            runner.cache.reset(row)

    alone = []   # per request: hidden of every prompt and new token, one token per forward
    with threads(1):
        for b, prompt in enumerate(prompts):
            reset()
            alone.append(torch.cat([runner.forward([2], torch.tensor([[t]]))[0] for t in prompt + new[b].tolist()]))
    with threads(2):
        reset()
        prefilled = [runner.forward([row], torch.tensor([p]))[0] for row, p in zip((1, 3, 0), prompts)]
        together = runner.forward([0, 1, 3], new[[2, 0, 1]])   # rows hold prompts 2, 0, 1
        reset()
        last = runner.prefill_rows([0, 1, 2], prompts)[:, 0]
    for b, prompt in enumerate(prompts):
        assert torch.equal(prefilled[b], alone[b][:len(prompt)]), f"prefill of request {b}"
        assert torch.equal(last[b], alone[b][len(prompt) - 1]), f"ragged prefill of request {b}"
    for j, b in enumerate((2, 0, 1)):
        assert torch.equal(together[j], alone[b][len(prompts[b]):]), f"verification of request {b}"
    with threads(2):
        ids_together = runner.greedy_ids(together)
    with threads(1):
        ids_alone = torch.stack([runner.greedy_ids(alone[b][len(prompts[b]):]) for b in (2, 0, 1)])
    assert torch.equal(ids_together, ids_alone)


def test_body_is_as_close_to_float64_as_the_pytorch_path_at_real_size(monkeypatch):
    """At the 0.6B layer size the native rounding is no worse than oneDNN's (both against float64)."""
    model = _layer_model(*SIZES["0.6B"], seed=3)
    reference = CausalLM(model.cfg)
    reference.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    reference.double()
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        exact = reference(ids)
    errors = {}
    for native in ("1", "0"):
        monkeypatch.setenv("ANYDRAFT_NATIVE", native)
        runner = ModelRunner(_layer_model(*SIZES["0.6B"], seed=3), max_batch=2, max_len=16)
        assert (runner.kernels["body"] == "native") == (native == "1")
        errors[native] = (runner.forward([0, 1], ids).double() - exact).abs().mean().item()
    assert errors["1"] <= 1.5 * errors["0"], errors
    assert errors["1"] < 0.02 * exact.abs().mean().item()


@pytest.mark.skipif(why_not_screened_head() is not None, reason=f"hardware: {why_not_screened_head()}")
def test_greedy_head_falls_back_to_full_logits_when_the_screen_cannot_narrow(monkeypatch):
    """One huge activation (as a repeated token gives) makes the int8 copy of the row all but zero: the screen
    bounds every head row loosely. Those rows take all their logits at once; the ids stay the argmax."""
    weight = _weight(20000, 1024, seed=9)
    weight[:, 7] = 0.01   # the outlier column: the same for every head row, so it decides nothing
    head = NativeHead(weight, load_extension())
    gen = torch.Generator().manual_seed(10)
    hidden = torch.randn(6, 1024, generator=gen) * 0.05
    hidden[:3, 7] = 3000.0   # rows 0-2 degenerate, rows 3-5 ordinary
    hidden = hidden.bfloat16()
    expected = head.logits(hidden)[:, :19990].float().argmax(dim=-1)
    for count in (1, 2):
        with threads(count):
            ids, fell_back = head.greedy_with_report(hidden, 19990)
            assert torch.equal(ids, expected)
            assert fell_back.tolist() == [True] * 3 + [False] * 3
            assert torch.equal(head.greedy(hidden[3:], 19990), expected[3:])
            assert torch.equal(head.greedy(hidden[:1], 19990), expected[:1])
