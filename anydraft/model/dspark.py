"""The DSpark draft module: a whole block of draft tokens in one forward, conditioned on the target's states.

DFlash backbone: the fused target states of the context (positions before the block's anchor) enter every
layer only as keys and values (k_proj / v_proj of the same fused states, at their positions); the block
(the anchor token, then mask tokens) attends to all of them and, bidirectionally, to itself. DSpark adds a
low-rank Markov bias B = W2 W1 from the previous token to each slot's logits. Qwen3 layers (q/k norms), as
speculators builds them. Parameter names are the speculators checkpoint's.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .eagle3 import rope_tables
from .kv_cache import CacheWindow, KVCache
from .llama import DecoderLayer, RMSNorm, apply_rope, rope_inv_freq


class DSparkAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def keys_values(self, x, cos, sin):
        """x [B, S, hidden] -> rotated keys, values [B, S, H_kv, D]."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (-1, self.head_dim)))
        return apply_rope(k, cos[:, :, None], sin[:, :, None]), self.v_proj(x).unflatten(-1, (-1, self.head_dim))

    def write_context(self, context, cos, sin, cache: KVCache, win: CacheWindow) -> None:
        """Keys and values of the fused target states, into the cache at their positions."""
        k, v = self.keys_values(context, cos, sin)
        cache.write_and_read(self.layer_idx, win, k, v)

    def forward(self, x, cos, sin, cache, win):
        """The block's queries over the cached context and the block itself (win.mask says which keys)."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).unflatten(-1, (-1, self.head_dim)))
        q = apply_rope(q, cos[:, :, None], sin[:, :, None])
        k, v = self.keys_values(x, cos, sin)
        keys, values = cache.write_and_read(self.layer_idx, win, k, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=win.mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MarkovHead(nn.Module):
    """logit bias of the next slot from the previous token: markov_w2(markov_w1[previous target id])."""

    def __init__(self, target_vocab_rows: int, head_rows: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(target_vocab_rows, rank)
        self.markov_w2 = nn.Linear(rank, head_rows, bias=False)

    def forward(self, previous_target_ids: torch.Tensor) -> torch.Tensor:   # [B, 1] -> [B, 1, N]
        return self.markov_w2(self.markov_w1(previous_target_ids))


class DSparkDraft(nn.Module):
    def __init__(self, cfg: ModelConfig, num_aux: int, target_hidden_size: int, head_rows: int, block_size: int,
                 markov_rank: int, target_vocab_rows: int):
        super().__init__()
        if not cfg.qk_norm:
            raise ValueError("DSpark layers are Qwen3 layers (q/k norms); transformer_layer_config.model_type must "
                             "be qwen3")
        self.cfg, self.block_size = cfg, block_size
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.fc = nn.Linear(num_aux * target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, attention=DSparkAttention) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, head_rows, bias=False)
        self.markov_head = MarkovHead(target_vocab_rows, head_rows, markov_rank) if markov_rank > 0 else None
        self._inv_freq = rope_inv_freq(cfg)

    def fuse_projections(self) -> None:
        """Kept unfused: the context needs k/v alone, the block q/k/v (the layers are small)."""

    def fuse_target_states(self, target_states: torch.Tensor) -> torch.Tensor:
        """[..., num_aux * target_hidden] -> [..., hidden]: the context every layer reads as keys and values."""
        return self.hidden_norm(self.fc(target_states))

    def write_context(self, context: torch.Tensor, cache: KVCache, win: CacheWindow) -> None:
        """context [B, S, hidden] (fused target states at win.positions) -> each layer's keys/values in cache."""
        cos, sin = rope_tables(self._inv_freq, win.positions, context.dtype)
        for layer in self.layers:
            layer.self_attn.write_context(context, cos, sin, cache, win)

    def forward(self, block_ids: torch.Tensor, cache: KVCache, win: CacheWindow) -> torch.Tensor:
        """block_ids [B, block] (anchor, then mask tokens) -> hidden after the final norm [B, block, hidden]."""
        x = self.embed_tokens(block_ids)
        cos, sin = rope_tables(self._inv_freq, win.positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, cache, win)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def markov_bias(self, previous_target_ids: torch.Tensor) -> torch.Tensor | float:
        return 0.0 if self.markov_head is None else self.markov_head(previous_target_ids)


def block_window(cache: KVCache, rows: list[int], block_size: int) -> CacheWindow:
    """Positions and mask for a block after each row's cached context: every block query sees the whole
    context and the whole block (bidirectional), nothing past it. The block's entries are not kept."""
    win = cache.window(rows, block_size)
    lengths_t = torch.tensor([cache.lengths[r] for r in rows], dtype=torch.long)
    visible = torch.arange(win.num_keys)[None, :] < (lengths_t + block_size)[:, None]          # [B, T]
    mask = torch.zeros(visible.shape, dtype=cache.k.dtype).masked_fill_(~visible, float("-inf"))
    mask = mask.to(cache.device, non_blocking=True)[:, None, None, :].expand(-1, 1, block_size, -1)
    return replace(win, mask=mask)
