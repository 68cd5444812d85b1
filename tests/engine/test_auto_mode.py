"""vocab_mode="auto" wired into the factory: on pairs built to favour each mode it picks that mode and says why
in draft_info (what `generate --json` prints), and refuses a mode this build lacks by name."""
from __future__ import annotations

import pytest

from anydraft.config import VOCAB_MODES, SpeculativeConfig
from anydraft.llm import LLM

from tiny_models import SHARED


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """GSM8K train's first 300 lines: qwen3 <-> llama2 covers ~92% of it (SLEM), gpt2 <-> its shuffle 100% (TLI)."""
    path = tmp_path_factory.mktemp("corpus") / "gsm8k_train_300.jsonl"
    path.write_text("\n".join((SHARED / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:300]) + "\n")
    return str(path)


def _llm(target, draft, **spec) -> LLM:
    return LLM(model=str(target), speculative_config={"model": str(draft), "num_speculative_tokens": 2,
                                                      "adaptive": False, **spec},
               dtype="float64", device="cpu", max_num_seqs=1, max_model_len=64)


def test_same_vocabulary_is_identity(ckpts, llms):
    info = llms.get(ckpts.smollm2_target, ckpts.smollm2_noisy_draft).draft_info
    assert info["vocab_mode"] == "identity"
    assert info["vocab_mode_reason"].startswith("auto: ") and "same vocabulary" in info["vocab_mode_reason"]


def test_a_d2t_table_is_d2t(ckpts, llms):
    info = llms.get(ckpts.smollm2_target, ckpts.smollm2_d2t_draft).draft_info
    assert info["vocab_mode"] == "d2t" and "d2t table" in info["vocab_mode_reason"]


def test_other_vocabulary_without_a_corpus_is_tli_unmeasured(ckpts, llms):
    info = llms.get(ckpts.qwen3_target, ckpts.llama2_draft).draft_info
    assert info["vocab_mode"] == "tli" and "not measured" in info["vocab_mode_reason"]
    assert "tli_coverage" not in info


def test_full_coverage_is_tli(ckpts, corpus):
    info = _llm(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, vocab_mode_corpus=corpus).draft_info
    assert info["vocab_mode"] == "tli"
    assert info["tli_coverage"]["combined"] == 1.0 and info["tli_coverage"]["corpus"] == corpus
    assert "100.0%" in info["vocab_mode_reason"]


def test_low_coverage_is_slem(ckpts, corpus):
    """qwen3 spells much of GSM8K in tokens llama2 lacks (target side ~92%): auto picks SLEM; until a build has
    SLEM, loading says so and how to get TLI instead."""
    if "slem" in VOCAB_MODES:
        info = _llm(ckpts.qwen3_target, ckpts.llama2_draft, vocab_mode_corpus=corpus).draft_info
        assert info["vocab_mode"] == "slem" and "below 95%" in info["vocab_mode_reason"]
        # and cuts the draft's head to the power of two keeping 99% of llama2's own tokens of the corpus
        head = info["draft_vocab"]
        assert head["corpus"] == corpus and head["corpus_coverage_pct"] >= 99 and "power of two" in head["rule"]
        assert info["draft_head_rows"] == head["size"] < 32000 and head["size"] & (head["size"] - 1) == 0
        smaller = _llm(ckpts.qwen3_target, ckpts.llama2_draft, vocab_mode_corpus=corpus,
                       draft_vocab_size=head["size"] // 2, draft_vocab_corpus=corpus).draft_info
        assert smaller["draft_head_rows"] == head["size"] // 2 and smaller["draft_vocab"]["corpus_coverage_pct"] < 99
        assert "rule" not in smaller["draft_vocab"]   # an explicit draft_vocab_size overrides auto's
    else:
        with pytest.raises(ValueError, match=r"auto' chose 'slem'.*below 95%.*pass vocab_mode 'tli'"):
            _llm(ckpts.qwen3_target, ckpts.llama2_draft, vocab_mode_corpus=corpus)
    # the same pair, asked for TLI, loads and says it was asked
    info = _llm(ckpts.qwen3_target, ckpts.llama2_draft, vocab_mode="tli").draft_info
    assert info["vocab_mode"] == "tli" and info["vocab_mode_reason"] == "vocab_mode 'tli' asked"


def test_a_head_cut_corpus_does_not_change_the_mode(ckpts, corpus):
    """draft_vocab_corpus ranks TLI's head rows; it is not auto's corpus (on this pair it would have said SLEM)."""
    info = _llm(ckpts.qwen3_target, ckpts.llama2_draft, draft_vocab_size=128, draft_vocab_corpus=corpus).draft_info
    assert info["vocab_mode"] == "tli" and "not measured" in info["vocab_mode_reason"]
    assert info["draft_head_rows"] == 128


def test_vocab_mode_corpus_only_with_auto():
    with pytest.raises(ValueError, match="vocab_mode_corpus is read only by vocab_mode 'auto'"):
        SpeculativeConfig(model="x", vocab_mode="tli", vocab_mode_corpus="c.jsonl")
