"""Linear layers prepared once for the CPU's matmul libraries, for bf16 inference.

Why: on CPU, F.linear in bfloat16 reorders the weight into oneDNN's blocked layout on every call. For a
150k-row output head that reordering costs ~3x the matmul itself. `PackedLinear` prepacks the weight once
and is bit-identical to F.linear (tested). For small weights (a decoder layer at hidden ~200), oneDNN's
per-call overhead dominates even when prepacked, and `Float32Linear`, an fp32 GEMM on the bf16 values,
takes ~15-20% off a decoder body; its outputs differ from oneDNN's in summation order only (tested).
Other devices and dtypes keep nn.Linear. `TileLinear` holds a weight the native body reads in its tile layout
(model/csrc/vector_gemm.h), its only copy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Weights up to this many elements (1024 x 1024) take the fp32 GEMM; larger ones (heads, real-size layers,
# where AMX/AVX-512 bf16 kernels win) stay oneDNN-prepacked. A fixed rule: the kernel, and so the rounding,
# never depends on a timing.
SMALL_WEIGHT_ELEMENTS = 1 << 20


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Packing pays off (and is exact) for bf16 on a CPU whose torch build has oneDNN and whose instructions its
    bf16 linear needs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: on an AVX2-only CPU it refuses to pack)."""
    return (torch.device(device).type == "cpu" and dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and onednn_bf16_linear_supported())


def onednn_bf16_linear_supported() -> bool:
    """Whether this CPU has the instructions oneDNN's bf16 linear requires (its own error message names them)."""
    from .native_extension import cpu_has   # imported here: native_extension imports this module
    return cpu_has("avx_ne_convert") or all(cpu_has(f) for f in ("avx512bw", "avx512vl", "avx512dq"))


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


class Float32Linear(nn.Module):
    """y = bf16(x @ weight.T + bias) computed by an fp32 GEMM on the bf16 values.

    Products of bf16 values are exact in fp32, and oneDNN's bf16 kernel also accumulates in fp32 and
    rounds once, so the two differ only in summation order: by one bf16 step, on a few outputs in 10^4."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.register_buffer("weight32", weight.detach().float(), persistent=False)
        self.register_buffer("bias32", None if bias is None else bias.detach().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., in] -> [..., out]
        return F.linear(x.float(), self.weight32, self.bias32).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp32 GEMM on bf16 values"


def pack_linear(linear: nn.Linear) -> PackedLinear | Float32Linear:
    """The CPU bf16 inference form of a Linear: fp32 GEMM when small, oneDNN-prepacked otherwise."""
    bias = None if linear.bias is None else linear.bias.detach()
    if linear.weight.numel() <= SMALL_WEIGHT_ELEMENTS:
        return Float32Linear(linear.weight, bias)
    return PackedLinear(linear.weight, bias)


def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by its pack_linear form, in place; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, pack_linear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count


class NativeLinear(nn.Module):
    """y = bf16(x @ weight.T) on the native kernels' row-major linear (head_logits, csrc/linear.h): every output
    computed the same way whatever the batch. The output head where the native body runs but the screened head
    (NativeHead) does not (AVX2 CPUs): with it, a verification's logits equal a decode step's bit for bit."""

    def __init__(self, weight: torch.Tensor, extension):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.extension = extension

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., in] -> [..., out] bf16
        return self.extension.head_logits(x, self.weight.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, native row-major kernel"


class TileLinear(nn.Module):
    """A Linear whose weight lives only in the native body's tile layout, packed [ceil(N/32) * 2, K/2, 16, 2]
    (csrc/vector_gemm.h; read by AMX tiles or AVX-512 vectors), so the native body reads it without a second
    copy. Its PyTorch forward (references, tests) unpacks the weight on each call: the same values, not fast."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int):
        super().__init__()
        self.out_features, self.in_features = out_features, packed.shape[1] * 2
        self.register_buffer("packed", packed, persistent=False)
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:   # [out, in], unpacked (a copy)
        return self.packed.permute(0, 2, 1, 3).reshape(-1, self.in_features)[:self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., in] -> [..., out]
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=native tile layout"
