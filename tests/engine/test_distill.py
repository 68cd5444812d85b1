"""`anydraft distill` on tiny models (TLI pair, different tokenizers): it raises the held-out acceptance bound it
trains on, writes a checkpoint transformers and anydraft load, resumes from its state and refuses a state written
with other settings."""
from __future__ import annotations

import json

import pytest
import torch

from anydraft import LLM, SamplingParams
from anydraft.cli import main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_dir):
    path = tmp_path_factory.mktemp("distill") / "corpus.jsonl"
    with open(shared_dir / "data" / "gsm8k" / "train.jsonl", encoding="utf-8") as f:
        path.write_text("".join(line for _, line in zip(range(12), f)))
    return path


def distill(ckpts, corpus, out, *extra):
    return main(["distill", "--target", str(ckpts.qwen3_target), "--draft", str(ckpts.llama2_draft),
                 "--corpus", str(corpus), "--out", str(out), "--num-prompts", "8", "--held-out", "4",
                 "--max-tokens", "24", "--batch-size", "4", "--lr", "3e-3", "--eval-every", "5", "--no-al",
                 "--json", *extra])


def test_distill_raises_held_out_acceptance_and_writes_a_loadable_draft(ckpts, corpus, tmp_path, capsys):
    out = tmp_path / "draft"
    assert distill(ckpts, corpus, out, "--steps", "20") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["held_out_positions"] > 20
    assert summary["held_out_acceptance_after"] > 1.1 * summary["held_out_acceptance_before"], summary
    assert json.loads((out / "distill.json").read_text())["steps"] == 20
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.vocab_size == 32000
    # anydraft serves it as a draft, and greedy output stays the target alone's (float64: exact)
    prompt = "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"
    params = SamplingParams(temperature=0, max_tokens=16)
    spec = LLM(str(ckpts.qwen3_target), {"model": str(out), "num_speculative_tokens": 3}, dtype="float64",
               device="cpu", max_num_seqs=1, max_model_len=256).generate([prompt], params)
    alone = LLM(str(ckpts.qwen3_target), None, dtype="float64", device="cpu", max_num_seqs=1,
                max_model_len=256).generate([prompt], params)
    assert spec[0].outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_distill_resumes_where_it_stopped_and_refuses_other_settings(ckpts, corpus, tmp_path, capsys):
    out = tmp_path / "draft"
    assert distill(ckpts, corpus, out, "--steps", "5") == 0
    first = json.loads(capsys.readouterr().out)
    state = torch.load(out / "distill_state.pt", weights_only=False)
    assert state["step"] == 5
    assert distill(ckpts, corpus, out, "--steps", "8") == 2   # a state exists: --resume or another --out
    capsys.readouterr()
    assert distill(ckpts, corpus, out, "--steps", "8", "--resume") == 0
    resumed = json.loads(capsys.readouterr().out)
    assert [h["step"] for h in resumed["history"]] == list(range(9))   # 0 = before; 1..5 then 6..8
    assert resumed["held_out_acceptance_before"] == first["held_out_acceptance_before"]
    assert distill(ckpts, corpus, out, "--steps", "8", "--resume", "--temperature", "1.0") == 2
    assert "was written with temperature=0.7" in capsys.readouterr().err


def test_on_policy_examples_are_the_drafts_own_text_read_by_the_target(ckpts, corpus, tmp_path, capsys):
    """--on-policy 0.5: half the training prompts are continued by the draft alone (prompt i seeded as the target's
    would be), its text re-read in the target's ids; the other prompts keep the target's continuations, and the
    held-out ones are the same whatever the fraction."""
    from anydraft.distill.examples import corpus_prompts, on_policy_prompts
    runs = {}
    for fraction in ("0", "0.5"):
        out = tmp_path / f"on-policy-{fraction}"
        assert distill(ckpts, corpus, out, "--steps", "1", "--on-policy", fraction) == 0
        assert json.loads(capsys.readouterr().out)["on_policy"] == float(fraction)
        runs[fraction] = torch.load(out / "distill_state.pt", weights_only=False)
        assert len(runs[fraction]["train"]) == 8   # every continuation has shared boundaries
    assert runs["0.5"]["held_out"] == runs["0"]["held_out"]
    drafted = on_policy_prompts(8, 0.5)
    kept = [i for i in range(8) if i not in drafted]
    assert len(drafted) == 4
    prompts = corpus_prompts(corpus)[:8]
    alone = {}   # each model alone on its prompts, in the calls distill makes (same batch, same seeds)
    for name, model, indices in (("draft", ckpts.llama2_draft, drafted), ("target", ckpts.qwen3_target, kept)):
        llm = LLM(str(model), None, max_num_seqs=64)
        outputs = llm.generate([prompts[i] for i in indices],
                               [SamplingParams(temperature=0.7, max_tokens=24, seed=i) for i in indices])
        specials = set(llm.tokenizer.special_ids)
        for i, output in zip(indices, outputs):
            ids = list(output.outputs[0].token_ids)
            while ids and ids[-1] in specials:
                ids.pop()
            alone[i] = (llm.tokenizer, ids)
    target_tokenizer = alone[kept[0]][0]
    for i in range(8):
        example = runs["0.5"]["train"][i]
        prompt_ids = target_tokenizer.encode(prompts[i])
        assert example["target_ids"][:len(prompt_ids)] == prompt_ids
        continuation = example["target_ids"][len(prompt_ids):]
        tokenizer, ids = alone[i]
        if i in kept:
            assert continuation == ids
        else:   # the draft's text, in the target's ids
            assert target_tokenizer.decode(continuation, skip_special_tokens=False) == tokenizer.decode(
                ids, skip_special_tokens=False)
            assert continuation != runs["0"]["train"][i]["target_ids"][len(prompt_ids):]
