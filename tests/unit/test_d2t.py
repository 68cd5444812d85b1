"""Reduced draft vocabulary tables (speculators d2t/t2d): building, validation, save/load."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anydraft.vocab.d2t import (D2TError, build_d2t, build_d2t_from_ids, count_target_tokens, load_d2t, save_d2t,
                                validate_d2t)


def test_build_picks_most_frequent_with_ties_to_lower_id():
    counts = torch.tensor([5, 0, 7, 5, 5, 1, 9, 0])  # [V_target = 8]
    d2t, t2d = build_d2t(counts, num_draft_tokens=4, target_vocab=8)
    kept = (torch.arange(4) + d2t).tolist()
    assert kept == [0, 2, 3, 6]  # 9, 7, then the 5s at ids 0 and 3 (not 4)
    assert t2d.tolist() == [True, False, True, True, False, False, True, False]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert counts.tolist() == [5, 0, 7, 5, 5, 1, 9, 0]  # input untouched


def test_build_from_corpus_ids_and_always_include():
    target_ids = [3, 3, 3, 1, 1, 4]
    assert count_target_tokens(target_ids, 6).tolist() == [0, 2, 0, 3, 1, 0]
    d2t, _ = build_d2t_from_ids(target_ids, 2, 6)
    assert (torch.arange(2) + d2t).tolist() == [1, 3]
    d2t, t2d = build_d2t_from_ids(target_ids, 2, 6, always_include=[5])  # e.g. eos, never seen in the corpus
    assert (torch.arange(2) + d2t).tolist() == [3, 5] and int(t2d.sum()) == 2
    with pytest.raises(D2TError, match="corpus target ids"):
        count_target_tokens([0, 6], 6)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=60), data=st.data())
def test_build_properties(counts, data):
    target_vocab = len(counts)
    num_draft = data.draw(st.integers(1, target_vocab))
    d2t, t2d = build_d2t(torch.tensor(counts), num_draft, target_vocab)
    validate_d2t(d2t, t2d, target_vocab)
    kept = (torch.arange(num_draft) + d2t).tolist()
    assert len(kept) == num_draft == int(t2d.sum())
    # Exactly the top-N by (count desc, id asc).
    assert sorted(kept) == sorted(sorted(range(target_vocab), key=lambda i: (-counts[i], i))[:num_draft])


def test_build_argument_errors():
    with pytest.raises(D2TError, match="expected target_vocab=5"):
        build_d2t(torch.ones(4), 2, 5)
    with pytest.raises(D2TError, match="num_draft_tokens"):
        build_d2t(torch.ones(5), 0, 5)
    with pytest.raises(D2TError, match="num_draft_tokens"):
        build_d2t(torch.ones(5), 6, 5)


def valid_tables() -> tuple[torch.Tensor, torch.Tensor]:
    return build_d2t(torch.tensor([4, 0, 3, 0, 2, 1]), 3, 6)  # keeps target ids 0, 2, 4


@pytest.mark.parametrize("corrupt,message", [
    (lambda d2t, t2d: (torch.tensor([0, 1, 9]), t2d), r"d2t\[2\]=9 maps draft id 2 to target id 11, outside \[0, 6\)"),
    (lambda d2t, t2d: (torch.tensor([0, 0, 1]), t2d), r"t2d\[1\] is False but d2t maps draft id 1 there"),
    (lambda d2t, t2d: (torch.tensor([-1, 1, 2]), t2d), r"d2t\[0\]=-1 maps draft id 0 to target id -1"),
    (lambda d2t, t2d: (torch.tensor([2, 0, 2]), t2d), r"not strictly increasing at index 1"),
    (lambda d2t, t2d: (d2t, t2d[:5]), r"t2d has length 5, expected target_vocab=6"),
    (lambda d2t, t2d: (d2t, torch.ones(6, dtype=torch.bool)), r"t2d has 6 trues but d2t has 3 entries"),
    (lambda d2t, t2d: (d2t, torch.tensor([True, True, False, False, True, False])), r"t2d\[2\] is False"),
    (lambda d2t, t2d: (torch.zeros(7, dtype=torch.long), t2d), r"d2t has length 7, expected 1\.\.6"),
    (lambda d2t, t2d: (d2t.float(), t2d), r"1-D integer tensor"),
    (lambda d2t, t2d: (d2t, t2d.long()), r"1-D bool tensor"),
])
def test_validate_names_source_and_first_bad_index(corrupt, message):
    d2t, t2d = corrupt(*valid_tables())
    with pytest.raises(D2TError, match=message) as raised:
        validate_d2t(d2t, t2d, 6, source="draft/d2t.safetensors")
    assert str(raised.value).startswith("draft/d2t.safetensors: ")


def test_save_load_round_trip(tmp_path):
    d2t, t2d = valid_tables()
    path = tmp_path / "sub" / "d2t.safetensors"
    save_d2t(path, d2t, t2d)
    loaded_d2t, loaded_t2d = load_d2t(path, 6)
    assert torch.equal(loaded_d2t, d2t) and torch.equal(loaded_t2d, t2d)
    assert [p.name for p in path.parent.iterdir()] == ["d2t.safetensors"]  # no temp file left behind
    with pytest.raises(D2TError, match=r"d2t\.safetensors: t2d has length 6, expected target_vocab=7"):
        load_d2t(path, 7)


def test_load_errors_name_the_file(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "d2t.safetensors"
    save_file({"d2t": torch.tensor([0, 1])}, str(path))
    with pytest.raises(D2TError, match=r"d2t\.safetensors: missing tensor\(s\) \['t2d'\]"):
        load_d2t(path, 4)
    save_file({"d2t": torch.tensor([0, 5]), "t2d": torch.tensor([True, False, False, False])}, str(path))
    with pytest.raises(D2TError, match=r"d2t\.safetensors: d2t\[1\]=5"):
        load_d2t(path, 4)
    path.write_bytes(b"not safetensors")
    with pytest.raises(D2TError, match="cannot read"):
        load_d2t(path, 4)
    with pytest.raises(D2TError, match="cannot read"):
        load_d2t(tmp_path / "absent.safetensors", 4)
    with pytest.raises(D2TError):  # refuses to write an invalid table
        save_d2t(tmp_path / "bad.safetensors", torch.tensor([0, -1]), torch.tensor([True, True, False]))
