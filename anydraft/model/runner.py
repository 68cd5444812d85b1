"""ModelRunner: one model with its KV cache and output-head layout, on one device and dtype."""
from __future__ import annotations

import torch

from ..tensors import greedy_argmax, host_to_device
from .captured_states import CapturedStates
from .kv_cache import KVCache
from .llama import CausalLM
from .loader import load_model
from .native_extension import WIDTH, NativeDecoder, load_extension, why_not_native, why_not_screened_head
from .native_head import SCREEN_WIDTH, NativeHead
from .packed_linear import NativeLinear, can_pack, pack_linear, pack_linears


def token_places(num_new: list[int], seq_len: int) -> list[int]:
    """The places b * seq_len + s of the real tokens of a right-padded [B, seq_len] batch (row b's first num_new[b])."""
    return [b * seq_len + s for b, n in enumerate(num_new) for s in range(n)]


def unpack_tokens(packed: torch.Tensor,   # [1, T, W]: the kept tokens of a ragged forward
                  kept: torch.Tensor,     # [T] their places b * S + s
                  batch: int, seq_len: int) -> torch.Tensor:  # [B, S, W], zeros elsewhere
    out = packed.new_zeros(batch * seq_len, packed.shape[-1])
    out[kept] = packed[0]
    return out.view(batch, seq_len, -1)


