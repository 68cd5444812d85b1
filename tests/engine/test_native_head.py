"""The native output head (model/native_head.py): greedy() is exactly the argmax of logits(), lowest row on ties,
on random, tied, near-tied and degenerate inputs; logits() is computed the same way for every row."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from anydraft.model.native_extension import cpu_has, load_extension
from anydraft.model.native_head import NativeHead

from test_native_decoder import SCREENED

# Only the hardware may skip these: on a CPU with AVX-512 and VNNI a failed build fails them.
pytestmark = pytest.mark.skipif(SCREENED is not None, reason=f"hardware: {SCREENED}")


def _head(rows: int, width: int = 128, seed: int = 0) -> NativeHead:
    weight = (torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 0.05).bfloat16()
    return NativeHead(weight, load_extension())


def _expected(head: NativeHead, hidden: torch.Tensor, num_rows: int) -> torch.Tensor:
    return head.logits(hidden)[..., :num_rows].float().argmax(dim=-1)   # torch: first index among maxima


SCREENED_ROWS = 8   # greedy_head.cpp: with AMX bf16 but no AMX-INT8 screen, more rows take the full logits


def _greedy_screened(head: NativeHead, hidden: torch.Tensor, num_rows: int) -> torch.Tensor:
    """greedy() in batches small enough for the int8 screen to run (as well as all at once, checked equal)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    screened = torch.cat([head.greedy(flat[i:i + SCREENED_ROWS], num_rows) for i in range(0, len(flat), SCREENED_ROWS)])
    assert torch.equal(screened.view(hidden.shape[:-1]), head.greedy(hidden, num_rows))
    return screened.view(hidden.shape[:-1])


