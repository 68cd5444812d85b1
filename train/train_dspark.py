"""Train a DSpark drafter for a target checkpoint on GSM8K, on CPU, and write it in the speculators format.

    python train/train_dspark.py --target models/qwen3-target --out models/qwen3-dspark --draft-vocab-size 8192 \
        --target-answers runs/qwen3-answers-1024.jsonl --layout anchor-first

Design (speculators' DFlash/DSpark recipe, at toy scale)
- Per sequence, random anchors p; each anchor's block is [x_p, mask, ...] at positions p..p+block-1. The block
  attends to the fused target states of positions < p (keys/values only) and to itself, bidirectionally.
- anchor-first (sample_from_anchor): slot i learns the target's distribution at position p+i (it predicts
  x_{p+i+1}); 1+N: slot 0 is the anchor (no loss), slot i >= 1 learns position p+i-1.
- Markov bias: markov_w2(markov_w1[previous token]) with the ground-truth previous token (teacher forcing).
  markov_w1 starts at zero, so rows of tokens the data never shows stay exactly zero (they compress away).
- Loss weight exp(-i / 4) for slot i (speculators' fixed-exp-decay, gamma 4).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "train"))

from anydraft.model.config import ModelConfig  # noqa: E402
from anydraft.model.dspark import DSparkDraft  # noqa: E402
from anydraft.model.eagle3 import rope_tables  # noqa: E402
from anydraft.model.kv_cache import CacheWindow  # noqa: E402
from anydraft.model.loader import load_model  # noqa: E402
from anydraft.checkpoints.speculators_writer import write_speculators_checkpoint  # noqa: E402
from anydraft.tokenizer import Tokenizer  # noqa: E402
from anydraft.vocab.d2t import build_d2t_from_ids  # noqa: E402
from train_eagle3 import aux_layer_ids, batches, load_texts  # noqa: E402

GAMMA = 4.0


class BlockCache:
    """Context keys/values (write_context), then each block's own appended: what DSparkAttention reads."""

    def __init__(self):
        self.k, self.v = {}, {}

    def write_and_read(self, layer, win, k_new, v_new):
        if layer not in self.k:
            self.k[layer], self.v[layer] = k_new, v_new
            return k_new, v_new
        return torch.cat([self.k[layer], k_new], dim=1), torch.cat([self.v[layer], v_new], dim=1)


def _anchors(length: int, num: int, rng: random.Random) -> list[int]:
    """num anchor positions in [1, length - 2] (sorted; repeated when the sequence is short)."""
    choices = list(range(1, max(2, length - 1)))
    picked = rng.sample(choices, min(num, len(choices)))
    return sorted(picked + [picked[0]] * (num - len(picked)))


def dspark_loss(draft: DSparkDraft, target, input_ids, loss_mask, aux_ids, head_target_ids, num_anchors: int,
                anchor_first: bool, mask_token_id: int, rng: random.Random):
    with torch.no_grad():
        final, states = target(input_ids, capture_layers=aux_ids)
        head = target.lm_head.weight if head_target_ids is None else target.lm_head.weight[head_target_ids]
        target_probs = F.linear(final, head).float().softmax(-1)                 # [B, T, N]
    batch, seq_len = input_ids.shape
    block = draft.block_size
    lengths = loss_mask.sum(1).tolist()
    anchors = torch.tensor([_anchors(n, num_anchors, rng) for n in lengths])            # [B, A]
    offsets = torch.arange(block)
    slot_pos = anchors[:, :, None] + offsets                                       # [B, A, block] positions
    ids = torch.full((batch, num_anchors, block), mask_token_id)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    context = draft.fuse_target_states(states)                                     # [B, T, H]
    positions = torch.arange(seq_len)[None].expand(batch, -1)
    cache = BlockCache()
    ctx_win = CacheWindow(positions=positions, mask=None, num_keys=seq_len)
    draft.write_context(context, cache, ctx_win)
    # mask [B, 1, A*block, T + A*block]: context before the anchor, and the query's own block
    key_ctx = torch.arange(seq_len)[None, None, None, :] < anchors[:, :, None, None]             # [B, A, 1, T]
    key_ctx = key_ctx.expand(batch, num_anchors, block, seq_len).reshape(batch, num_anchors * block, seq_len)
    own = torch.arange(num_anchors).repeat_interleave(block)
    key_blk = (own[:, None] == own[None, :])[None].expand(batch, -1, -1)
    visible = torch.cat([key_ctx, key_blk], dim=-1)
    mask = torch.zeros(visible.shape, dtype=context.dtype).masked_fill_(~visible, float("-inf"))[:, None]
    win = CacheWindow(positions=slot_pos.reshape(batch, -1), mask=mask, num_keys=visible.shape[-1])
    hidden = draft(ids.reshape(batch, -1), cache, win)                                # [B, A*block, H]
    logits = draft.logits(hidden).view(batch, num_anchors, block, -1).float()
    # slot i: anchor-first learns position p+i with previous token x_{p+i}; 1+N learns p+i-1 with x_{p+i-1}
    shift = 0 if anchor_first else 1
    learn_pos = (slot_pos - shift).clamp(0, seq_len - 1)
    prev_ids = input_ids.gather(1, learn_pos.reshape(batch, -1)).view(batch, num_anchors, block)
    if draft.markov_head is not None:
        logits = logits + draft.markov_head(prev_ids).float()
    goal = target_probs.gather(1, learn_pos.reshape(batch, -1, 1).expand(-1, -1, target_probs.shape[-1]))
    goal = goal.view(batch, num_anchors, block, -1)
    lengths_t = torch.tensor(lengths)[:, None, None]
    valid = (learn_pos + 1 < lengths_t) & (offsets >= shift)[None, None]
    weight = valid.float() * torch.exp(-(offsets - shift).clamp_min(0) / GAMMA)[None, None]
    per_slot = -(goal * logits.log_softmax(-1)).sum(-1)                                # [B, A, block]
    loss = (per_slot * weight).sum() / weight.sum().clamp_min(1)
    agree = (logits.argmax(-1) == goal.argmax(-1)).float() * valid
    accuracy = (agree.sum((0, 1)) / valid.float().sum((0, 1)).clamp_min(1)).tolist()
    return loss, accuracy[shift:]


