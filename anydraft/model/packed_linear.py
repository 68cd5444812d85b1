"""Linear layers with weights prepacked once for the CPU's matmul library (oneDNN), for bf16 inference.

Why: on CPU, F.linear in bfloat16 reorders the weight into oneDNN's blocked layout on every call. For a
150k-row output head that reordering costs ~3x the matmul itself; for the small decoder layers it is most
of each call. Results are bit-identical to F.linear (tested); other devices and dtypes keep nn.Linear.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Packing pays off (and is exact) for bf16 on a CPU whose torch build has oneDNN."""
    return (torch.device(device).type == "cpu" and dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """y = x @ weight.T + bias with `weight` prepacked. Keeps the dense weight (shared when tied to the
    embedding) so the head can still be pruned or inspected."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        # batch-size hint 1: decode-sized inputs are the hot path; other sizes stay correct.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., in] -> [..., out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linear(linear: nn.Linear) -> PackedLinear:
    bias = None if linear.bias is None else linear.bias.detach()
    return PackedLinear(linear.weight, bias)


def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by a PackedLinear, in place; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, pack_linear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count