def test_greedy_equals_argmax_of_logits_on_random_rows():
    head = _head(5000)
    hidden = (torch.randn(3, 7, 128, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    assert torch.equal(_greedy_screened(head, hidden, 5000), _expected(head, hidden, 5000))
    assert head.greedy(hidden, 5000).shape == (3, 7)
    assert not head.greedy_with_report(hidden[0, :4], 5000)[1].any()   # the screen decided: no fallback


def test_greedy_breaks_ties_to_the_lowest_row_as_torch_does():
    weight = (torch.randn(999, 128, generator=torch.Generator().manual_seed(2)) * 0.05).bfloat16()
    weight[700] = weight[123] = weight[456] = weight[5] * 3   # three equal rows that beat everything else
    head = NativeHead(weight, load_extension())
    hidden = weight[5:6].float().mul(40).bfloat16()
    assert head.greedy(hidden, 999).tolist() == [123] == _expected(head, hidden, 999).tolist()


def test_greedy_near_ties_one_bf16_step_apart():
    """Rows differing in one weight by one bf16 step: the screen cannot tell them apart, the exact pass must."""
    weight = (torch.randn(4000, 128, generator=torch.Generator().manual_seed(3)) * 0.05).bfloat16()
    base = weight[10].clone()
    for offset, row in enumerate(range(2000, 2016)):
        nudged = base.clone()
        nudged[offset] = torch.nextafter(nudged[offset].float(), torch.tensor(9.0)).bfloat16()
        weight[row] = nudged
    head = NativeHead(weight, load_extension())
    gen = torch.Generator().manual_seed(4)
    hidden = (base.float()[None] * 30 + torch.randn(64, 128, generator=gen) * 0.3).bfloat16()
    assert torch.equal(_greedy_screened(head, hidden, 4000), _expected(head, hidden, 4000))


def test_rows_past_num_rows_are_never_chosen():
    weight = (torch.randn(300, 128, generator=torch.Generator().manual_seed(5)) * 0.05).bfloat16()
    weight[290] = weight[0] * 50   # would win, but sits in the padding rows
    head = NativeHead(weight, load_extension())
    hidden = weight[0:1].float().mul(20).bfloat16()
    assert head.greedy(hidden, 289).item() == _expected(head, hidden, 289).item() != 290


def test_degenerate_inputs_fall_back_to_exact_rows():
    head = _head(700, seed=6)
    zeros = torch.zeros(1, 128, dtype=torch.bfloat16)
    assert head.greedy(zeros, 700).tolist() == _expected(head, zeros, 700).tolist() == [0]   # all logits 0
    huge = torch.full((1, 128), 3.0e38).bfloat16()
    huge[0, ::2] = -3.0e38
    assert head.greedy(huge, 700).tolist() == _expected(head, huge, 700).tolist()


def test_logits_do_not_depend_on_the_other_rows_of_the_batch():
    head = _head(3000, seed=7)
    hidden = torch.randn(9, 128, generator=torch.Generator().manual_seed(8)).bfloat16()
    together = head.logits(hidden)
    assert all(torch.equal(together[i], head.logits(hidden[i:i + 1])[0]) for i in range(9))
    exact = hidden.double() @ head.weight.double().T
    assert ((together.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-6).all()   # one bf16 rounding


def test_many_rows_give_the_same_ids_with_or_without_the_screen():
    """Past SCREENED_ROWS rows a machine with AMX bf16 but no AMX-INT8 screen takes the full logits (cheaper there
    than a VNNI screen); with AMX-INT8 tiles the screen stays. Ids unchanged either way."""
    head = _head(6000, width=256, seed=11)
    hidden = (torch.randn(16, 256, generator=torch.Generator().manual_seed(12)) * 3).bfloat16()
    ids, fell_back = head.greedy_with_report(hidden, 5999)
    assert torch.equal(ids, _expected(head, hidden, 5999)) and torch.equal(_greedy_screened(head, hidden, 5999), ids)
    extension = load_extension()
    assert fell_back.all() == (extension.matmul_path(256) == "amx" and extension.screen_path(16) != "amx")


def test_rows_standing_after_the_probe_past_the_limit_take_the_full_logits():
    """Head rows past the probe (the first 64 blocks) that all tie the winner: more candidates than 1/64 of the
    head, so the row takes the full logits; the argmax is still the lowest of the tied rows."""
    weight = (torch.randn(6000, 128, generator=torch.Generator().manual_seed(13)) * 0.05).bfloat16()
    weight[3000:3400] = weight[17] * 4   # 400 equal rows after the probe's 1024, above everything else
    head = NativeHead(weight, load_extension())
    hidden = weight[17:18].float().mul(40).bfloat16().repeat(2, 1)
    ids, fell_back = head.greedy_with_report(hidden, 6000)
    assert ids.tolist() == _expected(head, hidden, 6000).tolist() == [3000, 3000]
    assert fell_back.all()
    few = weight.clone()
    few[3004:3400] = weight[3400:3796]   # 4 tied rows: the screen narrows it, no fallback
    head = NativeHead(few, load_extension())
    ids, fell_back = head.greedy_with_report(hidden, 6000)
    assert ids.tolist() == _expected(head, hidden, 6000).tolist() == [3000, 3000] and not fell_back.any()


def test_the_screen_scores_rows_with_amx_tiles_or_vnni_and_both_give_the_argmax():
    """Several activation rows take AMX-INT8 tiles where the CPU has them, one row VNNI; ANYDRAFT_NATIVE_AMX=0
    (read once per process) keeps every row on VNNI. Each path's ids are the argmax of the logits."""
    expected_path = "amx" if cpu_has("amx_int8") else "vnni"
    assert load_extension().screen_path(1) == "vnni" and load_extension().screen_path(6) == expected_path
    code = ("import sys; sys.path.insert(0, {here!r}); import test_native_head as t; "
            "from anydraft.model.native_extension import load_extension; "
            "assert load_extension().screen_path(16) == 'vnni'; "
            "t.test_greedy_equals_argmax_of_logits_on_random_rows(); t.test_greedy_near_ties_one_bf16_step_apart(); "
            "t.test_rows_standing_after_the_probe_past_the_limit_take_the_full_logits()")
    done = subprocess.run([sys.executable, "-c", code.format(here=str(Path(__file__).parent))], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "ANYDRAFT_NATIVE_AMX": "0"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_width_not_a_multiple_of_64_is_refused():
    with pytest.raises(ValueError, match="multiple of 64"):
        NativeHead(torch.zeros(10, 96, dtype=torch.bfloat16), load_extension())
