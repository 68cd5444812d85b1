"""Function-preserving growth: a small checkpoint's weights placed in a real architecture's shape.

The grown model computes the small model's logits (up to floating-point rounding) and costs what the real
architecture costs, since dense matmuls cost the same whatever the values (DESIGN §11). With h, d, n the
small model's hidden size, head dim and query heads, and H, D, N the shape's:

- residual stream: the small model's h dims are written `hidden_copies` (m) times side by side (embedding
  columns, o_proj and down_proj rows); every reader (q/k/v, gate/up, lm_head) reads copy 0 only. Extra dims
  are zero, except a few constant dims (Qwen3 below) in the embedding that no layer reads or writes.
- RMSNorm over H: mean(x²) over H is α = m·h/H times the mean over h (+ Σc²/H from the constant dims), so
  its weight is scaled by √α on copy 0 (zero elsewhere) and the epsilon becomes α·eps − Σc²/H.
- heads: each small query head gets its own slot; a KV head is duplicated when the shape's groups are
  smaller than the small model's (GQA re-grouped); unused heads and their o_proj columns are zero.
- head dim: rotate-half pairs dims (i, i + D/2) with frequency θ^(−2i/D), so the small model's pair i goes
  to pair i·D/d, where it turns at the same frequency. Attention divides by √D instead of √d: Llama scales
  q_proj by √(D/d); Qwen3 normalizes q and k over D with epsilon eps·d/D and scales k_norm by √(d/D).
  That epsilon is also the hidden norms' epsilon, so α·eps ≥ eps·d/D must hold (enough copies) and the
  difference is paid by the constant dims: Σc² = eps·(m·h − H·d/D).
- intermediate rows and layers beyond the small model's: all zero, so each adds exactly +0.0.

Exactness. Tensors are computed in float32 from the small model's weights. Copies and zeros of its bf16
weights are exact in bf16; norm weights scaled by √α or √(d/D) (not powers of two) are not, so the writer
stores those few vectors in float32 (grown.json lists them). Loaded in float32, the grown model is the small
model's function up to float32 rounding (max |Δlogit| ~1e-5 on logits ~10 in the tests). Loaded in bf16, as
engines run it, those vectors round to bf16 (relative error <= 2^-9) and every matmul sums over another width,
so its bf16 logits are close to, not bit-identical with, the small model's bf16 logits. (smollm2-135m and
-360m take whole copies, α = 1, and the same head_dim: there only the summation order differs.)
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..model.config import ModelConfig
from .shapes import Shape

# Constant residual dims are bfloat16 values (exact in every checkpoint dtype); their squares sum to the
# wanted amount within this relative error (float32 rounding), using at most MAX_CONSTANT_DIMS dims.
CONSTANT_RELATIVE_ERROR = 2.0 ** -24
MAX_CONSTANT_DIMS = 8


class GrowError(ValueError):
    """The small checkpoint cannot be grown into the asked shape; the message names the dimension."""


@dataclass(frozen=True)
class GrowthPlan:
    small: ModelConfig
    shape: Shape
    hidden_copies: int                       # m: copies of the small residual stream in the wide one
    hidden_constants: tuple[float, ...]      # constant residual dims placed after the copies
    rms_norm_eps: float                      # the grown config's epsilon (all norms share it)
    q_slots: tuple[int, ...]                 # grown query head of each small query head
    kv_sources: tuple[int | None, ...]       # small KV head copied into each grown KV head (None: zero)

    @property
    def head_stride(self) -> int:            # D / d: small rotary pair i lands on pair i * head_stride
        return self.shape.head_dim // self.small.head_dim

    @property
    def hidden_norm_scale(self) -> float:    # √α
        return math.sqrt(self.hidden_copies * self.small.hidden_size / self.shape.hidden_size)

    @property
    def qk_norm(self) -> bool:
        return self.small.qk_norm


def plan_growth(small: ModelConfig, shape: Shape) -> GrowthPlan:
    """Check that `small` fits in `shape` and choose copies, constants, epsilon and head slots."""
    def fail(dimension: str, why: str):
        raise GrowError(f"cannot grow into {shape.name}: {dimension}: {why}")

    if small.architecture != shape.architecture:
        fail("architecture", f"the shape is {shape.architecture}, the checkpoint is {small.architecture}")
    if small.vocab_size != shape.vocab_size:
        fail("vocab_size", f"the checkpoint has {small.vocab_size} vocab rows, the shape {shape.vocab_size} "
             f"(rows are token ids: they cannot be added or removed)")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        if getattr(small, name) > getattr(shape, name):
            fail(name, f"the checkpoint's {getattr(small, name)} is larger than the shape's {getattr(shape, name)}")
    if shape.head_dim % small.head_dim or small.head_dim % 2:
        fail("head_dim", f"{shape.head_dim} is not a multiple of {small.head_dim} (every rotary frequency of the "
             f"small head must exist in the grown head)")
    if shape.tie_word_embeddings and not small.tie_word_embeddings:   # (tied into untied: lm_head = a copy)
        fail("tie_word_embeddings", "the shape ties lm_head to the embedding, the checkpoint's lm_head is its own")
    if small.attention_bias:
        fail("attention_bias", "checkpoints with attention biases are not supported")

    q_slots, kv_sources = _regroup_heads(small, shape, fail)
    eps = small.rms_norm_eps
    h, big_h = small.hidden_size, shape.hidden_size
    copies = big_h // h
    if not small.qk_norm:
        return GrowthPlan(small, shape, copies, (), eps * copies * h / big_h, q_slots, kv_sources)

    # Qwen3: q/k norms over D need epsilon eps·d/D; the hidden norms reach it with constant dims.
    head_ratio = small.head_dim / shape.head_dim
    while copies >= 1:
        wanted = eps * (copies * h - big_h * head_ratio)   # Σc², must be >= 0
        if wanted < 0:
            break
        constants = _bf16_squares(wanted)
        if copies * h + len(constants) <= big_h:
            return GrowthPlan(small, shape, copies, constants, eps * head_ratio, q_slots, kv_sources)
        copies -= 1
    fail("hidden_size", f"{big_h} holds at most {big_h // h} copies of the checkpoint's {h} dims, which is "
         f"too few for the q/k norms' epsilon over head_dim {shape.head_dim} (needs hidden_size/{h} >= "
         f"{big_h * head_ratio / h:g} with a spare dim)")


def _regroup_heads(small: ModelConfig, shape: Shape, fail) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """Each small KV head with its g query heads becomes ceil(g/G) grown KV heads (copies), G query slots each."""
    group = small.num_attention_heads // small.num_key_value_heads
    big_group = shape.num_attention_heads // shape.num_key_value_heads
    per_kv = -(-group // big_group)
    needed = small.num_key_value_heads * per_kv
    if needed > shape.num_key_value_heads:
        fail("num_key_value_heads", f"the checkpoint's {small.num_attention_heads} query heads in groups of "
             f"{group} need {needed} KV heads in the shape's groups of {big_group}; it has "
             f"{shape.num_key_value_heads}")
    kv_sources = [u for u in range(small.num_key_value_heads) for _ in range(per_kv)]
    kv_sources += [None] * (shape.num_key_value_heads - needed)
    q_slots = []
    for j in range(small.num_attention_heads):
        u, r = divmod(j, group)
        q_slots.append((u * per_kv + r // big_group) * big_group + r % big_group)
    return tuple(q_slots), tuple(kv_sources)


def _bf16_squares(total: float) -> tuple[float, ...]:
    """bfloat16 values whose squares sum to `total` within CONSTANT_RELATIVE_ERROR (each rounded down)."""
    values, remainder = [], total
    while remainder > total * CONSTANT_RELATIVE_ERROR:
        if len(values) == MAX_CONSTANT_DIMS:
            raise GrowError(f"no {MAX_CONSTANT_DIMS} bfloat16 squares sum to {total!r}")
        bits = np.array([math.sqrt(remainder)], dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        value = float(bits.view(np.float32)[0])
        values.append(value)
        remainder -= value * value
    return tuple(values)


def grown_config(plan: GrowthPlan, small_config: dict) -> dict:
    """The small model's config.json with the shape's sizes and the grown epsilon (rope, ids kept)."""
    shape = plan.shape
    cfg = dict(small_config)
    cfg.update(hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
               num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
               num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
               tie_word_embeddings=shape.tie_word_embeddings, rms_norm_eps=plan.rms_norm_eps)
    for stale in ("max_window_layers", "layer_types", "_name_or_path"):
        cfg.pop(stale, None)
    return cfg


def expected_small_names(small: ModelConfig) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not small.tie_word_embeddings:
        names.add("lm_head.weight")
    for layer in range(small.num_hidden_layers):
        names.update(_layer_names(layer, small.qk_norm))
    return names


def _layer_names(layer: int, qk_norm: bool) -> list[str]:
    prefix = f"model.layers.{layer}."
    names = [f"{prefix}self_attn.{p}_proj.weight" for p in "qkvo"]
    names += [f"{prefix}mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    names += [f"{prefix}input_layernorm.weight", f"{prefix}post_attention_layernorm.weight"]
    if qk_norm:
        names += [f"{prefix}self_attn.q_norm.weight", f"{prefix}self_attn.k_norm.weight"]
    return names


def grown_names(plan: GrowthPlan) -> list[str]:
    """The grown checkpoint's tensor names, in the order grown_tensors yields them."""
    names = ["model.embed_tokens.weight"]
    for layer in range(plan.shape.num_hidden_layers):
        names += _layer_names(layer, plan.qk_norm)
    names.append("model.norm.weight")
    if not plan.shape.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def rotary_dim_map(small_head_dim: int, head_dim: int) -> torch.Tensor:
    """[d] grown index of each small head dim: rotate-half pair i = (i, i + d/2) turns at θ^(−2i/d), which
    is pair i·D/d of the grown head = (i·D/d, i·D/d + D/2)."""
    d, stride = small_head_dim, head_dim // small_head_dim
    i = torch.arange(d)
    return torch.where(i < d // 2, i * stride, head_dim // 2 + (i - d // 2) * stride)


class _Placer:
    """Index maps from the small model's axes to the grown ones, and the tensors built with them."""

    def __init__(self, plan: GrowthPlan):
        self.plan = plan
        small, shape = plan.small, plan.shape
        h, d, big_d = small.hidden_size, small.head_dim, shape.head_dim
        pair_of = rotary_dim_map(d, big_d)
        self.q_dst = torch.cat([slot * big_d + pair_of for slot in plan.q_slots])
        self.q_src = torch.arange(small.num_attention_heads * d)
        kv = [(u_big, u) for u_big, u in enumerate(plan.kv_sources) if u is not None]
        self.kv_dst = torch.cat([u_big * big_d + pair_of for u_big, _ in kv])
        self.kv_src = torch.cat([u * d + torch.arange(d) for _, u in kv])
        self.head_dim_dst = pair_of
        self.hidden = torch.arange(h)      # copy 0: what every reader reads

    def zeros(self, *size) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.float32)

    def written_rows(self, small: torch.Tensor, width: int, columns_dst=None, columns_src=None) -> torch.Tensor:
        """[h, C] rows written into the residual stream -> [H, width], every copy filled; the small model's
        columns go to columns_dst (default: the first C)."""
        plan, h = self.plan, self.plan.small.hidden_size
        out = self.zeros(plan.shape.hidden_size, width)
        values = small.float() if columns_src is None else small.float()[:, columns_src]
        for copy in range(plan.hidden_copies):
            if columns_dst is None:
                out[copy * h:(copy + 1) * h, :values.shape[1]] = values
            else:
                out[copy * h:(copy + 1) * h, columns_dst] = values
        return out

    def read_columns(self, small: torch.Tensor, rows: int, rows_dst=None, rows_src=None,
                     scale: float = 1.0) -> torch.Tensor:
        """[R, h] weights reading the normed residual -> [rows, H], reading copy 0 only."""
        out = self.zeros(rows, self.plan.shape.hidden_size)
        values = small.double() * scale if scale != 1.0 else small.float()
        h = self.plan.small.hidden_size
        if rows_dst is None:
            out[:small.shape[0], :h] = values
        else:
            out[rows_dst, :h] = values[rows_src].float()
        return out

    def hidden_norm(self, weight: torch.Tensor) -> torch.Tensor:
        out = self.zeros(self.plan.shape.hidden_size)
        out[:self.plan.small.hidden_size] = weight.double() * self.plan.hidden_norm_scale
        return out

    def head_norm(self, weight: torch.Tensor, scale: float) -> torch.Tensor:
        out = self.zeros(self.plan.shape.head_dim)
        out[self.head_dim_dst] = (weight.double() * scale).float()
        return out

    def embedding(self, small: torch.Tensor) -> torch.Tensor:
        h = self.plan.small.hidden_size
        out = self.zeros(small.shape[0], self.plan.shape.hidden_size)   # [V, H]
        for copy in range(self.plan.hidden_copies):
            out[:, copy * h:(copy + 1) * h] = small
        first = self.plan.hidden_copies * h
        for k, value in enumerate(self.plan.hidden_constants):
            out[:, first + k] = value
        return out


