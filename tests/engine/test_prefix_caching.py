"""Prefix caching and preemption keep greedy output the target alone's: prompts sharing a long prefix reuse the
target's and the draft's cached blocks (float64, and bf16 on the native kernels), and a pool far smaller than the
load preempts requests that later resume, every output identical to an unpressured run."""
from __future__ import annotations

import pytest

from anydraft.config import SamplingParams
from anydraft.llm import LLM
from anydraft.model.kv_cache import BLOCK_TOKENS, blocks_for
from anydraft.model.loader import resolve_model_path
from anydraft.model.native_extension import why_not_hardware
from anydraft.scheduler import Scheduler

from reference_model import reference_greedy
from tiny_models import gsm8k_questions, tokenizer_of

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def shared_prefix_prompts() -> list[str]:
    prefix = " ".join(gsm8k_questions(2, start=20))
    return [f"{prefix}\nQuestion: {q}\nAnswer:" for q in gsm8k_questions(3, start=30)]


def spec_llm(target, draft, dtype: str, **options) -> LLM:
    options = {"max_num_seqs": 2, **options}
    return LLM(model=str(target), dtype=dtype, device="cpu", max_model_len=384,
               speculative_config={"model": str(draft), "num_speculative_tokens": 3, "adaptive": False}, **options)


def test_prefix_hits_on_target_and_draft_keep_float64_greedy_output(ckpts):
    llm = spec_llm(ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft, "float64")    # TLI: the draft re-tokenizes
    prompts = shared_prefix_prompts()
    outputs = [llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts]   # one after another
    assert outputs == [reference_greedy(ckpts.gpt2_target, prompt, 40) for prompt in prompts]
    target, draft = llm.engine.kv_pools()["target"].stats, llm.engine.kv_pools()["draft"].stats
    prefix_tokens = len(llm.tokenizer.encode(prompts[0].split("\nQuestion:")[0]))
    assert target.hit_tokens >= 2 * (prefix_tokens // BLOCK_TOKENS - 1) * BLOCK_TOKENS, (target, prefix_tokens)
    assert draft.hit_tokens >= 2 * BLOCK_TOKENS, draft   # the draft did not re-read the shared prefix either
    again = llm.generate(prompts[0], GREEDY)[0].outputs[0].token_ids   # prompt and output cached: a longer hit
    assert again == outputs[0]
    off = spec_llm(ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft, "float64", enable_prefix_caching=False)
    assert [off.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts] == outputs
    assert off.engine.kv_pools()["target"].stats.hit_tokens == 0 == off.engine.kv_pools()["draft"].stats.hit_tokens


@pytest.mark.skipif(why_not_hardware() is not None, reason=f"hardware: {why_not_hardware()} (bf16 is exact only on the "
                                                          f"native kernels; float64 is checked above)")
def test_prefix_hits_keep_bf16_greedy_output_on_the_native_kernels(llms):
    target, draft = resolve_model_path("qwen3-target"), resolve_model_path("smollm2-draft")
    llm = spec_llm(target, draft, "bfloat16")
    assert llm.kernels["target"]["body"] == "native", llm.kernels
    alone = llms.get(target, None, dtype="bfloat16", max_model_len=512)
    prompts = shared_prefix_prompts()
    outputs = [llm.generate(prompt, GREEDY)[0].outputs[0].token_ids for prompt in prompts]
    assert llm.engine.kv_pools()["target"].stats.hit_tokens >= 4 * BLOCK_TOKENS
    assert outputs == [o.outputs[0].token_ids for o in alone.generate(prompts, GREEDY)]


def test_a_preemption_storm_finishes_every_request_as_an_unpressured_run(ckpts):
    target, draft = ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft
    prompts = [f"Question: {q}\nAnswer:" for q in gsm8k_questions(6, start=50)]
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    roomy = LLM(model=str(target), dtype="float64", device="cpu", max_num_seqs=6, max_model_len=256,
                speculative_config={"model": str(draft), "num_speculative_tokens": 3, "adaptive": False})
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    plan = roomy.cache_plan
    # Room for about two of the six requests at full length: the rest wait, and running ones get preempted.
    per_token = plan.target_bytes_per_token + plan.draft_bytes_per_token * plan.draft_tokens / plan.target_tokens
    budget = int(2 * blocks_for(256 + 3) * BLOCK_TOKENS * per_token)
    tight = LLM(model=str(target), dtype="float64", device="cpu", max_num_seqs=6, max_model_len=256,
                kv_cache_memory=budget,
                speculative_config={"model": str(draft), "num_speculative_tokens": 3, "adaptive": False})
    assert tight.cache_plan.target_tokens < 6 * (256 + 3)
    outputs = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    assert expected == [reference_greedy(target, p, 120) for p in prompts]
    pool = tight.engine.kv_pools()["target"]
    assert pool.num_free == pool.usable_blocks   # every block came back


def test_a_burst_sharing_a_prefix_computes_it_once(ckpts, monkeypatch):
    """Three prompts with one long prefix arrive together, with room to admit all three in one step: the second and
    third wait until the first has cached the prefix, then hit it, and every output stays the target alone's.
    Control: admitted at once (the wait switched off) they hit almost nothing."""
    prompts = shared_prefix_prompts()
    prefix_tokens = len(tokenizer_of(ckpts.gpt2_target).encode(prompts[0].split("\nQuestion:")[0]))
    expected = [reference_greedy(ckpts.gpt2_target, prompt, 40) for prompt in prompts]
    hits = {}
    for waits in (True, False):
        if not waits:
            monkeypatch.setattr(Scheduler, "_awaits_a_prefix", lambda self, request: False)
        llm = spec_llm(ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft, "float64", max_num_seqs=3,
                       max_num_batched_tokens=1024)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
        hits[waits] = llm.engine.kv_pools()["target"].stats.hit_tokens
    assert hits[True] >= 2 * (prefix_tokens // BLOCK_TOKENS - 1) * BLOCK_TOKENS > hits[False], (hits, prefix_tokens)
