"""Building a hidden-state proposer (EAGLE-3, DSpark) from a speculators checkpoint, wired to the target."""
from __future__ import annotations

from pathlib import Path


from ..config import SpeculativeConfig, parse_dtype, resolve_device
from ..model.packed_linear import can_pack, pack_linears
from ..model.runner import ModelRunner
from ..model.speculators_config import SpeculatorsFormatError
from ..model.speculators_loader import load_speculators_draft
from ..tokenizer import Tokenizer
from .eagle3_proposer import Eagle3Proposer
from .reduced_vocab import ReducedVocab


def build_hidden_state_proposer(spec: SpeculativeConfig, path: Path, target: ModelRunner, target_tokenizer: Tokenizer,
                                max_batch: int, max_model_len: int):
    """Returns (proposer, info); the target runner captures the hidden states the proposer reads from then on (the
    engine hands them over with each proposal)."""
    dtype = parse_dtype(spec.dtype) if spec.dtype else target.dtype
    device = resolve_device(spec.device) if spec.device else target.device
    if device.type != target.device.type:
        raise ValueError(f"a hidden-state draft reads the target's hidden states: put it on the target's device "
                         f"({target.device}), not {device}")
    draft = load_speculators_draft(path, target.model, target.model.lm_head.weight, dtype, device)
    cfg = draft.config
    reduced = draft.head_to_target is not None
    allowed = ("auto", "d2t") if reduced else ("auto", "identity")
    if spec.vocab_mode not in allowed:
        raise ValueError(f"{path} is a speculators {cfg.kind} draft with a {'reduced' if reduced else 'full'} "
                         f"vocabulary: vocab_mode must be one of {allowed}, not {spec.vocab_mode!r}")
    if spec.draft_vocab_size is not None:
        raise SpeculatorsFormatError(f"{path}: a speculators draft fixes its own head (draft_vocab_size "
                                     f"{cfg.draft_vocab_size}); leave draft_vocab_size unset")
    draft.module.fuse_projections()
    if can_pack(device, dtype):
        pack_linears(draft.module)
    vocab = ReducedVocab(draft.head_to_target, target.vocab_rows, target.num_token_rows, max_batch, device, dtype)
    k = spec.num_speculative_tokens
    max_len = max_model_len + k + 1
    if cfg.kind == "eagle3":
        proposer = Eagle3Proposer(draft.module, vocab, k, max_batch, max_len)
    else:
        from .dspark_proposer import DSparkProposer
        proposer = DSparkProposer(draft.module, vocab, k, max_batch, max_len, cfg)
    target.capture_hidden_states(cfg.aux_layer_ids)
    info = {"vocab_mode": cfg.kind, "draft_path": str(path), "draft_vocab_size": cfg.draft_vocab_size,
            "draft_vocab": "d2t" if reduced else "full (no table)", "aux_layer_ids": cfg.aux_layer_ids,
            "shared_with_target": draft.shared_with_target, "draft_head_rows": cfg.draft_vocab_size}
    if cfg.kind == "dspark":
        info["block_layout"] = "anchor-first" if cfg.sample_from_anchor else "1+N (bonus anchor)"
        info["block_size"] = cfg.block_size
        info["num_speculative_tokens"] = proposer.num_speculative_tokens   # capped at what one block drafts
    return proposer, info
