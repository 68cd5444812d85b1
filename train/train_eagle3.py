"""Train an EAGLE-3 drafter for a target checkpoint on GSM8K, on CPU, and write it in the speculators format.

    python train/train_eagle3.py --target models/qwen3-target --out models/qwen3-eagle3 --draft-vocab-size 8192
    python train/train_eagle3.py --target models/qwen3-target --out models/qwen3-eagle3-full     # full vocabulary

Design (speculators' recipe, at toy scale)
- The target is frozen. Its residual stream at the aux layers (speculators' default ids 2, L/2, L-3) is
  computed on the fly for each batch; entry j of the draft pairs token x_j with the states of x_{j-1}.
- Training-time test (TTT): step 0 reads the fused target states; step s > 0 reads the draft's own output of
  step s-1 at the same entry and the ground-truth token x_{j+s}, at position +s, attending to the real prefix
  (step 0's keys up to j) and to its own chain (the keys of steps 1..s at j): what inference does.
- Loss: cross-entropy of the draft against the target's distribution over the draft vocabulary (softmax of
  the target logits at the head's rows) at the position each step predicts; summed over steps.
- Reduced vocabulary: the draft_vocab_size target tokens most used by the training text (EOS kept), d2t /
  t2d as speculators builds them; the head starts from the target's rows. Full vocabulary: the head is the
  target's own (left out of the checkpoint, frozen); the embedding is always the target's (left out, frozen).
- Data: "Question: q\\nAnswer: a<eos>" for GSM8K train, plus the target's own greedy answers when a file of
  them is given (--target-answers, a .jsonl with question/answer), which is the text the draft sees at inference.
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

from anydraft.model.config import ModelConfig  # noqa: E402
from anydraft.model.eagle3 import Eagle3Draft  # noqa: E402
from anydraft.model.kv_cache import CacheWindow  # noqa: E402
from anydraft.model.loader import load_model  # noqa: E402
from anydraft.checkpoints.speculators_writer import write_speculators_checkpoint  # noqa: E402
from anydraft.tokenizer import Tokenizer  # noqa: E402
from anydraft.vocab.d2t import build_d2t_from_ids  # noqa: E402

DATA = Path("/work/shared/data/gsm8k")


class ChainCache:
    """What Attention.forward reads in TTT: keys of all steps so far, side by side [B, S * (s+1), H_kv, D]."""

    def __init__(self):
        self.k, self.v = {}, {}

    def write_and_read(self, layer, win, k_new, v_new):
        self.k[layer] = k_new if layer not in self.k else torch.cat([self.k[layer], k_new], dim=1)
        self.v[layer] = v_new if layer not in self.v else torch.cat([self.v[layer], v_new], dim=1)
        return self.k[layer], self.v[layer]


def chain_window(seq_len: int, step: int, dtype, device) -> CacheWindow:
    """Step `step`'s queries [S] see step 0's keys up to their entry and, for steps 1..step, their own entry."""
    idx = torch.arange(seq_len, device=device)
    blocks = [idx[None, :] <= idx[:, None]] + [idx[None, :] == idx[:, None]] * step
    visible = torch.cat(blocks, dim=1)                                         # [S, S * (step+1)]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))
    positions = (idx + step)[None]                                              # [1, S]
    return CacheWindow(positions=positions, mask=mask[None, None], num_keys=visible.shape[1])


def aux_layer_ids(num_layers: int) -> list[int]:
    """speculators' default (2, L/2, L-3), or for targets too shallow for it: embeddings, middle, last."""
    return [2, num_layers // 2, num_layers - 3] if num_layers >= 5 else [0, num_layers // 2, num_layers]


def ttt_loss(draft: Eagle3Draft, target, input_ids: torch.Tensor, loss_mask: torch.Tensor, aux_ids: list[int],
             head_target_ids: torch.Tensor | None, ttt_steps: int) -> tuple[torch.Tensor, list[float]]:
    """input_ids [B, T] target ids (right-padded), loss_mask [B, T] (1 where the token is real text to predict).
    Returns (loss, per-step accuracy of the draft's argmax against the target's)."""
    with torch.no_grad():
        final, states = target(input_ids, capture_layers=aux_ids)          # [B, T, H], [B, T, n*H]
        head = target.lm_head.weight if head_target_ids is None else target.lm_head.weight[head_target_ids]
        target_probs = F.linear(final, head).float().softmax(-1)               # [B, T, N]
    ids = input_ids[:, 1:]                                                   # entry j: x_j (j >= 1)
    hidden = draft.fuse_target_states(states[:, :-1])                        # ... with the states of x_{j-1}
    seq_len = ids.shape[1]
    cache = ChainCache()
    loss, accuracy = 0.0, []
    for step in range(ttt_steps):
        win = chain_window(seq_len, step, hidden.dtype, hidden.device)
        step_ids = ids if step == 0 else F.pad(ids[:, step:], (0, step))  # ground truth x_{j+step}
        hidden = draft(step_ids, hidden, cache, win)
        logits = draft.logits(hidden)                                        # [B, S, N]
        # entry j at step s predicts x_{j+s+1}: the target's distribution at position j+s
        n = seq_len - step
        target_p = target_probs[:, 1 + step:1 + step + n]
        mask = loss_mask[:, 2 + step:2 + step + n].float()
        n = min(n, mask.shape[1])
        log_q = logits[:, :n].float().log_softmax(-1)
        per_token = -(target_p[:, :n] * log_q).sum(-1)
        denom = mask[:, :n].sum().clamp_min(1)
        loss = loss + (per_token * mask[:, :n]).sum() / denom
        agree = (logits[:, :n].argmax(-1) == target_p[:, :n].argmax(-1)).float()
        accuracy.append(float((agree * mask[:, :n]).sum() / denom))
    return loss, accuracy


def load_texts(tokenizer: Tokenizer, eos_id: int, answers_file: Path | None, limit: int | None) -> list[list[int]]:
    rows = [json.loads(line) for line in open(DATA / "train.jsonl")]
    docs = [(r["question"], r["answer"]) for r in rows[:limit]]
    if answers_file:
        docs += [(r["question"], r["answer"]) for r in map(json.loads, open(answers_file))]
    return [tokenizer.encode(f"Question: {q}\nAnswer: {a}", add_special_tokens=False) + [eos_id] for q, a in docs]


def batches(sequences: list[list[int]], tokens_per_batch: int, max_len: int, rng: random.Random):
    """Length-bucketed batches of about tokens_per_batch tokens; (ids [B, T], loss_mask [B, T])."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    groups, group = [], []
    for i in order:
        group.append(i)
        if len(group) * min(max_len, len(sequences[i])) >= tokens_per_batch:
            groups.append(group)
            group = []
    if group:
        groups.append(group)
    while True:
        rng.shuffle(groups)
        for group in groups:
            seqs = [sequences[i][:max_len] for i in group]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            yield ids, mask


def build_draft(target_cfg: ModelConfig, target_state: dict, aux: list[int], head_target_ids, seed: int,
                layer_architecture: str = "LlamaForCausalLM") -> Eagle3Draft:
    # A Llama decoder layer, as most published EAGLE-3 drafters have (vLLM's Eagle3 draft is Llama-layered).
    qwen3 = layer_architecture == "Qwen3ForCausalLM"
    layer_cfg = ModelConfig(**{**target_cfg.__dict__, "architecture": layer_architecture, "qk_norm": qwen3,
                               "attention_bias": False, "num_hidden_layers": 1, "tie_word_embeddings": False})
    torch.manual_seed(seed)
    head_rows = target_cfg.vocab_size if head_target_ids is None else len(head_target_ids)
    draft = Eagle3Draft(layer_cfg, len(aux), target_cfg.hidden_size, head_rows)
    draft.embed_tokens.weight = torch.nn.Parameter(target_state["embed"], requires_grad=False)
    head = target_state["head"] if head_target_ids is None else target_state["head"][head_target_ids].clone()
    draft.lm_head.weight = torch.nn.Parameter(head, requires_grad=head_target_ids is not None)
    return draft


def train_eagle3(target_path: Path, out: Path, draft_vocab_size: int | None, steps: int, tokens_per_batch: int,
                 lr: float, ttt_steps: int = 3, answers_file: Path | None = None, limit: int | None = None,
                 max_len: int = 256, seed: int = 0, log_every: int = 25, autocast: bool = False,
                 sequences: list[list[int]] | None = None, layer_architecture: str = "LlamaForCausalLM") -> dict:
    torch.manual_seed(seed)
    target, _ = load_model(target_path, torch.float32, torch.device("cpu"))
    cfg = target.cfg
    tokenizer = Tokenizer.from_dir(target_path)
    eos_id = tokenizer.eos_token_ids[0]
    sequences = load_texts(tokenizer, eos_id, answers_file, limit) if sequences is None else sequences
    aux = aux_layer_ids(cfg.num_hidden_layers)
    head_target_ids, d2t, t2d = None, None, None
    if draft_vocab_size is not None:
        d2t, t2d = build_d2t_from_ids([t for s in sequences for t in s], draft_vocab_size, cfg.vocab_size,
                                      always_include=tokenizer.eos_token_ids)
        head_target_ids = torch.arange(draft_vocab_size) + d2t
    target_state = {"embed": target.model.embed_tokens.weight.detach(), "head": target.lm_head.weight.detach()}
    draft = build_draft(cfg, target_state, aux, head_target_ids, seed, layer_architecture)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    data = batches(sequences, tokens_per_batch, max_len, random.Random(seed))
    start, history = time.time(), []
    for i in range(steps):
        ids, mask = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):   # AMX matmuls; fp32 master weights
            loss, accuracy = ttt_loss(draft, target, ids, mask, aux, head_target_ids, ttt_steps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        history.append(accuracy)
        if log_every and (i % log_every == 0 or i == steps - 1):
            recent = torch.tensor(history[-log_every:]).mean(0).tolist()
            print(f"step {i} loss {loss.item():.3f} accuracy by step {[round(a, 3) for a in recent]} "
                  f"{time.time() - start:.0f}s", flush=True)
    state = {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"}
    if head_target_ids is None:
        del state["lm_head.weight"]             # the target's own head: shared at load
    else:
        state["d2t"], state["t2d"] = d2t, t2d
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()}
    write_speculators_checkpoint(out, "eagle3", draft.cfg, len(head_target_ids) if head_target_ids is not None
                                 else cfg.vocab_size, aux, ttt_steps, str(target_path),
                                 [cfg.architecture], state)
    summary = {"steps": steps, "seconds": round(time.time() - start, 1), "sequences": len(sequences),
               "final_accuracy_by_step": torch.tensor(history[-50:]).mean(0).tolist()}
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--draft-vocab-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--tokens-per-batch", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--target-answers", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N GSM8K train records")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (AMX on CPUs that have it)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = train_eagle3(args.target, args.out, args.draft_vocab_size, args.steps, args.tokens_per_batch, args.lr,
                           args.ttt_steps, args.target_answers, args.limit, seed=args.seed,
                           log_every=10, autocast=args.bf16)
    (args.out / "training.json").write_text(json.dumps({**summary, "command": " ".join(sys.argv)}, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
