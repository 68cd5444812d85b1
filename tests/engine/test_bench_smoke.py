"""`anydraft bench` end to end on tiny random checkpoints: every output present, emulation labelled, peers skip cleanly."""
import json
import os
import sys

import pytest

from anydraft.bench.inflate import parse_inflate_spec
from anydraft.bench.peer_vllm import find_vllm_python
from anydraft.bench.report import markdown_table
from anydraft.bench.suite import BenchConfig, run_bench
from anydraft.cli import main


def _config(ckpts, **overrides) -> BenchConfig:
    base = dict(target=str(ckpts.smollm2_target), draft=str(ckpts.qwen3_draft),
                same_vocab_draft=str(ckpts.smollm2_noisy_draft), k=2, num_prompts=2, max_tokens=8, repeats=1,
                peers=(), sweep_ks=[1, 2], threads=1, max_model_len=512)
    base.update(overrides)
    return BenchConfig(**base)


def test_bench_runs_every_anydraft_contender(ckpts):
    result = run_bench(_config(ckpts))
    names = [r["name"] for r in result["runs"]]
    assert names == ["anydraft target alone", "anydraft same-vocab (identity)", "anydraft TLI"]
    for run in result["runs"]:
        assert run["tokens_per_second_median"] > 0 and run["speedup_vs_target_alone"] > 0
        # Greedy speculative decoding reproduces the target alone (float32 tiny models: no near-ties).
        assert run["exact_matches_vs_target_alone"] == 2
        assert 0 <= run["gsm8k_accuracy"] <= 1
    tli = result["runs"][2]
    assert 1 <= tli["acceptance_length"] <= 3 and len(tli["acceptance_by_position"]) == 2
    assert tli["ideal_speedup"] > 0
    assert [row["k"] for row in result["sweep_k"]] == [1, 2]
    assert set(result["costs"]["verify_seconds"]) == {"1", "2"}
    assert not result["config"]["emulated"]
    assert "anydraft TLI" in markdown_table(result)
    roofline = result["roofline"]
    assert roofline["bandwidth"]["bytes_per_second"] > 0 and roofline["bandwidth"]["threads"] == 1
    assert roofline["bandwidth"]["bytes"] == pytest.approx(roofline["target_weight_bytes"], rel=0.05)
    readers = roofline["bandwidth"]["readers"]   # the bound is the fastest GEMV at hand, torch's among them
    assert "torch.mm" in readers and roofline["bandwidth"]["seconds"] == min(readers.values())
    [alone] = roofline["target_alone"]          # one system ran, one target-alone row
    assert alone["name"] == "anydraft target alone"
    assert alone["fraction_of_bound"] == pytest.approx(alone["bound_seconds_per_token"] / alone["seconds_per_token"])
    # our engine tells when each first token came: the decode after it is timed apart from the prompt's forward
    assert 0 < alone["decode_seconds_per_token"] < result["runs"][0]["seconds_median"]
    assert alone["decode_fraction_of_bound"] == pytest.approx(alone["bound_seconds_per_token"]
                                                              / alone["decode_seconds_per_token"])
    assert "Roofline: memory bandwidth" in markdown_table(result) and "decode alone" in markdown_table(result)
    # our decode steps alternate with the fastest GEMV: every token after each prompt's first is one pair
    interleaved = roofline["bandwidth"]["interleaved"]
    tokens = result["runs"][0]["generated_tokens"]
    assert interleaved["pairs"] == tokens - 2 and interleaved["fraction_of_bound_median"] > 0
    assert "Roofline, alternating" in markdown_table(result)
    json.dumps(result)   # the JSON file must serialize


def test_frequency_ranked_heads_add_their_own_rows(ckpts, draft_vocab_corpus):
    result = run_bench(_config(ckpts, sweep_ks=[], draft_vocab_size=512, draft_vocab_corpus=str(draft_vocab_corpus)))
    names = [r["name"] for r in result["runs"]]
    assert names == ["anydraft target alone", "anydraft same-vocab (identity)", "anydraft TLI",
                     "anydraft same-vocab (identity) + FR head 512", "anydraft TLI + FR head 512"]
    for run in result["runs"]:
        assert run["exact_matches_vs_target_alone"] == 2
    for key in ("same_vocab_fr", "tli_fr"):
        assert result["draft_info"][key]["draft_head_rows"] == 512
    # each row's cost model uses its own draft's measured cost
    costs = result["costs"]
    assert costs["tli_fr_draft_seconds"] > 0 and costs["same_vocab_fr_draft_seconds"] > 0
    assert result["runs"][4]["ideal_speedup"] != result["runs"][2]["ideal_speedup"]
    assert "T_draft (TLI, FR head)" in markdown_table(result)


