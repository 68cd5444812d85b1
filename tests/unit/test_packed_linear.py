"""PackedLinear (oneDNN-prepacked bf16 weights) gives exactly F.linear's output; Float32Linear (small weights)
is an fp32 GEMM on the bf16 values, one rounding away from it; pack_linears swaps in place by size."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anydraft.model.packed_linear import (SMALL_WEIGHT_ELEMENTS, Float32Linear, PackedLinear, can_pack, pack_linear,
                                          pack_linears)

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="hardware: this CPU or torch build has no oneDNN bf16 linear packing")


@pytest.mark.parametrize("shape", [(1, 1, 192), (1, 4, 192), (3, 7, 192), (150, 192)])
@pytest.mark.parametrize("out_features,bias", [(320, True), (1024, False), (39237, False)])
def test_packed_linear_is_bit_identical_to_f_linear(shape, out_features, bias):
    g = torch.Generator().manual_seed(out_features)
    linear = nn.Linear(192, out_features, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g))
    x = torch.randn(shape, generator=g).to(torch.bfloat16)
    packed = PackedLinear(linear.weight, linear.bias)
    with torch.inference_mode():
        assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
    assert (packed.in_features, packed.out_features) == (192, out_features)


@pytest.mark.parametrize("out_features,bias", [(320, True), (1024, False)])
def test_float32_linear_rounds_once_and_differs_from_onednn_only_in_summation_order(out_features, bias):
    g = torch.Generator().manual_seed(out_features)
    linear = nn.Linear(192, out_features, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * 0.1)
    x = torch.randn(64, 4, 192, generator=g).to(torch.bfloat16)
    small = pack_linear(linear)
    assert isinstance(small, Float32Linear) and small.weight is linear.weight
    with torch.inference_mode():
        ours = small(x)
        bias32 = None if linear.bias is None else linear.bias.float()
        assert torch.equal(ours, F.linear(x.float(), linear.weight.float(), bias32).to(torch.bfloat16))
        onednn = F.linear(x, linear.weight, linear.bias)
        exact = F.linear(x.double(), linear.weight.double(), None if bias32 is None else bias32.double())
        magnitude = F.linear(x.double().abs(), linear.weight.double().abs(),
                             None if bias32 is None else bias32.double().abs())
    # Both kernels: the exact (float64) result, off by at most one bf16 rounding step plus the standard
    # bound of an fp32 sum of 192 products (which only matters where the products cancel).
    bf16_step = torch.exp2(torch.floor(torch.log2(exact.abs())) - 7)
    tolerance = bf16_step + 192 * 2.0 ** -24 * magnitude
    for value in (ours, onednn):
        assert torch.all((value.double() - exact).abs() <= tolerance)
    assert (ours != onednn).float().mean() < 1e-3   # where they differ at all, rarely (summation order)


def test_pack_linear_picks_the_kernel_by_size():
    rows = SMALL_WEIGHT_ELEMENTS // 192
    assert isinstance(pack_linear(nn.Linear(192, rows, bias=False).to(torch.bfloat16)), Float32Linear)
    assert isinstance(pack_linear(nn.Linear(192, rows + 1, bias=False).to(torch.bfloat16)), PackedLinear)


def test_pack_linears_replaces_every_linear_and_keeps_shared_weights():
    embed = nn.Embedding(50, 16).to(torch.bfloat16)
    model = nn.ModuleDict({"body": nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
                           "head": nn.Linear(16, 50, bias=False)}).to(torch.bfloat16)
    model["head"].weight = embed.weight                  # tied head, as in the shipped models
    assert pack_linears(model) == 3
    assert all(not isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model["head"], Float32Linear) and model["head"].weight is embed.weight   # small: fp32 GEMM


def test_can_pack_only_bfloat16_on_cpu():
    assert not can_pack(torch.device("cpu"), torch.float32)
    assert not can_pack(torch.device("cpu"), torch.float64)
    assert not can_pack(torch.device("meta"), torch.bfloat16)
