"""`anydraft generate` on tiny checkpoints: JSON token ids equal transformers' greedy generate on the target
alone (an implementation we did not write), plain output, and exit code 2 on bad input."""
from __future__ import annotations

import json

import pytest
import torch

from anydraft.cli import main

from tiny_models import tokenizer_of

PROMPT = "Question: Natalia sold clips to 48 of her friends.\\nAnswer:"  # '\n' escaped as on a shell line
MAX_TOKENS = 20


def _generate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@torch.inference_mode()
def transformers_greedy(model_dir, prompt: str, max_new_tokens: int) -> list[int]:
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    prompt_target_ids = tokenizer_of(model_dir).encode(prompt)  # our encoding (with BOS where the tokenizer adds it)
    input_ids = torch.tensor([prompt_target_ids])
    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=model.config.eos_token_id if isinstance(
                                model.config.eos_token_id, int) else model.config.eos_token_id[0])
    return output[0, len(prompt_target_ids):].tolist()


@pytest.mark.parametrize("target, draft", [("qwen3_target", "llama2_draft"), ("llama2_target", "qwen3_draft")])
def test_json_token_ids_equal_transformers_target_alone(ckpts, capsys, target, draft):
    target_dir, draft_dir = getattr(ckpts, target), getattr(ckpts, draft)
    code, out, err = _generate(capsys, "--target", str(target_dir), "--draft", str(draft_dir), "--json",
                               "--dtype", "float64", "--device", "cpu", "--temperature", "0",
                               "--max-tokens", str(MAX_TOKENS), PROMPT)
    assert code == 0, err
    result = json.loads(out)
    assert result["draft_info"]["vocab_mode"] == "tli"
    expected_target_ids = transformers_greedy(target_dir, PROMPT.replace("\\n", "\n"), MAX_TOKENS)
    completion = result["outputs"][0]
    assert completion["token_ids"] == expected_target_ids
    assert len(completion["token_ids"]) == MAX_TOKENS or completion["finish_reason"] == "stop"
    assert result["metrics"]["target_forwards"] >= 1


def test_plain_output_is_text_then_a_stats_line(ckpts, capsys):
    code, out, err = _generate(capsys, "--target", str(ckpts.gpt2_target), "--draft", str(ckpts.gpt2_shuffled_draft),
                               "--dtype", "float64", "--device", "cpu", "--max-tokens", "12", "-k", "3", "--no-adaptive",
                               PROMPT)
    assert code == 0, err
    _, json_out, _ = _generate(capsys, "--target", str(ckpts.gpt2_target), "--draft", str(ckpts.gpt2_shuffled_draft),
                               "--dtype", "float64", "--device", "cpu", "--max-tokens", "12", "-k", "3", "--no-adaptive", "--json",
                               PROMPT)
    assert out == json.loads(json_out)["outputs"][0]["text"] + "\n"
    assert "tli" in err and "AL 4.00" in err  # the shuffled-vocabulary draft: every draft token accepted
    assert "Traceback" not in err


@pytest.mark.parametrize("bad_args, message", [
    (["-k", "0"], "num_speculative_tokens must be an integer >= 1"),
    (["--vocab-mode", "identity"], "vocab_mode 'identity' needs the same tokenizer"),
    (["--dtype", "float8"], "dtype 'float8' is not supported"),
    (["--device", "cuda"], "CUDA is not available"),
    (["--max-tokens", "0"], "max_tokens must be >= 1"),
    (["--draft", "/nonexistent/draft"], "/nonexistent/draft: not a checkpoint directory"),
    (["--draft", "{tokenizer_only}"], "no config.json"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--draft-vocab-size", "64"], "also give draft_vocab_corpus"),
    (["--draft-vocab-size", "64", "--draft-vocab-corpus", "/nonexistent/c.jsonl"], "/nonexistent/c.jsonl: no such file"),
])
def test_bad_input_exits_2_with_one_line(ckpts, capsys, bad_args, message):
    if "cuda" in bad_args and torch.cuda.is_available():
        pytest.skip("hardware: this machine has CUDA")
    bad_args = [a.format(tokenizer_only=ckpts.small_tokenizer) for a in bad_args]  # a directory without weights
    args = ["--target", str(ckpts.gpt2_target), "--draft", str(ckpts.gpt2_shuffled_draft), "--dtype", "float64",
            "--device", "cpu", "--max-tokens", "4"]
    # later flags win in argparse, so appending the bad one overrides the good default above
    code, out, err = _generate(capsys, *args, *bad_args, "Hello")
    assert code == 2
    assert out == ""
    assert err.startswith("anydraft generate: error:") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_empty_prompt_exits_2(ckpts, capsys):
    code, _, err = _generate(capsys, "--target", str(ckpts.gpt2_target), "--draft", "none", "--device", "cpu", "")
    assert code == 2 and "prompt is empty" in err and "Traceback" not in err


def test_frequency_ranked_head_flags(ckpts, capsys, draft_vocab_corpus):
    """--draft-vocab-size/--draft-vocab-corpus cut the TLI head; the text is the same as with the whole head."""
    args = ["--target", str(ckpts.qwen3_target), "--draft", str(ckpts.llama2_draft), "--dtype", "float64",
            "--device", "cpu", "--max-tokens", "16", "--json", PROMPT]
    code, out, err = _generate(capsys, "--draft-vocab-size", "128", "--draft-vocab-corpus", str(draft_vocab_corpus),
                               *args)
    assert code == 0, err
    cut = json.loads(out)
    assert cut["draft_info"]["draft_head_rows"] == 128 and cut["draft_info"]["draft_vocab"]["asked"] == 128
    code, out, err = _generate(capsys, *args)
    assert code == 0, err
    assert cut["outputs"][0]["token_ids"] == json.loads(out)["outputs"][0]["token_ids"]


def test_eval_samples_seeded_questions_and_compares_accuracy_within_binomial_noise(ckpts, capsys, monkeypatch):
    """`eval gsm8k --temperature T --seed S`: question i samples at T with seed S + i, speculative and target-alone
    runs alike; the result reports the accuracy difference against its binomial noise, and no near-tie analysis
    (a sampled divergence is no rounding)."""
    from anydraft.eval import gsm8k
    run_engine, seen = gsm8k.run_engine, []

    def recording(engine, prompts, params, progress=None):
        seen.append([(p.temperature, p.seed) for p in params])
        return run_engine(engine, prompts, params, progress)
    monkeypatch.setattr(gsm8k, "run_engine", recording)
    args = ["eval", "gsm8k", "--target", str(ckpts.qwen3_target), "--draft", str(ckpts.llama2_draft),
            "--dtype", "float64", "--device", "cpu", "--num-questions", "3", "--max-tokens", "10",
            "--temperature", "0.7", "--seed", "5", "--compare-target", "--json", "--no-progress"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert seen == [[(0.7, 5), (0.7, 6), (0.7, 7)]] * 2   # speculative, then the target alone
    assert first["temperature"] == 0.7 and first["seed"] == 5
    noise = first["accuracy_vs_target_alone"]
    assert noise["difference"] == pytest.approx(first["accuracy"] - first["target_alone"]["accuracy"])
    assert noise["within_binomial_noise"] == (abs(noise["difference"]) <= 2 * noise["stderr"])
    assert all("near_tie" not in m for m in first["mismatches"])
    assert main(args) == 0   # seeded: the same run again
    again = json.loads(capsys.readouterr().out)
    assert (again["generated_tokens"], again["accuracy"], again["exact_matches"]) == (
        first["generated_tokens"], first["accuracy"], first["exact_matches"])
