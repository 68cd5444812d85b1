"""Per-request behaviour: stop conditions inside a multi-token step, seeded sampling, and bad input."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from anydraft.config import SamplingParams
from anydraft.llm import LLM

from reference_model import reference_greedy
from tiny_models import EOS_PROMPT, make_d2t_draft, tokenizer_of


# -- stop conditions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [1, 7])
def test_max_tokens_cuts_inside_a_step(ckpts, llms, prompts, max_tokens):
    """The identical draft makes every step emit k+1 = 5 tokens; the request still gets exactly max_tokens."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_target, k=4)
    outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    for prompt, out in zip(prompts, outputs):
        assert len(out.outputs[0].token_ids) == max_tokens
        assert out.outputs[0].finish_reason == "length"
        assert out.outputs[0].token_ids == reference_greedy(ckpts.gpt2_target, prompt, max_tokens)
        assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids)


def test_first_token_comes_from_the_prompt_forward(ckpts, llms, prompts, monkeypatch):
    """The prefill's last position gives the first token, as in vLLM and HF: with a draft that is always
    accepted (itself, k=4), 11 tokens take the prompt forward plus 2 verification steps of 5 tokens, and a
    request of one token takes no verification step at all. AL counts only the verification steps."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_target, k=4)
    target_forwards = []
    real_forward = llm.engine.target.forward
    monkeypatch.setattr(llm.engine.target, "forward",
                        lambda rows, input_ids, num_new=None: target_forwards.append(input_ids.shape[1])
                        or real_forward(rows, input_ids, num_new))
    prompt_len = len(llm.tokenizer.encode(prompts[0]))
    [out] = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=11, ignore_eos=True))
    assert out.outputs[0].token_ids == reference_greedy(ckpts.gpt2_target, prompts[0], 11)
    assert target_forwards == [prompt_len, 5, 5]
    assert out.metrics["target_forwards"] == 2 and out.metrics["acceptance_length"] == 5
    target_forwards.clear()
    [one] = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert one.outputs[0].token_ids == out.outputs[0].token_ids[:1] and one.outputs[0].finish_reason == "length"
    assert target_forwards == [prompt_len] and one.metrics["target_forwards"] == 0
    assert not llm.engine.has_unfinished() and len(llm.engine.free_rows) == llm.engine.target.cache.max_batch


def test_stop_string_cuts_text_and_finishes(ckpts, llms, prompts):
    """TLI with full acceptance (shuffled vocabulary): the stop string appears in the middle of a step."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, k=3)
    [free] = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    # A stop string made of two tokens from the middle of the free-running text (not at a step boundary).
    stop = llm.tokenizer.decode(free.outputs[0].token_ids[9:11])
    assert stop and stop in free.outputs[0].text
    expected_text = free.outputs[0].text[:free.outputs[0].text.find(stop)]
    [out] = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                     stop=["<never appears>", stop]))
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text == expected_text
    assert stop not in out.outputs[0].text
    assert len(out.outputs[0].token_ids) < 24
    assert out.outputs[0].token_ids == free.outputs[0].token_ids[:len(out.outputs[0].token_ids)]


