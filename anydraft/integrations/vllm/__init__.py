"""anydraft's draft side inside vLLM, as a `custom_class` proposer:

    vllm.LLM(model=TARGET, speculative_config={"method": "custom_class", "num_speculative_tokens": 3,
                                               "model": "anydraft.integrations.vllm.AnydraftProposer"})

with the draft named by ANYDRAFT_DRAFT_MODEL (see settings.py for every variable). Importing this package
does not import vLLM: the proposer only reads the config object vLLM hands it.
"""
from .proposer import AnydraftProposer

__all__ = ["AnydraftProposer"]