def grown_tensors(plan: GrowthPlan, small_state: dict[str, torch.Tensor],
                  share_zeros: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, float32 tensor) of the grown checkpoint, in grown_names order, one at a time.

    share_zeros: the layers past the small model's yield the same all-zero tensors (read-only use in
    memory: a tests' full-size model without a copy of them per layer); off for writing."""
    names = expected_small_names(plan.small)
    missing, unexpected = names - small_state.keys(), small_state.keys() - names
    if plan.small.tie_word_embeddings:
        unexpected.discard("lm_head.weight")
    if missing or unexpected:
        raise GrowError(f"checkpoint tensors do not match {plan.small.architecture}: missing {sorted(missing)[:4]}, "
                        f"cannot grow {sorted(unexpected)[:4]}")
    place, small, shape = _Placer(plan), plan.small, plan.shape
    embedding = place.embedding(small_state["model.embed_tokens.weight"])
    yield "model.embed_tokens.weight", embedding
    q_rows, kv_rows = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    # Llama: attention divides by √D; q carries √(D/d). Qwen3: k_norm carries √(d/D) (see module docstring).
    q_scale = 1.0 if plan.qk_norm else math.sqrt(plan.head_stride)
    zero_cache: dict[tuple[int, ...], torch.Tensor] = {}
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        if layer >= small.num_hidden_layers:
            for name in _layer_names(layer, plan.qk_norm):
                size = _zero_layer_size(name, shape)
                if not share_zeros:
                    yield name, place.zeros(*size)
                else:
                    yield name, zero_cache.setdefault(size, place.zeros(*size))
            continue
        w = {name.removeprefix(prefix): small_state[name] for name in _layer_names(layer, plan.qk_norm)}
        yield prefix + "self_attn.q_proj.weight", place.read_columns(
            w["self_attn.q_proj.weight"], q_rows, place.q_dst, place.q_src, q_scale)
        yield prefix + "self_attn.k_proj.weight", place.read_columns(
            w["self_attn.k_proj.weight"], kv_rows, place.kv_dst, place.kv_src)
        yield prefix + "self_attn.v_proj.weight", place.read_columns(
            w["self_attn.v_proj.weight"], kv_rows, place.kv_dst, place.kv_src)
        yield prefix + "self_attn.o_proj.weight", place.written_rows(
            w["self_attn.o_proj.weight"], q_rows, place.q_dst, place.q_src)
        yield prefix + "mlp.gate_proj.weight", place.read_columns(w["mlp.gate_proj.weight"], shape.intermediate_size)
        yield prefix + "mlp.up_proj.weight", place.read_columns(w["mlp.up_proj.weight"], shape.intermediate_size)
        yield prefix + "mlp.down_proj.weight", place.written_rows(w["mlp.down_proj.weight"], shape.intermediate_size)
        yield prefix + "input_layernorm.weight", place.hidden_norm(w["input_layernorm.weight"])
        yield prefix + "post_attention_layernorm.weight", place.hidden_norm(w["post_attention_layernorm.weight"])
        if plan.qk_norm:
            yield prefix + "self_attn.q_norm.weight", place.head_norm(w["self_attn.q_norm.weight"], 1.0)
            yield prefix + "self_attn.k_norm.weight", place.head_norm(
                w["self_attn.k_norm.weight"], 1.0 / math.sqrt(plan.head_stride))
    yield "model.norm.weight", place.hidden_norm(small_state["model.norm.weight"])
    if not shape.tie_word_embeddings:
        if small.tie_word_embeddings:
            yield "lm_head.weight", embedding.clone()   # the final norm is zero outside copy 0: same logits
        else:
            yield "lm_head.weight", place.read_columns(small_state["lm_head.weight"], shape.vocab_size)


def _zero_layer_size(name: str, shape: Shape) -> tuple[int, ...]:
    big_h, big_d, inter = shape.hidden_size, shape.head_dim, shape.intermediate_size
    q, kv = shape.num_attention_heads * big_d, shape.num_key_value_heads * big_d
    kind = name.split(".")[-2]
    return {"q_proj": (q, big_h), "k_proj": (kv, big_h), "v_proj": (kv, big_h), "o_proj": (big_h, q),
            "gate_proj": (inter, big_h), "up_proj": (inter, big_h), "down_proj": (big_h, inter),
            "input_layernorm": (big_h,), "post_attention_layernorm": (big_h,),
            "q_norm": (big_d,), "k_norm": (big_d,)}[kind]