def test_stop_string_late_in_a_long_output(ckpts, llms, prompts):
    """Stop strings are checked on the last tokens only; one that first appears after 100+ tokens still
    ends the request at its first occurrence in the full text."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, k=3)
    [free] = llm.generate([prompts[2]], SamplingParams(temperature=0, max_tokens=160, ignore_eos=True))
    stop = next(s for s in (llm.tokenizer.decode(free.outputs[0].token_ids[i:i + 2]) for i in range(120, 150))
                if s.strip() and free.outputs[0].text.find(s) > len(llm.tokenizer.decode(free.outputs[0].token_ids[:100])))
    [out] = llm.generate([prompts[2]], SamplingParams(temperature=0, max_tokens=160, ignore_eos=True, stop=[stop]))
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text == free.outputs[0].text[:free.outputs[0].text.find(stop)]
    assert len(out.outputs[0].token_ids) > 100


@pytest.mark.parametrize("draft", ["itself", "none"])
def test_eos_ends_the_request(ckpts, llms, draft):
    """The target emits EOS within a few tokens; with itself as draft, EOS is accepted mid-step and the
    tokens drafted after it are dropped."""
    target_dir = ckpts.gpt2_eos_target
    eos = tokenizer_of(target_dir).eos_token_ids[0]
    expected_target_ids = reference_greedy(target_dir, EOS_PROMPT, 24)
    assert expected_target_ids[-1] == eos and 2 <= len(expected_target_ids) <= 6
    llm = llms.get(target_dir, target_dir if draft == "itself" else None, k=4)
    [out] = llm.generate([EOS_PROMPT], SamplingParams(temperature=0, max_tokens=24))
    assert out.outputs[0].token_ids == expected_target_ids
    assert out.outputs[0].finish_reason == "stop"
    [ignored] = llm.generate([EOS_PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert ignored.outputs[0].finish_reason == "length" and len(ignored.outputs[0].token_ids) == 24
    assert ignored.outputs[0].token_ids[:len(expected_target_ids)] == expected_target_ids


@pytest.mark.parametrize("k", [2, 4])
def test_max_model_len_ends_speculative_and_target_alone_alike(ckpts, llms, k):
    """max_model_len bounds prompt + output; a step that would cross it is cut there, whatever k is."""
    prompt = "Janet's ducks lay 16 eggs per day."
    greedy = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    [alone] = llms.get(ckpts.gpt2_target, None, max_model_len=40).generate([prompt], greedy)
    [spec] = llms.get(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, k=k, max_model_len=40).generate([prompt], greedy)
    assert spec.outputs[0].token_ids == alone.outputs[0].token_ids
    assert len(alone.outputs[0].token_ids) == 40 - len(tokenizer_of(ckpts.gpt2_target).encode(prompt))
    assert alone.outputs[0].finish_reason == spec.outputs[0].finish_reason == "length"


# -- seeded sampling ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("draft", ["small_noisy_draft", "small_tli_draft"])
def test_seeded_request_reproduces_whatever_its_batch_mates(ckpts, llms, prompts, draft):
    llm = llms.get(ckpts.small_target, getattr(ckpts, draft), k=3, max_num_seqs=4, dtype="float32")
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=1234)
    [alone] = llm.generate([prompts[0]], seeded)
    mates = [SamplingParams(temperature=1.0, max_tokens=20, seed=5), SamplingParams(temperature=0, max_tokens=12),
             SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16), SamplingParams(temperature=1.3, max_tokens=3)]
    batch = llm.generate([prompts[2], prompts[1], prompts[0], prompts[3], prompts[0]], mates[:2] + [seeded] + mates[2:])
    assert batch[2].outputs[0].token_ids == alone.outputs[0].token_ids
    assert batch[1].outputs[0].token_ids == reference_greedy(ckpts.small_target, prompts[1], 12)  # the greedy batch-mate
    # Joining a batch already running (six requests over four rows: it gets a row another request left).
    late = llm.generate([prompts[3]] * 5 + [prompts[0]], [mates[0]] * 5 + [seeded])
    assert late[5].outputs[0].token_ids == alone.outputs[0].token_ids
    # Other seeds give other samples (so the equalities above are not trivially true).
    others = llm.generate([prompts[0]] * 4, [SamplingParams(temperature=1.0, max_tokens=12, seed=s) for s in range(4)])
    assert any(o.outputs[0].token_ids != alone.outputs[0].token_ids for o in others)


# -- bad input ------------------------------------------------------------------------------------------------
def _llm(target, draft=None, **spec):
    config = None if draft is None else {"model": str(draft), **spec}
    return LLM(model=str(target), speculative_config=config, dtype="float64", device="cpu", max_num_seqs=2,
               max_model_len=64)


def test_identity_mode_with_another_tokenizer_is_refused(ckpts):
    with pytest.raises(ValueError, match="identity.*same tokenizer.*tli"):
        _llm(ckpts.gpt2_target, ckpts.gpt2_shuffled_draft, vocab_mode="identity")


def test_d2t_table_out_of_range_is_refused(ckpts, tmp_path):
    tables = load_file(str(ckpts.smollm2_d2t_draft / "d2t.safetensors"))
    bad_d2t = tables["d2t"].clone()
    bad_d2t[-1] += 10_000  # the last draft row now maps past the target's 49152 rows
    bad_draft = make_d2t_draft(ckpts.smollm2_target, tmp_path / "bad_d2t", num_head_rows=len(bad_d2t), noise=0.0,
                               seed=0, d2t_tensors={"d2t": bad_d2t, "t2d": tables["t2d"]})
    with pytest.raises(ValueError, match=r"d2t\[\d+\].*outside \[0, 49152\)"):
        _llm(ckpts.smollm2_target, bad_draft)


def test_d2t_mode_without_tables_is_refused(ckpts):
    with pytest.raises(ValueError, match="d2t.*tables"):
        _llm(ckpts.smollm2_target, ckpts.smollm2_noisy_draft, vocab_mode="d2t")


@pytest.mark.parametrize("spec, message", [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"num_speculative_tokens": -2}, "num_speculative_tokens must be an integer >= 1"),
    ({"vocab_mode": "bytes"}, "vocab_mode 'bytes' is unknown; use one of"),
    ({"dtype": "float8"}, "dtype 'float8' is not supported"),
    ({"lookahead": 3}, "unknown keys"),
])
def test_bad_speculative_config_is_refused(ckpts, spec, message):
    with pytest.raises(ValueError, match=message):
        _llm(ckpts.small_target, ckpts.small_noisy_draft, **spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_draft_device_that_is_missing_is_refused(ckpts):
    with pytest.raises(ValueError, match="CUDA is not available"):
        _llm(ckpts.small_target, ckpts.small_noisy_draft, device="cuda")


def test_bad_prompts_are_refused_and_leave_nothing_behind(ckpts, llms):
    llm = llms.get(ckpts.small_target, ckpts.small_noisy_draft, k=3, max_num_seqs=4, max_model_len=64)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([""], greedy)
    long_prompt = "one two three four five six seven eight nine ten " * 8
    with pytest.raises(ValueError, match="too long for max_model_len 64"):
        llm.generate(["A fine prompt", long_prompt], greedy)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [greedy])
    # The fine prompt of the refused call is not left queued: the next call returns only its own outputs.
    assert not llm.engine.has_unfinished()
    outputs = llm.generate(["Another prompt"], greedy)
    assert len(outputs) == 1 and outputs[0].outputs[0].token_ids == reference_greedy(ckpts.small_target, "Another prompt", 8)


def test_a_prompt_with_no_text_for_the_draft_is_decoded_with_its_batch_mates(ckpts, llms, prompts):
    """A prompt the target reads as its BOS alone decodes to no text, and the qwen3 draft's tokenizer makes no token
    of it: the draft starts from its own end-of-text token instead of failing the step for every request."""
    target_dir = ckpts.llama2_target
    llm = llms.get(target_dir, ckpts.qwen3_draft, k=2, max_num_seqs=2)
    outputs = llm.generate(["", prompts[0]], SamplingParams(temperature=0, max_tokens=10))
    assert outputs[0].prompt_token_ids == tokenizer_of(target_dir).encode("") != []
    for prompt, out in zip(["", prompts[0]], outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, 10)
    assert llm.stats.k_histogram.get(2, 0) > 0   # the rows drafted


# -- a draft sequence longer than the draft's cache ------------------------------------------------------------
def test_draft_outgrowing_its_cache_keeps_generating_the_target_text(ckpts, llms, monkeypatch):
    """qwen3 target (random: long multi-byte tokens) with a draft on GPT-2 cut to 768 merges, which spells
    that text in several tokens per target token: the draft's sequence outgrows its cache (2 * 64 + 64)
    long before the target's reaches max_model_len 64. The row then stops drafting; output is unchanged."""
    llm = llms.get(ckpts.qwen3_target, ckpts.small_tli_draft, k=3, max_num_seqs=2, max_model_len=64)
    proposer = llm.proposer
    longest = [0]
    real_observe = proposer.observe

    def observe(rows, num_accepted, new_target_ids):
        real_observe(rows, num_accepted, new_target_ids)
        longest[0] = max([longest[0]] + [len(proposer.states[r].draft_ids) for r in rows if r in proposer.states])

    monkeypatch.setattr(proposer, "observe", observe)
    # Over two rows: "A" runs long; the other two join the batch one after the other while its draft is full.
    prompts = ["Hello world", "A", "Tom has 3 apples"]
    params = [SamplingParams(temperature=0, max_tokens=200), SamplingParams(temperature=0, max_tokens=6),
              SamplingParams(temperature=1.0, max_tokens=20, seed=3)]
    outputs = llm.generate(prompts, params)
    assert longest[0] > proposer.runner.cache.max_len
    # The request ends at max_model_len (prompt + output), as it would with the target alone.
    assert outputs[0].outputs[0].finish_reason == "length"
    assert len(outputs[0].outputs[0].token_ids) == 64 - len(llm.tokenizer.encode(prompts[0]))
    for prompt, out in zip(prompts[:2], outputs[:2]):
        assert out.outputs[0].token_ids == reference_greedy(ckpts.qwen3_target, prompt, len(out.outputs[0].token_ids))
    assert len(outputs[2].outputs[0].token_ids) == 20 or outputs[2].outputs[0].finish_reason == "stop"
    assert not llm.engine.has_unfinished()


def test_aborted_request_frees_its_row_for_the_next(ckpts, llms, prompts):
    """A request dropped mid-generation (a client that left): its row is reused, the others are unaffected."""
    llm = llms.get(ckpts.gpt2_target, ckpts.gpt2_shuffled_noisy_draft, k=4, max_num_seqs=4)
    engine, greedy = llm.engine, SamplingParams(temperature=0, max_tokens=16)
    requests = [engine.add_request(p, greedy) for p in prompts[:4]]
    engine.step()
    engine.abort(requests[1])
    late = engine.add_request(prompts[4], greedy)  # waits for a row: gets the aborted one
    engine.run()
    assert requests[1].finish_reason == "abort" and late.row == requests[1].row
    for prompt, request in zip([prompts[0], prompts[2], prompts[3], prompts[4]], requests[:1] + requests[2:] + [late]):
        assert request.output_target_ids == reference_greedy(ckpts.gpt2_target, prompt, 16)
    assert not engine.has_unfinished() and sorted(engine.free_rows) == [0, 1, 2, 3]