def train_dspark(target_path: Path, out: Path, draft_vocab_size: int | None, steps: int, tokens_per_batch: int,
                 lr: float, anchor_first: bool = True, block_size: int = 4, markov_rank: int = 32,
                 num_anchors: int = 24, answers_file: Path | None = None, limit: int | None = None,
                 sequences: list[list[int]] | None = None, seed: int = 0, log_every: int = 10,
                 autocast: bool = False) -> dict:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    target, _ = load_model(target_path, torch.float32, torch.device("cpu"))
    cfg = target.cfg
    tokenizer = Tokenizer.from_dir(target_path)
    sequences = load_texts(tokenizer, tokenizer.eos_token_ids[0], answers_file, limit) if sequences is None else sequences
    aux = aux_layer_ids(cfg.num_hidden_layers)
    head_target_ids = d2t = t2d = None
    if draft_vocab_size is not None:
        d2t, t2d = build_d2t_from_ids([t for s in sequences for t in s], draft_vocab_size, cfg.vocab_size,
                                      always_include=tokenizer.eos_token_ids)
        head_target_ids = torch.arange(draft_vocab_size) + d2t
    # A token the text never uses marks the masked slots (speculators asks for one: --mask-token-id).
    used = set(t for s in sequences for t in s)
    mask_token_id = next(t for t in range(tokenizer.vocab_size - 1, 0, -1) if t not in used)
    layer_cfg = ModelConfig(**{**cfg.__dict__, "architecture": "Qwen3ForCausalLM", "qk_norm": True,
                               "num_hidden_layers": 1, "tie_word_embeddings": False})
    head_rows = cfg.vocab_size if head_target_ids is None else draft_vocab_size
    draft = DSparkDraft(layer_cfg, len(aux), cfg.hidden_size, head_rows, block_size, markov_rank, cfg.vocab_size)
    draft.embed_tokens.weight = torch.nn.Parameter(target.model.embed_tokens.weight.detach(), requires_grad=False)
    head = target.lm_head.weight.detach()
    draft.lm_head.weight = torch.nn.Parameter(head if head_target_ids is None else head[head_target_ids].clone(),
                                              requires_grad=head_target_ids is not None)
    if draft.markov_head is not None:
        torch.nn.init.zeros_(draft.markov_head.markov_w1.weight)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    data = batches(sequences, tokens_per_batch, 256, random.Random(seed))
    start, history = time.time(), []
    for i in range(steps):
        ids, mask = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, accuracy = dspark_loss(draft, target, ids, mask, aux, head_target_ids, num_anchors, anchor_first,
                                         mask_token_id, rng)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        history.append(accuracy)
        if log_every and (i % log_every == 0 or i == steps - 1):
            recent = torch.tensor(history[-log_every:]).mean(0).tolist()
            print(f"step {i} loss {loss.item():.3f} accuracy by slot {[round(a, 3) for a in recent]} "
                  f"{time.time() - start:.0f}s", flush=True)
    state = {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"}
    if head_target_ids is None:
        del state["lm_head.weight"]
    else:
        state["d2t"], state["t2d"] = d2t, t2d
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()}
    num_drafts = block_size if anchor_first else block_size - 1
    write_speculators_checkpoint(out, "dspark", layer_cfg, head_rows, aux, num_drafts, str(target_path),
                                 [cfg.architecture], state,
                                 extra={"block_size": block_size, "mask_token_id": mask_token_id,
                                        "sample_from_anchor": anchor_first, "markov_rank": markov_rank,
                                        "markov_head_type": "vanilla", "enable_confidence_head": False,
                                        "confidence_head_with_markov": False, "sliding_window_non_causal": False})
    return {"steps": steps, "seconds": round(time.time() - start, 1), "sequences": len(sequences),
            "final_accuracy_by_slot": torch.tensor(history[-50:]).mean(0).tolist()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--draft-vocab-size", type=int, default=None)
    parser.add_argument("--layout", choices=["anchor-first", "1+N"], default="anchor-first")
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--markov-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--tokens-per-batch", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--target-answers", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = train_dspark(args.target, args.out, args.draft_vocab_size, args.steps, args.tokens_per_batch, args.lr,
                           args.layout == "anchor-first", args.block_size, args.markov_rank,
                           answers_file=args.target_answers, limit=args.limit, seed=args.seed, autocast=args.bf16)
    (args.out / "training.json").write_text(json.dumps({**summary, "command": " ".join(sys.argv)}, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
