"""Tiny speculators-format drafters (EAGLE-3, DSpark) for the tiny random targets of tiny_models.py."""
from __future__ import annotations

from pathlib import Path

import torch

from anydraft.model.config import ModelConfig
from anydraft.model.eagle3 import Eagle3Draft
from anydraft.model.speculators_writer import write_speculators_checkpoint
from anydraft.vocab.d2t import build_d2t_from_ids

from tiny_models import gsm8k_questions, read_checkpoint, tokenizer_of


def aux_layers(target_cfg: ModelConfig) -> list[int]:
    """Speculators' default pick (2, L/2, L-3) needs L >= 5; tiny targets take the embeddings, middle, last."""
    n = target_cfg.num_hidden_layers
    return [0, n // 2, n]


def frequent_d2t(target_dir: Path, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft_vocab_size target tokens most frequent in GSM8K questions (EOS kept), as speculators builds it."""
    tokenizer = tokenizer_of(Path(target_dir))
    cfg, _ = read_checkpoint(target_dir)
    corpus = [t for q in gsm8k_questions(300) for t in tokenizer.encode(q, add_special_tokens=False)]
    return build_d2t_from_ids(corpus, draft_vocab_size, cfg.vocab_size, always_include=tokenizer.eos_token_ids)


def make_eagle3_draft(target_dir: Path, directory: Path, draft_vocab_size: int | None, seed: int,
                      head_scale: float = 1.0, share_head: bool = False, state_override: dict | None = None,
                      d2t_tables: tuple | None = None) -> Path:
    """A random EAGLE-3 drafter for target_dir: hidden as the target's, one layer, embedding shared with the
    target (left out of the checkpoint). draft_vocab_size None: the full vocabulary; share_head then leaves the
    head out too (the target's). Else a reduced head over the most frequent tokens, with d2t / t2d."""
    target_cfg, target_state = read_checkpoint(target_dir)
    layer_cfg = ModelConfig(**{**target_cfg.__dict__, "num_hidden_layers": 1, "tie_word_embeddings": False})
    aux = aux_layers(target_cfg)
    torch.manual_seed(seed)
    head_rows = target_cfg.vocab_size if draft_vocab_size is None else draft_vocab_size
    module = Eagle3Draft(layer_cfg, len(aux), target_cfg.hidden_size, head_rows)
    state = {k: v for k, v in module.state_dict().items() if k != "embed_tokens.weight"}
    if layer_cfg.qk_norm:
        generator = torch.Generator().manual_seed(seed + 1)
        for name in state:
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                state[name] = 1 + 0.3 * torch.randn(state[name].shape, generator=generator)
    if draft_vocab_size is not None:
        d2t, t2d = d2t_tables or frequent_d2t(target_dir, draft_vocab_size)
        state["lm_head.weight"] = target_state["lm_head.weight"][torch.arange(draft_vocab_size) + d2t].clone()
        state["d2t"], state["t2d"] = d2t, t2d
    elif share_head:
        del state["lm_head.weight"]
    else:
        state["lm_head.weight"] = target_state["lm_head.weight"].clone()
    if "lm_head.weight" in state:
        state["lm_head.weight"] = state["lm_head.weight"] * head_scale
    state.update(state_override or {})
    return write_speculators_checkpoint(directory, "eagle3", layer_cfg, head_rows, aux, 3, str(target_dir),
                                        [target_cfg.architecture], state)