class ModelRunner:
    """Runs new tokens of some cache rows through the model; knows which output rows are real tokens.

    Output rows past `num_token_rows` are vocabulary padding (Qwen: 151936 rows, 151669 tokens): their
    logits are set to -inf in every path, so speculative and target-alone decoding agree.

    The runner owns the model and puts it in inference layout: fused q/k/v and gate/up matmuls, and on a
    CPU in bf16 weights prepacked for oneDNN (`packed`).
    """

    def __init__(self, model: CausalLM, max_batch: int, max_len: int, num_token_rows: int | None = None,
                 extras: dict | None = None, num_blocks: int | None = None):
        self.model = model
        self.cfg = model.cfg
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        model.requires_grad_(False)
        model.fuse_projections()
        self.packed = can_pack(self.device, self.dtype)
        # Native body when it can run here (one C++ call per forward); the head's form: _set_head.
        self.native_unavailable = why_not_native(self.cfg, self.device, self.dtype)
        if self.native_unavailable is None:
            try:
                model.native = NativeDecoder(model)
            except ValueError as e:
                self.native_unavailable = str(e)
        # bf16 logits' logprobs on the native kernel (csrc/row_logprobs.cpp) wherever the body could run natively,
        # so a target keeps one logprob rule whether or not a hidden-state draft later turns its body to PyTorch.
        self.logprob_kernel = None if model.native is None else model.native.extension
        if self.packed and model.native is None:
            pack_linears(model.model)   # the body; the head gets its form in _set_head
        self.native_head: NativeHead | None = None
        self.native_head_unavailable: str | None = None   # why the head is not native (set by _set_head)
        self._set_head(model.lm_head)
        self.cache = self._new_cache(max_batch, max_len, num_blocks)
        self.extras = extras or {}
        head_rows = model.lm_head.out_features
        self.num_token_rows = head_rows if num_token_rows is None else min(num_token_rows, head_rows)
        self.head_to_model_rows: torch.Tensor | None = None  # set by prune_head: [N] original row per head row
        # Set by capture_hidden_states: a hidden-state draft's layers; each forward's states wait in `captured` until
        # take_hidden_states hands them over.
        self.capture_layers: list[int] | None = None
        self.captured: list[CapturedStates] = []

    def _new_cache(self, max_batch: int, max_len: int, num_blocks: int | None) -> KVCache:
        return KVCache(self.cfg.num_hidden_layers, max_batch, max_len, self.cfg.num_key_value_heads,
                       self.cfg.head_dim, self.dtype, self.device, num_blocks)

    def allocate_cache(self, num_blocks: int) -> None:
        """Replace the (empty) cache by a pool of num_blocks blocks: loaded with a token pool, sized once the
        budget is known (cache_budget), so loading never holds two full pools."""
        cache = self.cache
        if any(cache.lengths):
            raise RuntimeError("allocate_cache on a cache that holds entries")
        max_batch, max_len = cache.max_batch, cache.max_len
        del self.cache, cache   # the old pool goes before the new one is allocated
        self.cache = self._new_cache(max_batch, max_len, num_blocks)

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one cached token, all layers."""
        return KVCache.bytes_per_token(self.cfg.num_hidden_layers, self.cfg.num_key_value_heads, self.cfg.head_dim,
                                       self.dtype)

    @classmethod
    def load(cls, name_or_path, dtype: torch.dtype, device: torch.device, max_batch: int, max_len: int,
             num_token_rows: int | None = None, num_blocks: int | None = None) -> "ModelRunner":
        model, extras = load_model(name_or_path, dtype, device)
        runner = cls(model, max_batch, max_len, num_token_rows, extras, num_blocks)
        if runner.dtype != dtype or runner.device.type != torch.device(device).type:
            raise RuntimeError(f"{name_or_path}: loaded on {runner.device}/{runner.dtype}, asked {device}/{dtype}")
        return runner

    @property
    def vocab_rows(self) -> int:
        """Embedding rows (the model's vocabulary size as config.json states it)."""
        return self.cfg.vocab_size

    @property
    def head_rows(self) -> int:
        return self.model.lm_head.out_features

    def prune_head(self, keep_rows: torch.Tensor) -> None:
        """Keep only these output rows (sorted model row ids); logits index j then means keep_rows[j].

        Used for a TLI draft: rows outside the intersection are masked anyway, so outputs are unchanged
        while the head matmul shrinks (qwen3's 151936 rows -> ~39k).
        """
        keep_rows = keep_rows.to(self.device)
        head = torch.nn.Linear(self.cfg.hidden_size, len(keep_rows), bias=False, device=self.device, dtype=self.dtype)
        head.weight = torch.nn.Parameter(self.model.lm_head.weight.detach()[keep_rows].clone(), requires_grad=False)
        self._set_head(head)
        self.head_to_model_rows = keep_rows
        self.num_token_rows = len(keep_rows)

    def _set_head(self, head: torch.nn.Linear) -> None:
        """The output head in its inference form: beside the native body, screened (exact greedy argmax without
        all logits) where the CPU has AVX512-VNNI, else on the native linear kernel; without it oneDNN-prepacked on
        CPU bf16, else as is."""
        self.native_head = None
        self.native_head_unavailable = self._why_not_native_head(head)
        if self.native_head_unavailable is None:
            self.native_head = NativeHead(head.weight, load_extension())
            self.model.lm_head = head
        elif self.model.native is not None and head.bias is None and head.in_features % WIDTH == 0:
            self.model.lm_head = NativeLinear(head.weight.detach().contiguous(), load_extension())
        else:
            self.model.lm_head = pack_linear(head) if self.packed else head

    def _why_not_native_head(self, head: torch.nn.Linear) -> str | None:
        if self.model.native is None:
            return f"the native body does not run ({self.native_unavailable})"
        if head.bias is not None:
            return "the output head has a bias"
        if head.in_features % SCREEN_WIDTH:
            return f"hidden size {head.in_features} is not a multiple of {SCREEN_WIDTH}"
        return why_not_screened_head()

    @property
    def kernels(self) -> dict[str, str]:
        """Which kernels run: {"body": ..., "head": ...}, each "native" or "pytorch: <why>" (a head on the native
        linear kernel, not screened: "native logits: <why not screened>"), and "matmul": the native linear layers'
        instructions ("amx", "avx512", "avx2", several joined by "+") or "pytorch" (for reports)."""
        matmul = "pytorch"
        if self.model.native is not None:
            c = self.cfg
            widths = (c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size)
            matmul = "+".join(sorted({self.model.native.extension.matmul_path(k) for k in widths}))
        return {"body": "native" if self.native_unavailable is None else f"pytorch: {self.native_unavailable}",
                "head": self._head_kernel(),
                "matmul": matmul}

    def _head_kernel(self) -> str:
        if self.native_head is not None:
            return "native"
        prefix = "native logits" if isinstance(self.model.lm_head, NativeLinear) else "pytorch"
        return f"{prefix}: {self.native_head_unavailable}"

    def capture_hidden_states(self, layer_ids: list[int]) -> None:
        """From now on every forward also keeps the residual stream at the input of these layers (CausalLM.forward's
        capture_layers) as a CapturedStates, until take_hidden_states: a hidden-state draft reads them at the
        positions the target verified, with no second target forward and no host sync."""
        if self.model.native is not None and not getattr(self.model.native, "can_capture", False):
            # The native body returns only the last hidden state: run the PyTorch body for this target.
            self.model.native = None
            self.native_unavailable = f"a hidden-state draft reads layers {layer_ids}, which the native body does not return"
            if self.packed:
                pack_linears(self.model.model)
        self.capture_layers = list(layer_ids)

    @torch.inference_mode()
    def forward(self, rows: list[int], input_ids: torch.Tensor, num_new: list[int] | None = None) -> torch.Tensor:
        """Append input_ids [B, S] to the rows' caches; returns hidden states [B, S, hidden].

        num_new[b] < S means row b's input is right-padded: only its first num_new[b] tokens are kept.
        """
        seq_len = input_ids.shape[1]
        captured = None
        starts = None if self.capture_layers is None else [self.cache.lengths[r] for r in rows]
        if self.model.native is not None:
            hidden, captured = self._native_forward(rows, input_ids, num_new)
        elif self.capture_layers is None:
            hidden = self.model(input_ids, self.cache, self.cache.window(rows, seq_len, num_new))
        else:
            hidden, captured = self.model(input_ids, self.cache, self.cache.window(rows, seq_len, num_new),
                                          capture_layers=self.capture_layers)
        self.cache.advance(rows, num_new if num_new is not None else seq_len)
        if captured is not None:
            counts = num_new if num_new is not None else seq_len
            self.captured.append(CapturedStates(list(rows), captured, counts, starts))
        return hidden

    def take_hidden_states(self) -> list[CapturedStates]:
        """The states the forwards captured since the last call, oldest first ([] when not capturing)."""
        captured, self.captured = self.captured, []
        return captured

    def _native_forward(self, rows: list[int], input_ids: torch.Tensor, num_new: list[int] | None):
        """One native call, positions as host ints (no window tensors). A right-padded batch runs as one ragged
        sequence of its real tokens (no compute for padding: GSM8K prompts of 40-120 tokens joining together were
        padded to the longest); its outputs are put back in [B, S] places, zeros at the padding."""
        batch, seq_len = input_ids.shape
        positions = self.cache.host_positions(rows, seq_len, num_new)
        ragged = num_new is not None and min(num_new) < seq_len
        if ragged:
            kept = token_places(num_new, seq_len)
            kept_t = torch.tensor(kept, dtype=torch.long, device=input_ids.device)
            input_ids, slots, positions = (input_ids.reshape(1, -1)[:, kept_t], [rows[m // seq_len] for m in kept],
                                           [positions[m] for m in kept])
        else:
            offsets = range(seq_len)
            slots = [row for row in rows for _ in offsets]
        out = self.model.native(input_ids, self.cache, slots, positions, self.capture_layers)
        hidden, captured = out if self.capture_layers is not None else (out, None)
        if not ragged:
            return hidden, captured
        return (unpack_tokens(hidden, kept_t, batch, seq_len),
                None if captured is None else unpack_tokens(captured, kept_t, batch, seq_len))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., head_rows], padding rows at -inf."""
        out = self.model.logits(hidden) if self.native_head is None else self.native_head.logits(hidden)
        if self.num_token_rows < out.shape[-1]:
            out[..., self.num_token_rows:] = float("-inf")
        return out

    @torch.inference_mode()
    def greedy_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> [...] head rows: the argmax of `logits(hidden)`, lowest row on ties,
        computed without all the logits where the native head runs."""
        if self.native_head is not None:
            return self.native_head.greedy(hidden, self.num_token_rows)
        return greedy_argmax(self.logits(hidden))

    @property
    def samples_natively(self) -> bool:
        """Whether sample_ids runs (the native head does); else a caller computes logits and probabilities."""
        return self.native_head is not None

    @torch.inference_mode()
    def sample_ids(self, hidden: torch.Tensor,        # [B, S, hidden]
                   temperature: torch.Tensor,         # [B] > 0
                   keys: torch.Tensor,                # [B, S] int64 noise keys (sampling.draw_keys)
                   noise_ids: torch.Tensor | None = None,  # [head_rows] id whose noise each head row draws with
                   floors: torch.Tensor | None = None,     # [B, S] float: only rows whose logit reaches it
                   ) -> torch.Tensor:                 # [B, S] head rows
        """A head row per position drawn exactly from softmax(logits(hidden) / T) (padding rows never), without
        computing every logit: the native head's Gumbel-max (see NativeHead.sample). Only where samples_natively.
        noise_ids: a draft head's target ids, so that its draw and the target's share their noise per target id.
        floors: each position's smallest kept logit (a top-p cut), the draw restricted to the rows reaching it."""
        batch, seq = hidden.shape[:2]
        rows_t = temperature.to(hidden.device).view(batch, 1).expand(batch, seq).reshape(-1)
        return self.native_head.sample(hidden, self.num_token_rows, rows_t, keys.reshape(-1), noise_ids,
                                       None if floors is None else floors.reshape(-1))

    def prefill(self, row: int, token_ids: list[int], chunk: int = 512) -> torch.Tensor | None:
        """Put a prompt into one row's cache; returns the hidden state at its last token [1, 1, hidden]."""
        return self.prefill_rows([row], [token_ids], chunk)

    def prefill_rows(self, rows: list[int], token_ids: list[list[int]], chunk: int = 512) -> torch.Tensor | None:
        """Prompts of several rows in one right-padded forward per chunk (rows joining a batch together).

        Returns the hidden state at each row's last token [B, 1, hidden] (whose logits give the first output
        token), or None when some row had no tokens. Padding is written past a row's length, where it is
        masked and later overwritten.
        """
        last_hidden: list[torch.Tensor | None] = [None] * len(rows)
        for start in range(0, max((len(t) for t in token_ids), default=0), chunk):
            pieces = [(i, ids[start:start + chunk]) for i, ids in enumerate(token_ids) if len(ids) > start]
            width = max(len(piece) for _, piece in pieces)
            batch = host_to_device([piece + [0] * (width - len(piece)) for _, piece in pieces], self.device, torch.long)
            hidden = self.forward([rows[i] for i, _ in pieces], batch, num_new=[len(piece) for _, piece in pieces])
            for j, (i, piece) in enumerate(pieces):
                if start + len(piece) == len(token_ids[i]):
                    last_hidden[i] = hidden[j, len(piece) - 1]
        if any(h is None for h in last_hidden):
            return None
        return torch.stack(last_hidden)[:, None]

    def cost_flops_per_token(self) -> dict:
        """Multiply-adds per decoded token, split into layers and output head (for reporting head savings)."""
        c = self.cfg
        attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
        mlp = 3 * c.hidden_size * c.intermediate_size
        return {"layers": c.num_hidden_layers * (attn + mlp), "head": c.hidden_size * self.head_rows}
