"""Engine-layer fixtures: tiny random checkpoints built once per session (see tiny_models.py)."""
from __future__ import annotations

import pytest
import torch

from tiny_models import GSM8K_TEST, Checkpoints, LLMCache, gsm8k_questions

# Tiny models: one intra-op thread is faster than two (no spin-waiting), above all on a loaded machine.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def bridge_cache_dir(tmp_path_factory):
    """Bridges built by these tests go to a session directory, not ~/.cache (and stale ones are not read)."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("bridge_cache")
        patch.setenv("ANYDRAFT_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def llms() -> LLMCache:
    return LLMCache()


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    """Mixed lengths (one word, often a single token, to a full GSM8K question)."""
    questions = gsm8k_questions(6, start=10)
    return [questions[0].split()[0], " ".join(questions[1].split()[:12]), questions[2],
            " ".join(questions[3].split()[:25]), "Answer: 12 + 7 =", questions[5]]


@pytest.fixture(scope="session")
def draft_vocab_corpus(tmp_path_factory):
    """A small in-domain corpus for frequency-ranked draft heads: 300 GSM8K *train* records (.jsonl)."""
    path = tmp_path_factory.mktemp("corpus") / "train300.jsonl"
    path.write_text("\n".join(GSM8K_TEST.with_name("train.jsonl").read_text().splitlines()[:300]) + "\n")
    return path
