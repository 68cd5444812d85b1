"""Cost-emulated target: a function-preserving enlargement of a trained target, for realistic size ratios.

The shipped targets are tiny, so on their own they cost only a few times their drafts and speculative
decoding has little to win. `inflate_model` makes the target cost like a much larger model while it
computes exactly the same logits:

- every decoder layer gets an extra MLP branch (`ZeroOutputMLP`): random gate/up rows (real compute)
  and an all-zero down projection, so the branch adds exactly +0.0 to the residual stream. This is a
  wider MLP whose extra intermediate rows project to zero; it is kept as a separate branch rather than
  one wide matmul so the original rows' reduction order (and so every rounding) is untouched.
- extra decoder layers are appended with random q/k/v/gate/up weights (real attention and MLP work,
  real KV-cache traffic) and all-zero o_proj and down_proj, so each adds exactly +0.0 twice.

x + 0.0 == x in every float format, so logits are bit-identical in float32 and bfloat16 alike. The
hidden size never changes (that would change the function). Everything this produces is *emulated*:
reports must say so.

Size spec `LAYERSxINTERMEDIATE` (e.g. `24x8192`): the inflated target has LAYERS decoder layers in total
(at least the trained count) and every layer's MLP has INTERMEDIATE rows in total (at least the trained
intermediate_size).
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import ModelConfig
from ..model.llama import CausalLM, DecoderLayer

_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class InflateSpec:
    num_layers: int            # decoder layers in total after inflation
    intermediate_size: int     # MLP rows per layer in total after inflation

    def __str__(self) -> str:
        return f"{self.num_layers}x{self.intermediate_size}"


def parse_inflate_spec(text: str) -> InflateSpec:
    match = _SPEC.match(text or "")
    if not match:
        raise ValueError(f"--inflate-target {text!r}: expected LAYERSxINTERMEDIATE, e.g. 24x8192 "
                         f"(total decoder layers x MLP intermediate rows per layer)")
    return InflateSpec(int(match.group(1)), int(match.group(2)))


class ZeroOutputMLP(nn.Module):
    """A SwiGLU MLP whose down projection is all zeros: full compute cost, output exactly zero."""

    def __init__(self, hidden_size: int, extra_rows: int, dtype: torch.dtype, device, generator: torch.Generator):
        super().__init__()
        std = hidden_size ** -0.5
        self.gate_proj = nn.Linear(hidden_size, extra_rows, bias=False, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden_size, extra_rows, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(extra_rows, hidden_size, bias=False, device=device, dtype=dtype)
        with torch.no_grad():
            for linear in (self.gate_proj, self.up_proj):
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * std)
            self.down_proj.weight.zero_()

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class WidenedMLP(nn.Module):
    """The trained MLP plus a zero-output branch: same function, the cost of `trained + extra` rows."""

    def __init__(self, trained: nn.Module, extra: ZeroOutputMLP):
        super().__init__()
        self.trained, self.extra = trained, extra

    def forward(self, x):
        return self.trained(x) + self.extra(x)

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One MLP of trained + extra rows for the native body: the extra down columns are zero, so the
        output is the trained one exactly (zeros add nothing to any partial sum) at the widened cost."""
        gate_up, down = self.trained.fused_weights()
        gate, up = gate_up.chunk(2)
        extra = self.extra
        return (torch.cat([gate, extra.gate_proj.weight, up, extra.up_proj.weight]),
                torch.cat([down, extra.down_proj.weight], dim=1))


def _randomize_(module: nn.Module, generator: torch.Generator) -> None:
    """Random weights (scaled like an init) everywhere, norms at 1: activations stay finite."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[1] ** -0.5)
            else:
                param.zero_()


def _zero_output_layer(cfg: ModelConfig, layer_idx: int, dtype, device, generator) -> DecoderLayer:
    layer = DecoderLayer(cfg, layer_idx).to(device=device, dtype=dtype)
    _randomize_(layer, generator)
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()   # attention adds exactly 0 to the residual
        layer.mlp.down_proj.weight.zero_()      # and so does the MLP
    return layer.requires_grad_(False)


def inflate_model(model: CausalLM, spec: InflateSpec, seed: int = 0) -> CausalLM:
    """Enlarge `model` in place to spec's size; returns it with `cfg` describing the new cost shape.

    Build the ModelRunner (and so its KV cache) after this: the cache needs the new layer count.
    """
    cfg = model.cfg
    if spec.num_layers < cfg.num_hidden_layers or spec.intermediate_size < cfg.intermediate_size:
        raise ValueError(f"--inflate-target {spec}: must be at least the trained size "
                         f"{cfg.num_hidden_layers}x{cfg.intermediate_size} (layers x MLP intermediate rows)")
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    generator = torch.Generator().manual_seed(seed)
    extra_rows = spec.intermediate_size - cfg.intermediate_size
    if extra_rows:
        for layer in model.model.layers:
            layer.mlp = WidenedMLP(layer.mlp, ZeroOutputMLP(cfg.hidden_size, extra_rows, dtype, device, generator))
    new_cfg = dataclasses.replace(cfg, num_hidden_layers=spec.num_layers, intermediate_size=spec.intermediate_size)
    for layer_idx in range(cfg.num_hidden_layers, spec.num_layers):
        model.model.layers.append(_zero_output_layer(new_cfg, layer_idx, dtype, device, generator))
    model.cfg = new_cfg
    model.trained_cfg = cfg
    model.inflate_spec = spec
    return model.eval().requires_grad_(False)


def parameter_count(model: nn.Module) -> int:
    """The weights the model computes with: its parameters, and the ones held only packed for the native AMX
    tiles (TileLinear buffers), which a batch-1 decode reads just the same (the roofline's bytes)."""
    from ..model.packed_linear import TileLinear
    return (sum(p.numel() for p in model.parameters())
            + sum(m.out_features * m.in_features for m in model.modules() if isinstance(m, TileLinear)))
