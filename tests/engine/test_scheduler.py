"""The scheduler under a small token budget: a long prompt goes into the cache in chunks over several steps
while a running request keeps decoding every step, and both outputs stay the target alone's (float64)."""
from __future__ import annotations

import pytest

from anydraft.config import SamplingParams
from anydraft.llm import LLM

from reference_model import reference_greedy
from tiny_models import gsm8k_questions


def test_long_prompt_is_chunked_while_a_running_request_keeps_decoding(ckpts, monkeypatch):
    k, budget = 3, 24
    llm = LLM(model=str(ckpts.gpt2_target), dtype="float64", device="cpu", max_num_seqs=2, max_model_len=256,
              max_num_batched_tokens=budget,
              speculative_config={"model": str(ckpts.gpt2_shuffled_noisy_draft), "num_speculative_tokens": k})
    engine = llm.engine
    forwards = []   # target tokens per row of each target forward
    real_forward = engine.target.forward

    def forward(rows, input_ids, num_new=None):
        forwards.append(num_new if num_new is not None else [input_ids.shape[1]] * len(rows))
        return real_forward(rows, input_ids, num_new)

    monkeypatch.setattr(engine.target, "forward", forward)
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    short = engine.add_request("Tom has", greedy)
    engine.step()                                     # the short prompt's prefill: its first token
    long_prompt = " ".join(gsm8k_questions(3, start=5))
    long = engine.add_request(long_prompt, greedy)
    assert len(long.prompt_target_ids) > 3 * budget
    steps_while_prefilling, outputs_while_prefilling = 0, []
    forwards.clear()
    while long.num_prefilled < len(long.prompt_target_ids):
        before = len(short.output_target_ids)
        engine.step()
        steps_while_prefilling += 1
        outputs_while_prefilling.append(len(short.output_target_ids) - before)
        # The step's target tokens stay within the budget: k+1 for the decoding row, the rest prompt.
        assert sum(sum(f) for f in forwards) <= budget
        forwards.clear()
    assert steps_while_prefilling >= 3
    assert not short.finished and all(n >= 1 for n in outputs_while_prefilling)
    engine.run()
    assert short.output_target_ids == reference_greedy(ckpts.gpt2_target, "Tom has", 60)
    assert long.output_target_ids == reference_greedy(ckpts.gpt2_target, long_prompt, 60)
    assert not engine.has_unfinished() and sorted(engine.free_rows) == [0, 1]


def test_budget_too_small_for_the_decoding_rows_is_refused(ckpts):
    with pytest.raises(ValueError, match="max_num_batched_tokens 8 leaves no room"):
        LLM(model=str(ckpts.gpt2_target), dtype="float64", device="cpu", max_num_seqs=2, max_model_len=64,
            max_num_batched_tokens=8,
            speculative_config={"model": str(ckpts.gpt2_shuffled_noisy_draft), "num_speculative_tokens": 3})
