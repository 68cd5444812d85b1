"""EleutherAI's lm-eval harness as a client: its `local-completions` model against a live `anydraft serve` on
127.0.0.1 (the shipped pair, bf16, speculation on) and against `--draft none`, on two tasks written to local files (no
hub): a GSM8K generate task (0-shot, exact match on the number) and a loglikelihood task (multiple choice over each
question's true answer and two wrong ones). The per-question outputs and per-item log-likelihoods must agree."""
from __future__ import annotations

import os

import pytest

from anydraft.eval import lm_eval_tasks
from anydraft.eval.lm_eval_tasks import CHOICE_TASK, GENERATE_TASK
from conftest import REPO_ROOT, SHIPPED_DTYPE_ARGS, start_server, stop_server
from tiny_models import GSM8K_TEST

NUM_QUESTIONS = 8
MAX_GEN_TOKS = 96
LOGLIKELIHOOD_TOLERANCE = 1e-4   # the bound for bf16 (the native kernels make them equal exactly)


def evaluate(server, task_dir) -> dict:
    return lm_eval_tasks.evaluate(server.base_url, task_dir, REPO_ROOT / "models" / "qwen3-target")


@pytest.fixture(scope="module")
def results(tmp_path_factory, shipped_server):
    """lm-eval's results through the server with the default draft and through the target alone."""
    task_dir = tmp_path_factory.mktemp("lm_eval_tasks")
    lm_eval_tasks.write_tasks(task_dir, GSM8K_TEST, NUM_QUESTIONS, MAX_GEN_TOKS)
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      HF_DATASETS_CACHE=str(tmp_path_factory.mktemp("hf_datasets")))
    alone = start_server(["--draft", "none", "--max-num-seqs", "4", *SHIPPED_DTYPE_ARGS],
                         tmp_path_factory.mktemp("logs") / "alone.log")
    try:
        return evaluate(shipped_server, task_dir), evaluate(alone, task_dir)
    finally:
        stop_server(alone)


def test_generate_task_gives_the_target_alones_outputs_and_score(results, shipped_server):
    spec, alone = results
    spec_samples, alone_samples = (lm_eval_tasks.samples_by_doc(r, GENERATE_TASK) for r in results)
    assert len(spec_samples) == len(alone_samples) == NUM_QUESTIONS
    outputs = [s["resps"][0][0] for s in spec_samples]
    assert outputs == [s["resps"][0][0] for s in alone_samples]
    assert all(o.strip() for o in outputs)   # the shipped target answers: not empty text
    score = spec["results"][GENERATE_TASK]["exact_match,number"]
    assert score == alone["results"][GENERATE_TASK]["exact_match,number"]
    print(f"\n[lm-eval] generate: exact match {score:.3f} through speculation and the target alone")
    extracted = [s["filtered_resps"][0] for s in spec_samples]
    assert sum(e != "[invalid]" for e in extracted) >= NUM_QUESTIONS // 2, extracted   # the filter read the answers
    assert shipped_server.metric("anydraft:spec_decode_num_accepted_tokens_total") > 0   # speculation ran


def test_loglikelihood_task_gives_the_target_alones_values(results):
    spec_samples, alone_samples = (lm_eval_tasks.samples_by_doc(r, CHOICE_TASK) for r in results)
    spec_values = [float(resp[0][0]) for s in spec_samples for resp in s["resps"]]
    alone_values = [float(resp[0][0]) for s in alone_samples for resp in s["resps"]]
    assert len(spec_values) == len(alone_values) == 3 * NUM_QUESTIONS
    assert all(v < 0 for v in spec_values)   # real log-likelihoods of non-empty continuations
    worst = max(abs(a - b) for a, b in zip(spec_values, alone_values))
    print(f"\n[lm-eval] loglikelihood: largest difference {worst:.3g} over {len(spec_values)} items")
    assert worst <= LOGLIKELIHOOD_TOLERANCE
