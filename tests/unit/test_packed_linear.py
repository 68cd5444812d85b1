"""PackedLinear (oneDNN-prepacked bf16 weights) gives exactly F.linear's output; pack_linears swaps in place."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anydraft.model.packed_linear import PackedLinear, can_pack, pack_linear, pack_linears

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="this torch build has no oneDNN linear packing")


@pytest.mark.parametrize("shape", [(1, 1, 192), (1, 4, 192), (3, 7, 192), (150, 192)])
@pytest.mark.parametrize("out_features,bias", [(320, True), (1024, False), (39237, False)])
def test_packed_linear_is_bit_identical_to_f_linear(shape, out_features, bias):
    g = torch.Generator().manual_seed(out_features)
    linear = nn.Linear(192, out_features, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g))
    x = torch.randn(shape, generator=g).to(torch.bfloat16)
    packed = pack_linear(linear)
    with torch.inference_mode():
        assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
    assert (packed.in_features, packed.out_features) == (192, out_features)


def test_pack_linears_replaces_every_linear_and_keeps_shared_weights():
    embed = nn.Embedding(50, 16).to(torch.bfloat16)
    model = nn.ModuleDict({"body": nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
                           "head": nn.Linear(16, 50, bias=False)}).to(torch.bfloat16)
    model["head"].weight = embed.weight                  # tied head, as in the shipped models
    assert pack_linears(model) == 3
    assert all(not isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model["head"], PackedLinear) and model["head"].weight is embed.weight


def test_can_pack_only_bfloat16_on_cpu():
    assert not can_pack(torch.device("cpu"), torch.float32)
    assert not can_pack(torch.device("cpu"), torch.float64)
    assert not can_pack(torch.device("meta"), torch.bfloat16)
