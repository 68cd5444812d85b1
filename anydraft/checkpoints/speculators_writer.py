"""Writing a drafter in the speculators format (config.json + model.safetensors), as training here does."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.config import ModelConfig

SPECULATORS_VERSION = "0.9.0"   # the format version written (speculators' own field)


def layer_config_dict(cfg: ModelConfig) -> dict:
    """transformer_layer_config, every field written (no reliance on HF class defaults)."""
    d = cfg.to_hf_dict()
    d.pop("architectures", None)
    d.pop("torch_dtype", None)
    return d


def write_speculators_checkpoint(directory: Path, kind: str, layer_cfg: ModelConfig, draft_vocab_size: int,
                                 aux_layer_ids: list[int], num_speculative_tokens: int, verifier_path: str,
                                 verifier_architectures: list[str], state: dict[str, torch.Tensor],
                                 extra: dict | None = None) -> Path:
    """state: the draft's tensors by speculators name (d2t / t2d included for a reduced vocabulary; leave out
    embed_tokens / lm_head to share the verifier's)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    aux_field = "eagle_aux_hidden_state_layer_ids" if kind == "eagle3" else "aux_hidden_state_layer_ids"
    config = {
        "architectures": ["Eagle3Speculator" if kind == "eagle3" else "DSparkSpeculator"],
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_path, "architectures": verifier_architectures},
        },
        "transformer_layer_config": layer_config_dict(layer_cfg),
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": None,
        aux_field: list(aux_layer_ids),
        "torch_dtype": "bfloat16",
        **(extra or {}),
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory
