"""Logprobs of output and prompt tokens (float64, tiny random models): the target's raw logprobs (log_softmax of its
logits before temperature / top-k / top-p), the same with speculation as the target alone, equal to a plain forward
of the whole sequence; greedy tokens are unchanged by asking for them; the top-n follows the ranking rule; stop
strings and max_tokens cut them with the tokens; prompt logprobs (echo's) cover every prompt token but the first."""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams

from reference_model import _reference_model
from tiny_models import tokenizer_of

NUM_TOP = 5
# The reference runs the whole sequence at once, the engine through its KV cache: float64 sums in another order, so
# they agree to rounding. Speculation and the target alone also agree to rounding only: a verification forward runs
# k+1 positions per row where the target alone runs one, and float64 matmuls of other shapes round differently.
TOLERANCE = 1e-12


def close(values, wanted) -> bool:
    return all(abs(a - b) <= TOLERANCE * max(1.0, abs(b)) for a, b in zip(values, wanted))


@torch.inference_mode()
def reference_logprobs(model_dir, target_ids: list[int]) -> torch.Tensor:
    """[len - 1... as positions, V]: raw logprobs at every position of the whole sequence, one plain float64 forward
    (no KV cache), padding rows masked as the engine does."""
    model = _reference_model(str(model_dir))
    logits = model.logits(model(torch.tensor([target_ids])))[0]
    logits = logits[:, :tokenizer_of(model_dir).vocab_size]
    return torch.log_softmax(logits, dim=-1)


def check_entries(entries, token_ids, reference, num_top):
    """entries[j] (the engine's) against reference[j] (the logprobs predicting token_ids[j])."""
    assert len(entries) == len(token_ids)
    for (logprob, rank, top), token_id, row in zip(entries, token_ids, reference):
        want = row[token_id].item()
        assert close([logprob], [want]), (logprob, want)
        assert rank == int((row > row[token_id]).sum()) + 1
        assert len(top) == num_top
        order = sorted(range(len(row)), key=lambda i: (-row[i].item(), i))[:num_top]
        assert [i for i, _ in top] == order
        assert close([v for _, v in top], [row[i].item() for i in order])


def generate(llm, prompts, params):
    outs = llm.generate(prompts, params)
    return [o.outputs[0].token_ids for o in outs], [llm.engine.tokenizer.encode(p) for p in prompts], outs


@pytest.mark.parametrize("draft", [None, "qwen3_draft", "llama2_draft"])   # target alone, same vocabulary, TLI
def test_greedy_logprobs_are_the_targets_and_tokens_unchanged(ckpts, llms, prompts, draft):
    target = ckpts.qwen3_target
    llm = llms.get(target, None if draft is None else getattr(ckpts, draft), k=3)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    asked = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=NUM_TOP)
    plain_ids, _, _ = generate(llm, prompts[:4], plain)
    ids, prompt_ids, outs = generate(llm, prompts[:4], asked)
    assert ids == plain_ids   # asking for logprobs changes no greedy token
    for out, output_ids, prompt in zip(outs, ids, prompt_ids):
        reference = reference_logprobs(target, prompt + output_ids)[len(prompt) - 1:-1]
        for d, token_id, row in zip(out.outputs[0].logprobs, output_ids, reference):
            assert close([d[token_id].logprob], [row[token_id].item()])
            assert d[token_id].rank == 1   # greedy: each chosen token is the most likely
            order = sorted(range(len(row)), key=lambda i: (-row[i].item(), i))[:NUM_TOP]
            assert list(d) == order   # the chosen token (the top one) first, then the alternatives in order
            assert close([d[i].logprob for i in order], [row[i].item() for i in order])
    alone = llms.get(target, None, k=3).generate(prompts[:4], asked)
    for out, other in zip(outs, alone):
        assert [list(d) for d in out.outputs[0].logprobs] == [list(d) for d in other.outputs[0].logprobs]
        assert close([lp.logprob for d in out.outputs[0].logprobs for lp in d.values()],
                     [lp.logprob for d in other.outputs[0].logprobs for lp in d.values()])


