"""EAGLE-3 drafters from speculators checkpoints: loading and validation, greedy losslessness in float64, and
the reduced-vocabulary (d2t) head: no table for a full vocabulary, a constant -inf buffer for a reduced one.

The drafters are trained briefly on the tiny targets by train/train_eagle3.py (the code that trains the shipped
ones), so they agree with the target part of the time: acceptance and rejection both run.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from anydraft.config import SamplingParams
from anydraft.llm import LLM
from anydraft.model.speculators_config import SpeculatorsFormatError

from hidden_state_models import HiddenStateCheckpoints, make_eagle3_draft
from reference_model import reference_greedy

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def drafts(ckpts) -> HiddenStateCheckpoints:
    return HiddenStateCheckpoints(ckpts)


def _greedy_run(llms, target, draft, prompts, k=3, max_num_seqs=4):
    llm = llms.get(target, draft, k=k, max_num_seqs=max_num_seqs)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return llm, outputs


@pytest.mark.parametrize("kind", ["reduced", "full", "qwen3_reduced"])
def test_eagle3_greedy_equals_target_alone(ckpts, drafts, llms, prompts, kind):
    target, draft = {"reduced": (ckpts.small_target, drafts.small_eagle3_reduced),
                     "full": (ckpts.small_target, drafts.small_eagle3_full),
                     "qwen3_reduced": (drafts.small_qwen3_target, drafts.qwen3_eagle3_reduced)}[kind]
    llm, outputs = _greedy_run(llms, target, draft, prompts)
    assert llm.draft_info["vocab_mode"] == "eagle3"
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(target, prompt, MAX_TOKENS), prompt
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    drafted = sum(o.metrics["num_drafted"] for o in outputs)
    print(f"\n[{kind}] accepted {accepted} of {drafted} drafted")
    assert 0 < accepted < drafted   # both verification outcomes ran


def test_eagle3_batch_of_one_and_k_1(ckpts, drafts, llms, prompts):
    """Rows joining alone, and k = 1 (no chained draft step), give the same tokens."""
    for k, max_num_seqs in ((1, 4), (3, 1)):
        _, outputs = _greedy_run(llms, ckpts.small_target, drafts.small_eagle3_reduced, prompts[:3], k, max_num_seqs)
        for prompt, output in zip(prompts, outputs):
            assert output.outputs[0].token_ids == reference_greedy(ckpts.small_target, prompt, MAX_TOKENS)


def test_full_vocabulary_has_no_table(ckpts, drafts, llms, prompts):
    """A head as wide as the target's vocabulary maps nothing: no d2t table, no buffer, and both the greedy
    mapping and the sampling logits pass the very tensors through (no gather, no scatter ran)."""
    llm = llms.get(ckpts.small_target, drafts.small_eagle3_full)
    vocab = llm.proposer.vocab
    assert vocab.head_to_target is None and vocab.logits_buffer is None
    assert llm.draft_info["draft_vocab"] == "full (no table)"
    assert set(llm.draft_info["shared_with_target"]) == {"embed_tokens", "lm_head"}
    head_rows = torch.tensor([[3], [7]])
    head_logits = torch.randn(2, 1, vocab.size)
    assert vocab.to_target(head_rows) is head_rows
    assert vocab.target_logits(head_logits) is head_logits
    assert vocab.head_probs(head_logits) is head_logits


def test_reduced_vocabulary_maps_through_d2t(ckpts, drafts, llms):
    llm = llms.get(ckpts.small_target, drafts.small_eagle3_reduced)
    vocab = llm.proposer.vocab
    tensors = load_file(str(drafts.small_eagle3_reduced / "model.safetensors"))
    assert torch.equal(vocab.head_to_target.cpu(), torch.arange(640) + tensors["d2t"])
    assert llm.draft_info["draft_vocab_size"] == 640 and llm.draft_info["draft_vocab"] == "d2t"
    head_logits = torch.randn(2, 1, 640, dtype=vocab.logits_buffer.dtype)
    target_logits = vocab.target_logits(head_logits)
    outside = torch.ones(vocab.target_vocab_rows, dtype=torch.bool)
    outside[vocab.head_to_target] = False
    assert torch.equal(target_logits[..., vocab.head_to_target], head_logits)
    assert torch.isneginf(target_logits[..., outside]).all()
    rows = head_logits.argmax(-1)
    assert torch.equal(vocab.greedy_target_ids(head_logits), vocab.head_to_target[rows])


# -- validation: what the format promises, with errors that name the file and field ----------------------------
def _broken_copy(source, directory, tensors=None, config=None):
    shutil.copytree(source, directory)
    if tensors:
        state = load_file(str(directory / "model.safetensors"))
        state.update(tensors(state))
        save_file(state, str(directory / "model.safetensors"))
    if config:
        raw = json.loads((directory / "config.json").read_text())
        config(raw)
        (directory / "config.json").write_text(json.dumps(raw))
    return directory


def _load(target, draft):
    return LLM(model=str(target), speculative_config={"model": str(draft), "num_speculative_tokens": 2},
               dtype="float32", device="cpu", max_num_seqs=1, max_model_len=64)


def _d2t_out_of_range(state):
    d2t = state["d2t"].clone()
    d2t[-1] = 10_000    # the last draft row would map past the 1296 target rows
    return {"d2t": d2t}


def _t2d_one_short(state):
    t2d = state["t2d"].clone()
    t2d[torch.nonzero(t2d)[0]] = False
    return {"t2d": t2d}


@pytest.mark.parametrize("name, tensors, config, expected", [
    ("d2t_range", _d2t_out_of_range, None, r"model\.safetensors: d2t\[639\]=10000 maps draft id 639 to target id"),
    ("t2d_sum", _t2d_one_short, None, r"model\.safetensors: t2d has 639 true entries, but draft_vocab_size"),
    ("hidden", None, lambda c: c.update(target_hidden_size=48), r"config\.json: target_hidden_size: the verifier's "
                                                                 r"hidden size 48 differs from the target's 32"),
    ("vocab", None, lambda c: c["transformer_layer_config"].update(vocab_size=2048),
     r"config\.json: transformer_layer_config\.vocab_size: the verifier's vocabulary has 2048 rows"),
    ("aux", None, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), r"config\.json: eagle_aux_hidden_state_layer_ids"),
    ("aux_range", None, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 9]), r"\[9\] outside \[0, 2\]"),
    ("kind", None, lambda c: c.update(speculators_model_type="medusa"), r"speculators_model_type: 'medusa' is not"),
    ("no_tables", lambda s: {k: v for k, v in s.items() if k not in ("d2t", "t2d")} | {"d2t": s["d2t"][:0]}, None,
     r"d2t has shape \(0,\), expected \[draft_vocab_size=640\]"),
])
def test_broken_checkpoint_is_refused_naming_file_and_field(ckpts, drafts, tmp_path, name, tensors, config,
                                                            expected):
    broken = _broken_copy(drafts.small_eagle3_reduced, tmp_path / name, tensors, config)
    with pytest.raises(SpeculatorsFormatError, match=expected) as error:
        _load(ckpts.small_target, broken)
    assert str(broken) in str(error.value)


def test_random_draft_loads_with_its_own_head_and_tables(ckpts, tmp_path):
    """A checkpoint that ships its head (and a full-vocabulary one that ships d2t/t2d, which speculators
    ignores) loads; the embedding stays the target's."""
    draft = make_eagle3_draft(ckpts.small_target, tmp_path / "own_head", None, seed=3)
    llm = _load(ckpts.small_target, draft)
    assert llm.draft_info["shared_with_target"] == ["embed_tokens"]
    assert llm.proposer.vocab.head_to_target is None