def test_inflated_target_is_labelled_emulated_and_decodes_the_same(ckpts):
    result = run_bench(_config(ckpts, same_vocab_draft=None, sweep_ks=[], peers=("hf", "vllm"),
                               inflate=parse_inflate_spec("4x256")))
    assert result["config"]["emulated"] and result["config"]["inflate_target"] == "4x256"
    assert result["target"]["shape_layers_x_mlp_rows"] == "4x256" and result["target"]["trained_shape"] == "2x64"
    assert "EMULATED" in markdown_table(result)
    assert set(result["skipped"]) == {"hf", "vllm"}
    assert all(r["exact_matches_vs_target_alone"] == 2 for r in result["runs"])
    assert result["git_commit"] is not None and result["machine"]["cores"] >= 1
    assert result["kernels"]["target"]["body"]


def test_batch_of_two_runs_adaptive_beside_fixed_k_and_skips_batch_1_only_rows_with_reasons(ckpts):
    """At batch 2 every anydraft row decodes groups of two prompts (exact per prompt in float32); HF assisted
    generation (batch 1 only) and the roofline are skipped with their reasons, not silently."""
    result = run_bench(_config(ckpts, same_vocab_draft=None, num_prompts=4, batch_size=2, adaptive_k=3,
                               peers=("hf",), sweep_ks=[1]))
    names = [r["name"] for r in result["runs"]]
    assert names == ["anydraft target alone", "anydraft TLI", "anydraft TLI adaptive (default)"]
    for run in result["runs"]:
        assert run["exact_matches_vs_target_alone"] == 4 and len(run["per_group_steps"]) == 2
    assert result["runs"][2]["adaptive"] and result["runs"][2]["k"] == 3
    assert "one prompt at a time" in result["skipped"]["hf"] and "batch-1" in result["skipped"]["roofline"]
    assert result["config"]["pair"]["target"] == "local" and result["costs"]["rows"] == 2
    table = markdown_table(result)
    assert "**Batch size 2**" in table and "hf skipped:" in table and "roofline skipped:" in table
    assert "Adaptive (k <= 3" in table


def test_rounds_interleave_contenders_and_rotate_their_order():
    """Every round runs prompt i on every contender before prompt i+1; the order rotates; capped contenders
    (slow peers) stop after their rounds; tok/s per round = tokens / seconds of that round."""
    from anydraft.bench.contenders import GroupRun, run_rounds
    calls = []

    class Fake:
        def __init__(self, name, tokens_per_prompt, seconds_per_prompt):
            self.name, self.system, self.k = name, "fake", 2
            self.tokens, self.seconds = tokens_per_prompt, seconds_per_prompt

        def warm_up(self, group):
            [prompt_index] = group   # batch 1: groups of one prompt
            calls.append(("warm", self.name, prompt_index))

        def run(self, group):
            [prompt_index] = group
            calls.append((self.name, prompt_index))
            return GroupRun([[7] * self.tokens], self.seconds, target_forwards=self.tokens // 2, num_accepted=self.tokens // 2,
                             accepted_at_position=[self.tokens // 2, 0])

    a, b, c = Fake("a", 4, 0.5), Fake("b", 6, 2.0), Fake("c", 2, 1.0)
    results = run_rounds([a, b, c], num_prompts=2, repeats=2, rounds_of=lambda x: 1 if x.name == "c" else -1)
    assert calls[:3] == [("warm", "a", 0), ("warm", "b", 0), ("warm", "c", 0)]
    timed = calls[3:]
    assert timed[:6] == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1)]   # round 1, rotating
    assert timed[6:] == [("b", 0), ("a", 0), ("a", 1), ("b", 1)]                       # round 2 without c
    assert results["a"]["tokens_per_second_all"] == [8.0, 8.0]
    assert results["b"]["tokens_per_second_median"] == 3.0 and results["c"]["tokens_per_second_all"] == [2.0]
    assert results["a"]["acceptance_length"] == 2.0          # (accepted 4 + forwards 4) / forwards 4
    assert results["a"]["acceptance_by_position"] == [1.0, 0.0]
    assert results["a"]["output_target_ids"] == [[7] * 4, [7] * 4]