@pytest.mark.parametrize("draft", [None, "qwen3_draft"])
def test_sampled_logprobs_are_raw_logprobs_of_the_drawn_tokens(ckpts, llms, prompts, draft):
    target = ckpts.qwen3_target
    llm = llms.get(target, None if draft is None else getattr(ckpts, draft), k=3)
    params = [SamplingParams(temperature=t, top_k=top_k, max_tokens=10, seed=s, ignore_eos=True, logprobs=3)
              for s, (t, top_k) in enumerate([(0.7, 0), (1.3, 20), (1.0, 0), (0.5, 5)])]
    engine = llm.engine
    requests = [engine.add_request(p, sp) for p, sp in zip(prompts[:4], params)]
    engine.run()
    for request in requests:
        prompt = request.prompt_target_ids
        reference = reference_logprobs(target, prompt + request.output_target_ids)[len(prompt) - 1:-1]
        check_entries(request.logprobs, request.output_target_ids, reference, 3)


def test_a_mixed_batch_keeps_each_rows_own_top_n(ckpts, llms, prompts):
    target = ckpts.qwen3_target
    llm = llms.get(target, ckpts.qwen3_draft, k=3)
    engine = llm.engine
    asks = [None, 0, 2, 7]
    requests = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=n))
                for p, n in zip(prompts[:4], asks)]
    engine.run()
    assert requests[0].logprobs is None
    for request, n in zip(requests[1:], asks[1:]):
        prompt = request.prompt_target_ids
        reference = reference_logprobs(target, prompt + request.output_target_ids)[len(prompt) - 1:-1]
        check_entries(request.logprobs, request.output_target_ids, reference, n)


def test_stop_strings_and_max_tokens_cut_the_logprobs_with_the_tokens(ckpts, llms, prompts):
    llm = llms.get(ckpts.qwen3_target, ckpts.qwen3_draft, k=3)
    free = llm.generate(prompts[2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    stop = free.text[len(free.text) // 2:len(free.text) // 2 + 3]
    assert stop.strip()
    for params in (SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=stop, logprobs=1),
                   SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, logprobs=1)):
        out = llm.generate(prompts[2], params)[0].outputs[0]
        assert len(out.token_ids) < 20
        assert len(out.logprobs) == len(out.token_ids)


@pytest.mark.parametrize("draft", [None, "qwen3_draft"])
def test_prompt_logprobs_equal_a_plain_forward(ckpts, llms, prompts, draft):
    target = ckpts.qwen3_target
    llm = llms.get(target, None if draft is None else getattr(ckpts, draft), k=3)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=NUM_TOP, logprobs=1)
    # Twice: the second time the prompt's blocks are in the prefix cache, which a scoring request must not take.
    for _ in range(2):
        outs = llm.generate(prompts[2:4], params)
        for out in outs:
            prompt = out.prompt_token_ids
            assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
            reference = reference_logprobs(target, prompt)
            for d, token_id, row in zip(out.prompt_logprobs[1:], prompt[1:], reference):
                assert close([d[token_id].logprob], [row[token_id].item()])
                assert d[token_id].rank == int((row > row[token_id]).sum()) + 1
                order = sorted(range(len(row)), key=lambda i: (-row[i].item(), i))[:NUM_TOP]
                assert close([d[i].logprob for i in order], [row[i].item() for i in order])


def test_prompt_logprobs_across_prefill_chunks_and_max_tokens_zero(ckpts):
    """A prompt longer than a step's token budget is prefilled in chunks; each chunk's positions are scored, the
    last one of a chunk predicting the next chunk's first token. max_tokens 0 scores the prompt only."""
    from anydraft.llm import LLM
    target = ckpts.qwen3_target
    llm = LLM(model=str(target), speculative_config={"model": str(ckpts.qwen3_draft), "num_speculative_tokens": 2,
                                                    "adaptive": False},
              dtype="float64", device="cpu", max_num_seqs=2, max_model_len=256, max_num_batched_tokens=16)
    prompt = " ".join(["seven apples and three pears"] * 8)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    ids = out.prompt_token_ids
    assert len(ids) > 16
    reference = reference_logprobs(target, ids)
    assert close([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])],
                 [row[t].item() for row, t in zip(reference, ids[1:])])


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprob_counts_are_validated(field):
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match=f"{field} must be an integer in \\[0, 20\\]"):
            SamplingParams(**{field: bad})
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=0)
    SamplingParams(max_tokens=0, prompt_logprobs=0)
