"""The bench's unit of work at batch size B: groups of B consecutive prompts, interleaved across contenders
group by group in a rotating order; tok/s = all tokens of a round / its seconds (fake contenders, no model)."""
from __future__ import annotations

import pytest

from anydraft.bench.contenders import GroupRun, prompt_groups, run_rounds
from anydraft.bench.scoring import acceptance_on_identical_texts
from anydraft.bench.suite import BenchConfig


class FakeContender:
    """Decodes each prompt of a group into prompt_index + 1 copies of 7, the group taking a fixed time."""

    def __init__(self, name: str, seconds_per_group: float, calls: list):
        self.name, self.system, self.k = name, "fake", 2
        self.seconds, self.calls = seconds_per_group, calls

    def warm_up(self, group):
        self.calls.append(("warm", self.name, tuple(group)))

    def run(self, group):
        self.calls.append((self.name, tuple(group)))
        outputs = [[7] * (i + 1) for i in group]
        forwards = sum(map(len, outputs))   # one row step per token, one accepted draft token in each
        return GroupRun(outputs, self.seconds, target_forwards=forwards, num_accepted=forwards,
                        accepted_at_position=[forwards, 0])


def test_groups_of_two_are_interleaved_group_by_group_in_rotating_order():
    calls = []
    a, b, c = (FakeContender(name, seconds, calls) for name, seconds in (("a", 1.0), ("b", 2.0), ("c", 4.0)))
    results = run_rounds([a, b, c], num_prompts=4, repeats=2, batch_size=2)
    assert calls[:3] == [("warm", "a", (0, 1)), ("warm", "b", (0, 1)), ("warm", "c", (0, 1))]
    assert calls[3:] == [("a", (0, 1)), ("b", (0, 1)), ("c", (0, 1)),      # round 1, group 0
                         ("b", (2, 3)), ("c", (2, 3)), ("a", (2, 3)),      # round 1, group 1: rotated
                         ("b", (0, 1)), ("c", (0, 1)), ("a", (0, 1)),      # round 2 starts one further
                         ("c", (2, 3)), ("a", (2, 3)), ("b", (2, 3))]
    # a round: 1 + 2 + 3 + 4 = 10 tokens in 2 groups
    assert results["a"]["tokens_per_second_all"] == [10 / 2.0, 10 / 2.0]
    assert results["c"]["tokens_per_second_median"] == 10 / 8.0
    assert results["a"]["generated_tokens"] == 10
    # per prompt, in prompt order, across groups: what exact matches are counted on
    assert results["a"]["output_target_ids"] == [[7], [7, 7], [7, 7, 7], [7, 7, 7, 7]]
    assert results["a"]["per_group_steps"] == [[3, 3], [7, 7]]
    assert results["a"]["acceptance_length"] == 2.0 and results["a"]["acceptance_by_position"] == [1.0, 0.0]


def test_prompt_groups_and_the_batch_size_must_divide_the_prompts():
    assert prompt_groups(4, 2) == [[0, 1], [2, 3]] and prompt_groups(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="multiple of batch_size.*--num-prompts 16"):
        BenchConfig(target="t", draft="d", same_vocab_draft=None, num_prompts=15, batch_size=16)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BenchConfig(target="t", draft="d", same_vocab_draft=None, batch_size=0)


def test_acceptance_on_identical_texts_counts_whole_groups():
    """A peer reports one step count per group (one llm.generate call): only groups whose every prompt decoded
    alike enter the like-for-like AL."""
    ours = {"_outputs": [[1, 2], [3], [4, 5], [6]], "per_group_steps": [[2, 1], [2, 2]]}
    peer = {"_outputs": [[1, 2], [3], [4, 5], [9]], "per_group_steps": [[3, 0], [2, 1]]}
    assert acceptance_on_identical_texts(ours, peer, batch_size=2) == {
        "num_prompts": 2, "anydraft": (1 + 2) / 2, "peer": (0 + 3) / 3}


def test_decode_rate_leaves_out_the_prompts_forward_and_needs_every_group_to_tell_it():
    """Decode tok/s = tokens after each prompt's first / seconds after the group's first tokens, summed over a
    round's groups; a contender that cannot tell when first tokens came (a peer) gets none."""
    class Timed(FakeContender):
        def run(self, group):
            run = super().run(group)
            run.prompt_seconds = 0.25 if self.name == "timed" else None
            return run

    calls = []
    results = run_rounds([Timed("timed", 1.0, calls), Timed("peer", 1.0, calls)], num_prompts=4, repeats=1,
                         batch_size=2)
    # 10 tokens, 4 of them first tokens; 2 groups of 1.0 s, 0.25 s of each before the first tokens
    assert results["timed"]["decode_tokens_per_second_median"] == pytest.approx(6 / 1.5)
    assert results["timed"]["tokens_per_second_median"] == pytest.approx(10 / 2.0)
    assert "decode_tokens_per_second_median" not in results["peer"]
