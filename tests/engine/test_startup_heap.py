"""The startup heap: an LLM, once built, leaves what loading made out of the collector's walks, and still frees all
of it when dropped."""
from __future__ import annotations

import gc
import weakref

import pytest

from anydraft.config import SamplingParams
from anydraft.heap import freeze_startup_heap
from anydraft.llm import LLM

from hidden_state_models import make_eagle3_draft


def test_loading_leaves_nothing_for_the_collector_to_walk(ckpts):
    """The tokenizer's parsed tokenizer.json (150k merge pairs on a real vocabulary) and the model are frozen: a full
    collection during decoding no longer walks them. Negative control: an object made after loading is tracked."""
    llm = LLM(str(ckpts.gpt2_target), {"model": str(ckpts.gpt2_shuffled_draft), "num_speculative_tokens": 3},
              dtype="float32", max_num_seqs=2)
    tracked = {id(o) for o in gc.get_objects()}
    assert id(llm.tokenizer._json) not in tracked and id(llm.engine) not in tracked
    assert id(llm.engine.proposer) not in tracked
    made_after = {"made": ["after loading"]}
    assert id(made_after) in {id(o) for o in gc.get_objects()}


PAIRS = [   # (target, draft, speculative options): each proposer kind, adaptive on and off
    ("gpt2_target", "gpt2_shuffled_draft", {"num_speculative_tokens": 3}),
    ("qwen3_target", "llama2_draft", {"num_speculative_tokens": 3, "adaptive": False}),
    ("qwen3_target", "llama2_draft", {"num_speculative_tokens": 3, "vocab_mode": "slem"}),
    ("qwen3_target", "eagle3", {"num_speculative_tokens": 3}),
]


@pytest.mark.parametrize("target, draft, options", PAIRS, ids=["tli", "tli_cross_family", "slem", "eagle3"])
def test_a_dropped_llm_is_freed_without_the_collector(ckpts, tmp_path, target, draft, options):
    """Frozen objects are freed by reference counting only: an LLM whose weights hung on a reference cycle would
    then never be freed. With the collector off, dropping the LLM frees its engine, draft and target weights."""
    target_dir = getattr(ckpts, target)
    draft_dir = (make_eagle3_draft(target_dir, tmp_path / "eagle3", None, seed=3) if draft == "eagle3"
                 else getattr(ckpts, draft))
    llm = LLM(str(target_dir), {"model": str(draft_dir), **options}, dtype="float32", max_num_seqs=2)
    llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=6))
    parts = [llm, llm.engine, llm.engine.target, llm.proposer, llm.tokenizer,
             next(llm.engine.target.model.parameters())]
    refs = [weakref.ref(p) for p in parts]
    gc.disable()
    try:
        del llm, parts
        assert [r() is None for r in refs] == [True] * len(refs)
        # Negative control: a frozen object on a cycle outlives its last reference (what the check above catches).
        cycle = Node()
        cycle.me = cycle
        ref = weakref.ref(cycle)
        freeze_startup_heap()
        del cycle
        gc.collect()
        assert ref() is not None
    finally:
        gc.unfreeze()   # the rest of the test process collects as usual (the cycle above included)
        gc.enable()


class Node:
    pass
