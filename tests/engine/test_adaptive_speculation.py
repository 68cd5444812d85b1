"""Adaptive speculation in the engine: whatever k a step drafts (0..max), and whatever cap a request sets, the
output is the target alone's (float64, greedy) and the statistics count what was drafted."""
from __future__ import annotations

import random

import pytest

from anydraft.config import SamplingParams
from anydraft.spec_decode.policy import AdaptiveK, StepPlan

from reference_model import reference_greedy


def script_plans(monkeypatch, llm, choose) -> None:
    """The policy's plans come from choose(batch) -> k: a stand-in covering any choice the cost model may make."""
    monkeypatch.setattr(llm.engine.policy, "plan", lambda batch: StepPlan(choose(batch)))


PAIRS = [("tli", "qwen3_target", "llama2_draft"), ("identity_partial", "smollm2_target", "smollm2_noisy_draft")]


@pytest.fixture
def random_k(monkeypatch):
    """Every step drafts a random k in 0..max (a stand-in for the cost model's choices, covering all of them)."""
    def install(llm, seed: int = 0):
        chooser = random.Random(seed)
        choices = []

        def choose(batch) -> int:
            choices.append(chooser.randint(0, llm.engine.k))
            return choices[-1]
        script_plans(monkeypatch, llm, choose)
        return choices
    return install


@pytest.mark.parametrize("case, target, draft", PAIRS, ids=[p[0] for p in PAIRS])
def test_any_k_per_step_and_opted_out_requests_match_target_alone(ckpts, llms, prompts, random_k, case, target,
                                                                  draft):
    target_dir = getattr(ckpts, target)
    llm = llms.get(target_dir, getattr(ckpts, draft), k=4, max_num_seqs=4, adaptive=True)
    choices = random_k(llm)
    caps = [None, 0, 2, None, 1, None]   # per request: the engine's k, opted out, at most 2, ...
    max_tokens = [24, 17, 30, 24, 9, 24]
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n, num_speculative_tokens=cap)
                                     for n, cap in zip(max_tokens, caps)])
    for prompt, n, out in zip(prompts, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:40]!r}"
    assert set(choices) == set(range(5))   # every k was exercised, 0 (plain decode) included
    opted_out = outputs[1].metrics
    assert opted_out["num_drafted"] == 0 and opted_out["num_accepted"] == 0 and opted_out["acceptance_length"] == 1.0
    assert max(int(k) for k in outputs[2].metrics["k_histogram"]) <= 2
    assert sum(outputs[0].metrics["k_histogram"].values()) == outputs[0].metrics["target_forwards"]


BACKLOG_PAIRS = PAIRS + [("tli_shuffled_noisy", "gpt2_target", "gpt2_shuffled_noisy_draft")]


@pytest.mark.parametrize("case, target, draft", BACKLOG_PAIRS, ids=[p[0] for p in BACKLOG_PAIRS])
def test_text_of_plain_steps_is_read_at_the_next_draft_as_if_read_at_once(ckpts, llms, prompts, monkeypatch, case,
                                                                          target, draft):
    """Runs of plain steps (k = 0) leave their text in a backlog that the draft reads when it next drafts; requests
    leave and their rows are reused inside such runs. The draft must propose exactly what it proposes when it reads
    every step's text at once, its prompt tokenized as its row joins (same acceptances per request), and the output
    stays the target alone's."""
    target_dir = getattr(ckpts, target)
    llm = llms.get(target_dir, getattr(ckpts, draft), k=3, max_num_seqs=2, adaptive=True)
    max_tokens = [13, 40, 9, 31, 22]   # 2 rows, 5 requests: rows are freed and reused during runs of k = 0

    def run():
        steps = iter(([0] * 7 + [3, 1]) * 40)
        script_plans(monkeypatch, llm, lambda batch: next(steps))
        outputs = llm.generate(prompts[:5], [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
        return [(o.outputs[0].token_ids, o.metrics["num_accepted"], o.metrics["num_drafted"]) for o in outputs]

    deferred = run()
    proposer = llm.engine.proposer
    assert not proposer.backlog and not proposer.backlog_start   # every request left: nothing kept for them
    observe = type(proposer).observe

    def observe_at_once(self, rows, num_accepted, new_target_ids):
        observe(self, rows, num_accepted, new_target_ids)
        self.start_rows(list(self.untokenized))   # and prompts tokenized as rows join
        self._read_backlog(list(self.states))
    monkeypatch.setattr(type(proposer), "observe", observe_at_once)
    assert run() == deferred
    for prompt, n, (token_ids, _, _) in zip(prompts, max_tokens, deferred):
        assert token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:40]!r}"
    if "noisy" in draft:   # a draft close to the target: acceptances show the draft read the right text
        assert sum(accepted for _, accepted, _ in deferred) > 0


