"""A decode step's host work does not grow by Python calls per row: a steady-state step (no row joins, ends, meets
EOS or stops on a string) makes as many calls at batch 8 as at batch 2, for the target alone, adaptive speculation's
plain step and drafting steps (same vocabulary; TLI outside the re-tokenization of rows whose text needs it).
Counted with sys.setprofile: Python functions and C functions called from Python (a per-row loop of list and
attribute operations counts none; a call per row counts B)."""
from __future__ import annotations

import sys

import pytest

from anydraft.config import SamplingParams
from anydraft.spec_decode.policy import StepPlan


# A row whose new text the draft must re-tokenize (bytes pending, a token outside the draft's vocabulary) costs calls
# of its own: inherent to the row's text, and rare on real text; the steady cost around them is what is counted.
RETOKENIZE = "_resync_row"


def calls_per_step(llm, prompts: list[str], rows: int, retokenized: list[int] | None = None) -> list[int]:
    """Calls in each of three steady-state decode steps over `rows` requests, not counting those made inside a row's
    re-tokenization (one entry per such row is appended to `retokenized`)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    requests = [engine.add_request(prompt, params) for prompt in (prompts * 2)[:rows]]
    while any(r.row not in engine.scheduler.decoding for r in requests):   # prompts in, first tokens out
        engine.step()
    engine.step()
    counts = []
    for _ in range(3):
        calls, inside = [0], [0]

        def count(frame, event, arg):
            if event == "call" and frame.f_code.co_name == RETOKENIZE:
                inside[0] += 1
                if retokenized is not None:
                    retokenized.append(1)
            elif event == "return" and frame.f_code.co_name == RETOKENIZE:
                inside[0] -= 1
            elif event in ("call", "c_call") and not inside[0]:
                calls[0] += 1
        sys.setprofile(count)
        try:
            engine.step()
        finally:
            sys.setprofile(None)
        counts.append(calls[0])
    assert not any(r.finished for r in requests)   # the steps counted were steady-state ones
    for request in requests:
        engine.abort(request)
    return counts


@pytest.mark.parametrize("speculation", ["target alone", "adaptive, plain step", "same vocabulary, k = 3",
                                         "TLI, k = 3"])
def test_a_steady_decode_step_makes_as_many_calls_at_batch_8_as_at_2(ckpts, llms, prompts, monkeypatch, speculation):
    draft = {"target alone": None, "TLI, k = 3": ckpts.llama2_draft}.get(speculation, ckpts.qwen3_draft)
    adaptive = speculation == "adaptive, plain step"
    llm = llms.get(ckpts.qwen3_target, draft, k=3, max_num_seqs=8, **({"adaptive": True} if adaptive else {}))
    if adaptive:   # every step plain (the policy's pricing is its own, whatever the batch)
        monkeypatch.setattr(llm.engine.policy, "plan", lambda batch: StepPlan(0))
    retokenized: list[int] = []
    at_2, at_8 = calls_per_step(llm, prompts, 2, retokenized), calls_per_step(llm, prompts, 8, retokenized)
    assert at_2 == at_8, (at_2, at_8)
    assert min(at_2) > 20   # the profile saw the step (a broken hook would count nothing at both sizes)
    if speculation == "TLI, k = 3":   # some rows re-synced by appending only (else that path went untested here)
        assert len(retokenized) < 3 * (2 + 8), len(retokenized)
