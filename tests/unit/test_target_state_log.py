"""TargetStateLog: the target states a hidden-state draft reads arrive with the proposal, after the ids; the log keeps
the verified positions' states, drops the rejected drafts' and those of requests that left their row."""
from __future__ import annotations

import pytest
import torch

from anydraft.model.captured_states import CapturedStates
from anydraft.spec_decode.target_states import TargetStateLog

WIDTH = 2


def forward(rows, starts, counts):
    """A forward's captured states: value = 100 * row + position, so each kept state names its row and position."""
    seq = max(counts)
    states = torch.zeros(len(rows), seq, WIDTH)
    for b, (row, start, count) in enumerate(zip(rows, starts, counts)):
        states[b, :count] = (100 * row + torch.arange(start, start + count, dtype=torch.float))[:, None]
    return CapturedStates(list(rows), states, list(counts), list(starts))


def positions(states):
    return [int(v) % 100 for v in states[:, 0]]


def identity(states):
    return states


def test_prompt_then_verified_positions_only():
    log = TargetStateLog()
    log.start(0, [5, 6, 7])                    # the ids come first, the prompt's states with the next proposal
    log.extend(0, [8])                         # the first token, from the prompt's forward
    log.receive([forward([0], [0], [3])], identity)
    ids, states = log.take(0)
    assert ids == [6, 7, 8] and positions(states) == [0, 1, 2]
    log.extend(0, [9, 10])                     # a step over [8, d1, d2]: d1 accepted (9), 10 the target's
    log.receive([forward([0], [3], [3])], identity)
    ids, states = log.take(0)
    assert ids == [9, 10] and positions(states) == [3, 4]   # position 5 (d2, rejected) dropped
    assert log.last_target_id(0) == 10


def test_prompt_over_several_forwards_before_the_request_joins():
    log = TargetStateLog()
    log.receive([forward([1], [0], [2])], identity)          # a long prompt's first chunk, one step
    log.receive([forward([1], [2], [2])], identity)          # its second, the next
    log.start(1, [1, 2, 3, 4])
    log.extend(1, [5])
    assert log.unread(1) == 4
    ids, states = log.take(1)
    assert ids == [2, 3, 4, 5] and positions(states) == [0, 1, 2, 3]


def test_states_of_a_request_that_left_its_row_are_dropped():
    log = TargetStateLog()
    log.start(0, [5, 6])
    log.extend(0, [7])
    log.receive([forward([0], [0], [2])], identity)
    log.take(0)
    # The step over [7, d1] is captured, then the request finishes and leaves; another request takes row 0 and
    # its prompt forward (from position 0) is captured before the next proposal.
    verify = forward([0], [2], [2])
    log.remove(0)
    log.start(0, [30, 31, 32])
    log.extend(0, [33])
    log.receive([verify, forward([0], [0], [3])], identity)
    ids, states = log.take(0)
    assert ids == [31, 32, 33] and positions(states) == [0, 1, 2]
    # a row whose request left and that no request took: its states are dropped
    log.remove(0)
    log.receive([forward([0], [4], [1])], identity)
    assert 0 not in log.rows


def test_missing_states_say_what_to_pass():
    log = TargetStateLog()
    log.start(0, [5, 6])
    log.extend(0, [7])
    with pytest.raises(RuntimeError, match="target_states"):
        log.take(0)
    log.receive([forward([0], [0], [2])], identity)
    with pytest.raises(RuntimeError, match="from position 5, but the log ends at 2"):
        log.receive([forward([0], [5], [1])], identity)


def test_reading_groups_keep_prompts_apart():
    log = TargetStateLog()
    for row, prompt in ((0, [1, 2]), (1, [3, 4, 5, 6])):
        log.start(row, prompt)
        log.extend(row, [9])
    log.receive([forward([0, 1], [0, 0], [2, 4])], identity)
    log.take(0)
    log.extend(0, [10])
    log.receive([forward([0], [2], [1])], identity)
    assert log.reading_groups([0, 1]) == [[1], [0]]      # row 1 reads its prompt, row 0 one verified entry