def test_adaptive_choice_is_reported_and_learns_costs_from_its_steps(ckpts, llms, prompts):
    """With the cost model choosing (no stand-in), outputs stay exact, the k histogram says what it chose, and the
    costs it priced with were measured on the run's own steps (nothing is timed at load)."""
    target_dir = ckpts.qwen3_target
    llm = llms.get(target_dir, ckpts.llama2_draft, k=4, max_num_seqs=4, adaptive=True)
    policy = llm.engine.policy = AdaptiveK(4, llm.engine.proposer.draft_forwards)   # fresh: the LLM is shared
    outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=20))
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, 20)
    costs = policy.costs[False]
    steps = llm.stats.target_forwards
    measured = sum(len(samples) for samples in costs.target.samples.values())
    assert 0 < measured <= steps and all(v > 0 for v in costs.target.estimates.values())
    assert costs.draft_first.estimates and not policy.costs[True].target.estimates   # greedy steps only
    histogram = llm.stats.k_histogram
    assert sum(histogram.values()) == steps and set(histogram) <= set(range(5))


def test_the_draft_times_its_further_forwards_apart(ckpts, llms, prompts, monkeypatch):
    """The policy is told, for every drafting step, the part of the proposal's seconds after its first draft
    forward: within the proposal's seconds, and positive where the proposal ran further forwards (k >= 2)."""
    llm = llms.get(ckpts.qwen3_target, ckpts.llama2_draft, k=4, max_num_seqs=4, adaptive=True)
    chooser, seen = random.Random(1), []
    script_plans(monkeypatch, llm, lambda batch: chooser.randint(0, 4))
    monkeypatch.setattr(llm.engine.policy, "observe", seen.append)
    llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=20))
    assert {r.k for r in seen} == set(range(5))
    for r in seen:
        if r.k:
            assert 0.0 <= r.later_draft_seconds < r.draft_seconds
        else:
            assert r.later_draft_seconds == 0.0 and r.read_tokens == 0
        if r.k >= 2:
            assert r.later_draft_seconds > 0.0
        assert all(n <= r.k for n in r.num_drafted) and len(r.num_accepted) == len(r.num_drafted) == r.batch.rows


