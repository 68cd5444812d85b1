"""DSpark drafters from speculators checkpoints: both block layouts (anchor-first, and 1+N with the bonus token
as anchor) chosen from the config, greedy output equal to the target alone in float64, and a layout the
config does not state is refused rather than guessed."""
from __future__ import annotations

import json
import shutil

import pytest

from anydraft.config import SamplingParams
from anydraft.llm import LLM
from anydraft.model.speculators_config import SpeculatorsFormatError

from hidden_state_models import HiddenStateCheckpoints
from reference_model import reference_greedy

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def drafts(ckpts) -> HiddenStateCheckpoints:
    return HiddenStateCheckpoints(ckpts)


@pytest.mark.parametrize("layout, k", [("anchor_first", 4), ("anchor_first", 2), ("fill_in", 3)])
def test_dspark_greedy_equals_target_alone(ckpts, drafts, llms, prompts, layout, k):
    draft = drafts.small_dspark_anchor_first if layout == "anchor_first" else drafts.small_dspark_fill_in
    llm = llms.get(ckpts.small_target, draft, k=k)
    expected = "anchor-first" if layout == "anchor_first" else "1+N (bonus anchor)"
    assert llm.draft_info["vocab_mode"] == "dspark" and llm.draft_info["block_layout"] == expected
    assert llm.proposer.first_slot == (0 if layout == "anchor_first" else 1)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(ckpts.small_target, prompt, MAX_TOKENS), prompt
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    drafted = sum(o.metrics["num_drafted"] for o in outputs)
    print(f"\n[{layout} k={k}] accepted {accepted} of {drafted}")
    assert 0 < accepted < drafted


def test_fill_in_layout_full_vocabulary_has_no_table(ckpts, drafts, llms):
    llm = llms.get(ckpts.small_target, drafts.small_dspark_fill_in, k=3)
    assert llm.proposer.vocab.head_to_target is None and llm.proposer.vocab.logits_buffer is None


def test_k_is_capped_at_what_one_block_drafts(ckpts, drafts, llms, prompts):
    """The 1+N layout of block 4 drafts 3 tokens per forward: asking for 5 drafts 3 (reported), output unchanged."""
    llm = llms.get(ckpts.small_target, drafts.small_dspark_fill_in, k=5)
    assert llm.proposer.num_speculative_tokens == 3 and llm.draft_info["num_speculative_tokens"] == 3
    outputs = llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(ckpts.small_target, prompt, MAX_TOKENS)
        assert output.metrics["num_drafted"] <= 3 * output.metrics["target_forwards"]


def test_layout_must_be_stated(ckpts, drafts, tmp_path):
    broken = tmp_path / "no_layout"
    shutil.copytree(drafts.small_dspark_anchor_first, broken)
    raw = json.loads((broken / "config.json").read_text())
    del raw["sample_from_anchor"]
    (broken / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SpeculatorsFormatError, match=r"no_layout/config\.json: sample_from_anchor: missing"):
        LLM(model=str(ckpts.small_target), speculative_config={"model": str(broken), "num_speculative_tokens": 2},
            dtype="float32", device="cpu", max_num_seqs=1, max_model_len=64)


def test_adaptive_prices_a_block_as_one_draft_forward(ckpts, drafts, llms, prompts):
    """Adaptive k (the default) models a DSpark proposal as one forward whatever k it drafts; output unchanged."""
    llm = llms.get(ckpts.small_target, drafts.small_dspark_anchor_first, k=4, adaptive=True)
    speculation = llm.engine.policy
    assert [speculation.draft_forwards(k) for k in range(5)] == [0, 1, 1, 1, 1]
    outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(ckpts.small_target, prompt, MAX_TOKENS)