def test_contender_that_stops_answering_is_dropped_and_the_others_finish():
    """A peer whose worker hangs or dies mid-bench (ContenderUnavailable) is dropped with the reason; the other
    contenders' rounds still complete and are reported."""
    from anydraft.bench.contenders import ContenderUnavailable, GroupRun, run_rounds
    from anydraft.bench.peer_vllm import VLLMUnavailable

    class Fake:
        def __init__(self, name, fail_at=None):
            self.name, self.system, self.k, self.fail_at, self.runs = name, "fake", 0, fail_at, 0

        def warm_up(self, group):
            pass

        def run(self, group):
            if self.runs == self.fail_at:
                raise VLLMUnavailable("worker gave no RESULT within 600s")
            self.runs += 1
            return GroupRun([[1, 2, 3]], 1.0)

    steady, flaky = Fake("steady"), Fake("flaky", fail_at=3)
    dropped = {}
    results = run_rounds([steady, flaky], num_prompts=2, repeats=3, dropped=dropped)
    assert issubclass(VLLMUnavailable, ContenderUnavailable)
    assert set(results) == {"steady"} and results["steady"]["tokens_per_second_all"] == [3.0, 3.0, 3.0]
    assert flaky.runs == 3 and "round 2" in dropped["flaky"] and "no RESULT" in dropped["flaky"]


def test_vllm_without_interpreter_is_skipped_with_reason(monkeypatch):
    monkeypatch.delenv("ANYDRAFT_VLLM_PYTHON", raising=False)
    python, reason = find_vllm_python(None)
    assert python is None and "--vllm-python" in reason
    python, reason = find_vllm_python("/nonexistent/python")
    assert python is None and "not an executable" in reason


def test_cli_writes_json_and_plots(ckpts, tmp_path, capsys):
    code = main(["bench", "--target", str(ckpts.smollm2_target), "--draft", str(ckpts.qwen3_draft),
                 "--same-vocab-draft", "none", "-k", "2", "--num-prompts", "1", "--max-tokens", "6", "--repeats", "1",
                 "--sweep-k", "1-2", "--peers", "vllm", "--threads", "1", "--out", str(tmp_path), "--tag", "smoke"])
    assert code == 0
    out = capsys.readouterr().out
    assert "vllm skipped" in out
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert result["skipped"]["vllm"]
    assert result["git_commit"] and result["torch_threads"] == 1 and result["batch_size"] == 1
    assert (tmp_path / "smoke_acceptance_by_position.png").stat().st_size > 0
    assert (tmp_path / "smoke_speedup_vs_k.png").stat().st_size > 0


def test_hf_peer_pins_k_on_the_assistant(ckpts):
    """transformers reads drafting settings from the assistant's generation_config, not generate() kwargs."""
    from anydraft.bench.contenders import run_rounds
    from anydraft.bench.peer_hf import HFContender, HFPeer
    from anydraft.tokenizer import Tokenizer
    ids = Tokenizer.from_dir(ckpts.smollm2_target).encode("Question: what is 2 + 3?\nAnswer:")
    peer = HFPeer(str(ckpts.smollm2_target), str(ckpts.smollm2_noisy_draft), "float32")
    alone = HFContender(peer, [ids], 0, max_tokens=6)
    assisted = HFContender(peer, [ids], 2, max_tokens=6)
    assert (alone.name, assisted.name) == ("HF target alone", "HF assisted (assisted (same vocab))")
    by_name = run_rounds([alone, assisted], num_prompts=1, repeats=1)
    results = {"alone": by_name[alone.name], "assisted": by_name[assisted.name]}
    assert peer.draft.generation_config.num_assistant_tokens == 2
    assert peer.draft.generation_config.assistant_confidence_threshold == 0.0
    assert assisted.hf_path == "assisted (same vocab)" and alone.hf_path == "target alone"
    assert results["assisted"]["generated_tokens"] == 6
    assert 1 <= results["assisted"]["acceptance_length"] <= 3   # at most k + 1 tokens per target forward
    assert results["alone"]["acceptance_length"] == 1.0
    # Lossless on the same checkpoints: HF's assisted output is its target-alone output.
    assert results["assisted"]["output_target_ids"] == results["alone"]["output_target_ids"]


