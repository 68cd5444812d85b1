"""The native body hands a hidden-state draft the same residual-stream states the PyTorch body computes, so a
bf16 target keeps its native kernels (and their batch-invariant exactness) with an EAGLE-3 drafter."""
from __future__ import annotations

import pytest
import torch

from anydraft.model.native_extension import why_not_hardware
from anydraft.model.runner import ModelRunner

from tiny_models import TOKENIZERS, make_checkpoint

CPU = torch.device("cpu")
# Only the CPU may excuse this test (tests/conftest.py); any other reason the native body does not run fails it.
HARDWARE = why_not_hardware()


@pytest.mark.skipif(HARDWARE is not None, reason=f"hardware: {HARDWARE}")
def test_native_capture_equals_pytorch_capture(tmp_path, monkeypatch):
    path = make_checkpoint(tmp_path / "qwen3", "Qwen3ForCausalLM", TOKENIZERS / "qwen3", 151936, hidden=64, layers=3,
                           heads=4, kv_heads=2, seed=9, head_scale=4.0)
    layers = [0, 1, 3]
    received = {}
    for native in (True, False):
        monkeypatch.setenv("ANYDRAFT_NATIVE", "1" if native else "0")
        runner = ModelRunner.load(path, torch.bfloat16, CPU, max_batch=2, max_len=64)
        runner.capture_hidden_states(layers)
        assert (runner.native_unavailable is None) == native   # capturing keeps the native body
        ids = torch.tensor([[785, 4226, 374, 220], [16, 17, 18, 0]])
        runner.forward([0, 1], ids, num_new=[4, 3])
        runner.forward([0, 1], torch.tensor([[11], [12]]))
        received[native] = runner.take_hidden_states()
        assert runner.take_hidden_states() == []   # handed over once
    assert [c.starts for c in received[True]] == [[0, 0], [4, 3]]
    for native_states, pytorch_states in zip(received[True], received[False], strict=True):
        rows_n, states_n, new_n = native_states.rows, native_states.states, native_states.num_new
        assert rows_n == pytorch_states.rows and new_n == pytorch_states.num_new
        states_p = pytorch_states.states
        assert states_n.shape == (2, states_n.shape[1], 3 * 64)
        # layer 0 is the embedding itself: identical; later layers agree to bf16 rounding of the two bodies
        assert torch.equal(states_n[0, :4, :64], states_p[0, :4, :64])
        torch.testing.assert_close(states_n[0, :4].float(), states_p[0, :4].float(), atol=0.05, rtol=0.02)
        torch.testing.assert_close(states_n[1, :3].float(), states_p[1, :3].float(), atol=0.05, rtol=0.02)
