"""The vLLM proposer's settings come from ANYDRAFT_* environment variables, with messages that name them."""
from __future__ import annotations

import pytest

from anydraft.integrations.vllm.settings import DraftSettings


def test_settings_from_env(tmp_path):
    with pytest.raises(ValueError, match="ANYDRAFT_DRAFT_MODEL"):
        DraftSettings.from_env({}, 3)
    settings = DraftSettings.from_env({"ANYDRAFT_DRAFT_MODEL": "smollm2-draft", "ANYDRAFT_VOCAB_MODE": "tli",
                                       "ANYDRAFT_DRAFT_VOCAB_SIZE": "8192", "ANYDRAFT_DRAFT_VOCAB_CORPUS": "c.jsonl",
                                       "ANYDRAFT_DRAFT_SLOTS": "4"}, 3)
    assert (settings.spec.model, settings.spec.vocab_mode, settings.spec.draft_vocab_size, settings.slots) == (
        "smollm2-draft", "tli", 8192, 4)
    assert settings.spec.num_speculative_tokens == 3 and settings.target_tokenizer is None
    with pytest.raises(ValueError, match="ANYDRAFT_DRAFT_VOCAB_SIZE='many' is not an integer"):
        DraftSettings.from_env({"ANYDRAFT_DRAFT_MODEL": "d", "ANYDRAFT_DRAFT_VOCAB_SIZE": "many"}, 3)
    with pytest.raises(ValueError, match="draft_vocab_corpus.*settings come from the environment"):
        DraftSettings.from_env({"ANYDRAFT_DRAFT_MODEL": "d", "ANYDRAFT_DRAFT_VOCAB_SIZE": "8"}, 3)
    with pytest.raises(ValueError, match="vocab_mode 'eagle' is unknown"):
        DraftSettings.from_env({"ANYDRAFT_DRAFT_MODEL": "d", "ANYDRAFT_VOCAB_MODE": "eagle"}, 3)


def test_core_and_integration_import_without_vllm():
    """anydraft (and its integration package, until vLLM instantiates the proposer) never imports vLLM."""
    import subprocess
    import sys
    code = ("import sys, anydraft, anydraft.llm, anydraft.cli, anydraft.integrations.vllm; "
            "print('vllm' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