def test_the_choice_is_told_what_prompts_the_draft_has_yet_to_read_and_what_the_rows_may_still_write(
        ckpts, llms, prompts, monkeypatch):
    """Before the first draft for a row the draft has its prompt to read; once read, nothing (the text of plain
    steps is read at the next draft, a recurring cost inside the draft forwards' times); the rows' remaining tokens
    are their max_tokens left. The time of a step that read a prompt prices reading (per token), not a draft
    forward, once a draft forward's cost is known."""
    llm = llms.get(ckpts.qwen3_target, ckpts.llama2_draft, k=3, max_num_seqs=2, adaptive=True)
    # a fresh policy (the LLM is shared with other tests): the first read precedes any draft cost
    policy = AdaptiveK(3, llm.engine.proposer.draft_forwards)
    monkeypatch.setattr(llm.engine, "policy", policy)
    told, plan = [], iter([3, 3, 0, 0, 3] + [3] * 80)

    proposer, tokenizer = llm.engine.proposer, llm.engine.tokenizer
    unread = proposer.unread_tokens

    def counted(rows):   # the running total (every live row asked) is the rows' own counts summed
        assert unread(rows) == sum(proposer.unread_prompts.get(row, 0) for row in rows)
        return unread(rows)

    def choose(batch):
        told.append((batch.rows, batch.unread_tokens, batch.remaining_tokens))
        return next(plan)
    script_plans(monkeypatch, llm, choose)
    monkeypatch.setattr(proposer, "unread_tokens", counted)
    max_tokens = [6, 30, 30]   # the third request takes the first one's row when it finishes
    llm.generate(prompts[:3], [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    prompt_tokens = [len(tokenizer.encode(p)) for p in prompts[:3]]   # counted in target tokens
    assert told[0] == (2, prompt_tokens[0] + prompt_tokens[1], (5 + 29) / 2)   # first tokens came from the prompts
    assert [(unread, remaining) for _, unread, remaining in told[1:5]] == [(0, float("inf"))] * 4   # not asked
    [joined] = [unread for _, unread, _ in told[5:] if unread]   # its prompt (its first token waits in the backlog)
    assert joined == prompt_tokens[2]
    assert [tokens for tokens, _ in policy.read.reads] == [joined]


def test_rows_that_draft_fewer_are_verified_over_their_own_drafts_only(ckpts, llms, prompts, monkeypatch):
    """An opted-out request (0 drafts) and a capped one (1) beside rows drafting 3: the verification forward reads
    1, 2 and 4 tokens of them (no compute on positions nobody drafted), and every output is the target alone's."""
    target_dir = ckpts.qwen3_target
    llm = llms.get(target_dir, ckpts.llama2_draft, k=3, max_num_seqs=3, adaptive=False)
    runner = llm.engine.target
    forward, reads = runner.forward, []

    def recording(rows, input_ids, num_new=None):
        reads.append(list(num_new) if num_new is not None else [input_ids.shape[1]] * len(rows))
        return forward(rows, input_ids, num_new)
    monkeypatch.setattr(runner, "forward", recording)
    caps = [None, 0, 1]
    outputs = llm.generate(prompts[:3], [SamplingParams(temperature=0, max_tokens=12, num_speculative_tokens=cap)
                                         for cap in caps])
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, 12)
    verifications = [r for r in reads if r == [4, 1, 2]]
    assert verifications, reads


def test_the_draft_tokenizes_a_prompt_only_when_its_row_drafts(ckpts, llms, prompts, monkeypatch):
    """Requests that join a batch adaptive decodes plain cost the draft nothing (no tokenizer call for their
    prompts); a row that drafts later tokenizes its prompt then, once."""
    target_dir = ckpts.qwen3_target
    llm = llms.get(target_dir, ckpts.llama2_draft, k=3, max_num_seqs=2, adaptive=True)
    proposer = llm.engine.proposer
    started = []
    start = proposer.vocab.sync.start
    monkeypatch.setattr(proposer.vocab.sync, "start", lambda text, ids: started.append(text) or start(text, ids))
    for plan, expected in (([0] * 200, []), ([0] * 3 + [3] * 200, prompts[:3])):
        steps = iter(plan)
        script_plans(monkeypatch, llm, lambda batch, steps=steps: next(steps))
        started.clear()
        outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=12))
        assert sorted(started) == sorted(expected)
        for prompt, out in zip(prompts, outputs):
            assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, 12)


def test_the_prompts_left_to_read_are_counted_as_rows_join_leave_and_draft(ckpts, llms, prompts):
    """unread_tokens over every live row is a running total: a row that leaves before it drafts takes its prompt out
    of it, a row that drafts takes its prompt out, and a subset of the rows counts its own. The draft tokenizes a
    prompt only when its row first drafts."""
    llm = llms.get(ckpts.qwen3_target, ckpts.llama2_draft, k=3, max_num_seqs=2, adaptive=True)
    proposer, tokenizer = llm.engine.proposer, llm.engine.tokenizer
    sizes = [len(tokenizer.encode(p)) for p in prompts[:3]]
    proposer.add_request(0, prompts[0], tokenizer.encode(prompts[0]))
    proposer.add_request(1, prompts[1], tokenizer.encode(prompts[1]))
    assert proposer.unread_tokens([0, 1]) == sizes[0] + sizes[1] and proposer.unread_tokens([1]) == sizes[1]
    proposer.remove_request(0)   # left before drafting
    assert proposer.unread_tokens([1]) == sizes[1]
    proposer.add_request(0, prompts[2], tokenizer.encode(prompts[2]))
    assert proposer.unread_tokens([0, 1]) == sizes[2] + sizes[1]
    assert not proposer.states   # nothing tokenized yet
    proposer.propose([1], None, 2)   # row 1 reads its prompt (and drafts; its verdict follows)
    assert list(proposer.states) == [1]
    state = proposer.states[1]
    assert state.draft_ids[:state.prompt_len] == proposer.vocab.sync.resync.draft_ids_for_text(prompts[1])
    proposer.observe([0, 1], [0, 0], [tokenizer.encode(" the")[:1]] * 2)
    assert proposer.unread_tokens([0, 1]) == sizes[2] and proposer.unread_tokens([1]) == 0
    for row in (0, 1):
        proposer.remove_request(row)
    assert proposer.unread_tokens([]) == 0 and proposer.unread_prompt_tokens == 0 and not proposer.untokenized
