"""The decoder module for the Llama family (Llama, Mistral, Qwen2 qkv bias, Qwen3 q/k norm, SmolLM2).

Parameter names follow HF checkpoints so `load_state_dict` takes `model.safetensors` as-is.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .kv_cache import CacheWindow, KVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalize(x) over the last dim; normalized in at least float32 (as HF does), in float64 when
    the model runs in float64, and rounded to x's dtype before the weight multiplies."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    return weight * F.rms_norm(x.to(compute), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2], with 'linear' or 'llama3' scaling from config.json."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, heads, D] rotated: x*cos + rotate_half(x)*sin, with rotate_half's negation folded into
    signed_sin (exact: -a*b == a*(-b)), so the halves swap in one flip instead of chunk, neg and cat."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * signed_sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        # Inference layout, set by fuse_projections: one q/k/v matmul, q and k norm weights per stacked head.
        self.qkv_proj: nn.Module | None = None
        self.qk_norm_weight: torch.Tensor | None = None

    def fuse_projections(self) -> None:
        """One matmul for q, k and v instead of three (fewer calls per layer; HF names stay loadable). Idempotent."""
        if self.qkv_proj is not None:
            return
        self.qkv_proj = _concat_linears([self.q_proj, self.k_proj, self.v_proj])
        self.q_proj = self.k_proj = self.v_proj = None
        if self.q_norm is not None:
            self.qk_norm_weight = self._stacked_norm_weight().detach()

    def _stacked_norm_weight(self) -> torch.Tensor:   # [H + H_kv, D]
        return torch.cat([self.q_norm.weight.expand(self.num_heads, -1),
                          self.k_norm.weight.expand(self.num_kv_heads, -1)])

    def _project(self, x):
        """x [B, S, hidden] -> qk [B, S, H + H_kv, D] (q heads then k heads), v [B, S, H_kv, D].

        q and k are kept stacked so their norms and rotary embedding run as one op each."""
        b, s, _ = x.shape
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)
        else:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qk_width = (self.num_heads + self.num_kv_heads) * self.head_dim
        qk = qkv[..., :qk_width].unflatten(-1, (-1, self.head_dim))
        v = qkv[..., qk_width:].unflatten(-1, (-1, self.head_dim))
        if self.q_norm is not None:
            weight = self.qk_norm_weight if self.qk_norm_weight is not None else self._stacked_norm_weight()
            qk = rms_norm(qk, weight, self.q_norm.eps)
        return qk, v

    def forward(self, x, cos, signed_sin, cache: KVCache | None, win: CacheWindow | None):
        # x: [B, S, hidden]; cos/signed_sin: [B, S, D]
        b, s, _ = x.shape
        qk, v = self._project(x)
        qk = apply_rope(qk, cos[:, :, None, :], signed_sin[:, :, None, :])
        q, k = qk[:, :, :self.num_heads], qk[:, :, self.num_heads:]
        if cache is None:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True)
        else:
            keys, values = cache.write_and_read(self.layer_idx, win, k, v)   # [B, T, H_kv, D]
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                 attn_mask=win.mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Linear | None = None   # set by fuse_projections (inference)

    def fuse_projections(self) -> None:
        if self.gate_up_proj is not None:
            return
        self.gate_up_proj = _concat_linears([self.gate_proj, self.up_proj])
        self.gate_proj = self.up_proj = None

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, H], down [H, I]) for the native body; needs fuse_projections first."""
        if self.gate_up_proj is None:
            raise ValueError("MLP not fused: call model.fuse_projections() first")
        return self.gate_up_proj.weight, self.down_proj.weight

    def forward(self, x):
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def _concat_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the given Linears' outputs side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=linears[0].bias is not None,
                      device=weight.device, dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False)
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, attention: type[nn.Module] | None = None):
        """attention: the attention module's class (default Attention; DSpark's block attention reuses the rest)."""
        super().__init__()
        self.self_attn = (attention or Attention)(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, win):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, win)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Token ids in, last hidden states out; `logits` applies the (possibly pruned) output head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A plain attribute, not a buffer: module.to(bfloat16) must not round the frequencies.
        self._inv_freq = rope_inv_freq(cfg)
        # Set by the runner when the native body can run this model (model/native_extension.py); it then runs the
        # runner's cached forwards, and this module's forward stays the PyTorch path (training, references).
        self.native = None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        # Angles in float32 as HF computes them, so both agree in every dtype.
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        freqs = positions.float()[..., None] * self._inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        signed_sin = torch.cat((-sin[..., :sin.shape[-1] // 2], sin[..., sin.shape[-1] // 2:]), dim=-1)
        return emb.cos().to(dtype), signed_sin.to(dtype)   # [B, S, D] each, see apply_rope

    def fuse_projections(self) -> None:
        """Inference layout: q/k/v and gate/up each become one matmul. Call after loading weights."""
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse_projections()

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None, win: CacheWindow | None = None,
                positions: torch.Tensor | None = None, capture_layers: list[int] | None = None):
        """input_ids [B, S] -> hidden [B, S, hidden]. Without a cache: plain causal attention (training).

        capture_layers: also return the residual stream at the input of these layers, side by side
        [B, S, len * hidden] (id i = after i layers: 0 the embeddings, num_layers the last layer's output
        before the final norm; what a hidden-state draft reads, speculators' layer ids)."""
        x = self.model.embed_tokens(input_ids)
        if win is not None:
            positions = win.positions
        elif positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        cos, signed_sin = self.rope(positions, x.dtype)
        captured = {}
        for i, layer in enumerate(self.model.layers):
            if capture_layers is not None and i in capture_layers:
                captured[i] = x
            x = layer(x, cos, signed_sin, cache, win)
        if capture_layers is None:
            return self.model.norm(x)
        captured[len(self.model.layers)] = x
        return self.model.norm(x), torch.cat([captured[i] for i in capture_layers], dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
