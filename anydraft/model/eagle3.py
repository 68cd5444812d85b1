"""The EAGLE-3 draft module: the target's hidden states of a few layers, fused, plus the embedding of a token.

Entry j of the draft's sequence pairs target token x_j with the fused target hidden states of the position
before it (what the target computed while reading x_{j-1}); its output predicts x_{j+1}. A drafted token's
entry pairs it with the draft's own output at the previous entry instead (no target state exists for it).
Parameter names are the speculators checkpoint's, so its model.safetensors loads as-is.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .kv_cache import CacheWindow, KVCache
from .llama import MLP, Attention, DecoderLayer, RMSNorm, rope_inv_freq


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos and sign-folded sin [B, S, D] for llama.apply_rope, computed as CausalLM.rope does."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    half = sin.shape[-1] // 2
    return emb.cos().to(dtype), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).to(dtype)


class Eagle3FirstLayer(nn.Module):
    """A decoder layer whose attention reads [norm(embedding), norm(hidden)] (2 x hidden wide); the residual
    stream is the hidden part."""

    def __init__(self, cfg: ModelConfig, norm_before_residual: bool):
        super().__init__()
        self.self_attn = Attention(cfg, 0)
        h, bias = cfg.hidden_size, cfg.attention_bias
        attn = self.self_attn
        attn.q_proj = nn.Linear(2 * h, attn.num_heads * attn.head_dim, bias=bias)
        attn.k_proj = nn.Linear(2 * h, attn.num_kv_heads * attn.head_dim, bias=bias)
        attn.v_proj = nn.Linear(2 * h, attn.num_kv_heads * attn.head_dim, bias=bias)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, cos, sin, cache, win):
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)
        x = residual + self.self_attn(x, cos, sin, cache, win)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Draft(nn.Module):
    """fc over the concatenated target states, the layers, the final norm and the (possibly reduced) head.

    `embed_tokens` and `lm_head` may be the target's own tensors (a checkpoint may omit them: speculators then
    takes the verifier's); they are never modified here.
    """

    def __init__(self, cfg: ModelConfig, num_aux: int, target_hidden_size: int, head_rows: int,
                 norm_before_residual: bool = False, norm_output: bool = False):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.fc = nn.Linear(num_aux * target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([Eagle3FirstLayer(cfg, norm_before_residual)] +
                                    [DecoderLayer(cfg, i) for i in range(1, cfg.num_hidden_layers)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, head_rows, bias=False)
        self.norm_output = norm_output
        self._inv_freq = rope_inv_freq(cfg)   # plain attribute: .to(bfloat16) must not round it

    def fuse_projections(self) -> None:
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse_projections()

    def fuse_target_states(self, target_states: torch.Tensor) -> torch.Tensor:
        """[..., num_aux * target_hidden] -> [..., hidden]: what entry j reads of the target."""
        return self.fc(target_states)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, cache: KVCache | None,
                win: CacheWindow) -> torch.Tensor:
        """input_ids [B, S] (target ids), hidden [B, S, hidden] (fused target states, or the draft's previous
        output) -> the output carried to the next entry [B, S, hidden]; `head_input` turns it into logits'
        input. Attention reads the cache through `win` (its positions and mask)."""
        embeds = self.embed_tokens(input_ids)
        cos, sin = rope_tables(self._inv_freq, win.positions, embeds.dtype)
        x = self.layers[0](embeds, hidden, cos, sin, cache, win)
        for layer in self.layers[1:]:
            x = layer(x, cos, sin, cache, win)
        return self.norm(x) if self.norm_output else x

    def head_input(self, carried: torch.Tensor) -> torch.Tensor:
        return carried if self.norm_output else self.norm(carried)

    def logits(self, carried: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., head_rows] draft logits."""
        return self.lm_head(self.head_input(carried))