def test_acceptance_on_identical_texts_uses_only_prompts_both_decoded_alike():
    from anydraft.bench.scoring import acceptance_on_identical_texts as _acceptance_on_identical_texts
    ours = {"system": "anydraft", "_outputs": [[1, 2, 3], [4, 5], [6]], "per_group_steps": [[2, 4], [1, 1], [1, 0]]}
    vllm = {"system": "vllm", "_outputs": [[1, 2, 3], [4, 9], [6]], "per_group_steps": [[3, 3], [1, 0], [1, 0]]}
    hf = {"system": "hf", "_outputs": [[1, 2, 3], [4, 5], [7]], "per_group_steps": [[3, None], [2, None], [1, None]]}
    assert _acceptance_on_identical_texts(ours, vllm) == {"num_prompts": 2, "anydraft": (4 + 3) / 3, "peer": (3 + 4) / 4}
    assert _acceptance_on_identical_texts(ours, hf) == {"num_prompts": 2, "anydraft": (5 + 3) / 3, "peer": 5 / 5}


FAKE_VLLM_WORKER = """#!{python}
import json, sys
job = json.loads(sys.stdin.readline())
with open({jobs!r}, "a") as f:
    f.write(json.dumps(job) + "\\n")
startup = 5.0 if job["enforce_eager"] else 70.0
print("ANYDRAFT_READY " + json.dumps({{"startup_seconds": startup, "vllm_version": "fake"}}), flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        break
    request = json.loads(line)
    n = request["max_tokens"]
    k = job["k"] if job["draft"] else 0
    print("ANYDRAFT_RESULT " + json.dumps({{"output_target_ids": [[1] * n for _ in request["prompt_target_ids"]], "seconds": 0.01 if job["enforce_eager"] else
           0.005, "drafts": n // 2 if k else 0, "accepted": n // 2 if k else 0, "per_position": [1] * k}}), flush=True)
"""


def test_vllm_compiled_rows_are_the_headline_and_eager_rows_extra(ckpts, tmp_path):
    """A stand-in vLLM interpreter (the worker protocol only) records the jobs: compiled (vLLM's default) and
    eager workers, both at the bench's thread count; each mode's speedup is against its own target alone."""
    jobs = tmp_path / "jobs.jsonl"
    fake = tmp_path / "fake-vllm-python"
    fake.write_text(FAKE_VLLM_WORKER.format(python=sys.executable, jobs=str(jobs)))
    os.chmod(fake, 0o755)
    result = run_bench(_config(ckpts, same_vocab_draft=None, sweep_ks=[], peers=("vllm",), vllm_python=str(fake)))
    names = [r["name"] for r in result["runs"]]
    assert names[2:] == ["vLLM target alone", "vLLM TLI", "vLLM target alone (eager)", "vLLM TLI (eager)"]
    recorded = [json.loads(line) for line in jobs.read_text().splitlines()]
    assert [j["enforce_eager"] for j in recorded] == [False, False, True, True]
    assert {j["threads"] for j in recorded} == {1}
    runs = {r["name"]: r for r in result["runs"]}
    assert runs["vLLM TLI"]["speedup_vs_target_alone"] == pytest.approx(1.0)            # same fake speed per mode
    assert runs["vLLM TLI (eager)"]["speedup_vs_target_alone"] == pytest.approx(1.0)
    assert runs["vLLM target alone"]["startup_seconds"] == 70.0
    assert {row["name"] for row in result["roofline"]["target_alone"]} == {
        "anydraft target alone", "vLLM target alone", "vLLM target alone (eager)"}
    table = markdown_table(result)
    assert "Startup (not in any timing): vLLM target alone 70 s" in table and "vLLM TLI (eager)" in table
