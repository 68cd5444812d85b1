"""bench/interleave.py: LLMs taking turns step by step decode exactly what each decodes alone, and each is timed
over its own steps only."""
from __future__ import annotations

from anydraft.bench.interleave import step_interleaved
from anydraft.config import SamplingParams

from reference_model import reference_greedy


def test_turns_change_nothing_but_the_timing(ckpts, llms, prompts):
    target = ckpts.qwen3_target
    alone = llms.get(target, max_num_seqs=3)
    speculative = llms.get(target, ckpts.llama2_draft, k=3, max_num_seqs=3)
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (12, 20, 7)]
    done = step_interleaved({"alone": (alone, prompts[:3], params), "tli": (speculative, prompts[:3], params)},
                            turn=1)
    for name in ("alone", "tli"):
        tokens, seconds, outputs = done[name]
        assert outputs == [reference_greedy(target, p, n.max_tokens) for p, n in zip(prompts, params)], name
        assert tokens == 12 + 20 + 7 and seconds > 0
    assert not alone.engine.has_unfinished() and not speculative.engine.has_unfinished()
