"""The six shipped checkpoints (models/, trained by train/train.py) are standard HF checkpoints:
transformers loads them as-is and computes the same logits as anydraft's module."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from anydraft.model.loader import load_model

MODELS = Path(__file__).resolve().parents[2] / "models"
SHIPPED = {
    # name: (architecture, vocab rows, tokenizer size, eos token)
    "qwen3-target": ("Qwen3ForCausalLM", 151936, 151669, "<|im_end|>"),
    "qwen3-draft": ("Qwen3ForCausalLM", 151936, 151669, "<|im_end|>"),
    "smollm2-target": ("LlamaForCausalLM", 49152, 49152, "<|endoftext|>"),
    "smollm2-draft": ("LlamaForCausalLM", 49152, 49152, "<|endoftext|>"),
    "mistral-target": ("MistralForCausalLM", 32000, 32000, "</s>"),
    "mistral-draft": ("MistralForCausalLM", 32000, 32000, "</s>"),
}
TEXT = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = <<48/2=24>>24 "
        "clips in May.\n#### 72")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_checkpoint_files_and_config(name):
    arch, rows, n_tok, eos = SHIPPED[name]
    path = MODELS / name
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "SOURCE.txt"):
        assert (path / f).is_file(), f"{path / f} missing"
    assert list(path.glob("LICENSE*")), f"{path}: tokenizer LICENSE file missing"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [arch]
    assert cfg["vocab_size"] == rows
    assert cfg["tie_word_embeddings"] is True
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.get_vocab_size() == n_tok
    assert cfg["eos_token_id"] == tok.token_to_id(eos)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_transformers_logits_match_anydraft(name):
    import transformers
    from tokenizers import Tokenizer
    arch, rows, n_tok, _ = SHIPPED[name]
    path = MODELS / name
    ids = torch.tensor([Tokenizer.from_file(str(path / "tokenizer.json")).encode(TEXT).ids])
    ours, _ = load_model(path, torch.float32, torch.device("cpu"))
    assert ours.model.embed_tokens.weight.shape[0] == rows
    # rows never seen in training (and the padding rows) are exactly zero: logit 0, compresses to nothing
    assert not ours.model.embed_tokens.weight[n_tok:].any()
    with torch.no_grad():
        logits = ours.logits(ours(ids))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert type(hf).__name__ == arch
    with torch.no_grad():
        ref = hf(ids).logits
    assert ref.shape == (1, ids.shape[1], rows)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["mistral-target", "mistral-draft"])
def test_sentencepiece_models_read_bos_and_spell_text_as_bytes(name):
    """The mistral models were trained on `<s>` + text (their tokenizer's own encoding): anydraft's tokenizer
    must add that BOS, and spell `▁` pieces as spaces and `<0xNN>` pieces (the newline) as their byte."""
    from anydraft.tokenizer import Tokenizer
    path = MODELS / name
    tok = Tokenizer.from_dir(path)
    cfg = json.loads((path / "config.json").read_text())
    ids = tok.encode(TEXT)
    assert ids[0] == tok.bos_token_id == cfg["bos_token_id"] == 1
    assert tok.eos_token_ids == [cfg["eos_token_id"]] == [2]
    assert tok.token_bytes(ids[1]) == b" Question"   # the dummy-prefix space of the first piece
    assert b"".join(tok.token_bytes(i) for i in ids[1:]) == b" " + TEXT.encode()
    assert tok.decode(ids) == TEXT
