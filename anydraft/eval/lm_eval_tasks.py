"""lm-eval (EleutherAI's harness) against an OpenAI-compatible server on GSM8K questions from a local file: two tasks
written as YAML + JSON lines (no hub), a generate task (0-shot, exact match on the `#### number`) and a loglikelihood
task (multiple choice over each question's true answer and two wrong ones), and the harness's run over them.

The server test (tests/server/test_lm_eval_client.py) and bench/lm_eval_check.py compare what lm-eval reads through
speculation with what it reads from the target alone.
"""
from __future__ import annotations

import json
from pathlib import Path

GENERATE_TASK = "anydraft_gsm8k_generate"
CHOICE_TASK = "anydraft_gsm8k_choice"


def write_tasks(directory: Path, gsm8k_jsonl: Path, num_questions: int, max_gen_toks: int) -> None:
    """Both tasks over the file's first num_questions questions, into `directory` (lm-eval's include_path)."""
    rows = [json.loads(line) for line in Path(gsm8k_jsonl).read_text().splitlines()[:num_questions]]
    data = Path(directory) / "gsm8k_local.jsonl"
    with data.open("w") as f:
        for row in rows:
            number = row["answer"].split("####")[-1].strip()
            value = int(number.replace(",", ""))
            f.write(json.dumps({"question": row["question"], "number": number,
                                "choices": [number, str(value + 1), str(value * 2 + 3)], "label": 0}) + "\n")
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              "doc_to_text: \"Question: {{question}}\\nAnswer:\"\n")
    (Path(directory) / "generate.yaml").write_text(
        f"task: {GENERATE_TASK}\n" + common +
        "output_type: generate_until\ndoc_to_target: \"{{number}}\"\n"
        f"generation_kwargs:\n  until: [\"\\nQuestion:\"]\n  max_gen_toks: {max_gen_toks}\n  do_sample: false\n"
        "  temperature: 0\n"
        "filter_list:\n  - name: number\n    filter:\n"
        "      - function: regex\n        regex_pattern: \"#### (\\\\-?[0-9\\\\.\\\\,]+)\"\n"
        "      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n")
    (Path(directory) / "choice.yaml").write_text(
        f"task: {CHOICE_TASK}\n" + common +
        "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
        "target_delimiter: \" #### \"\nmetric_list:\n  - metric: acc\n")


def evaluate(base_url: str, task_dir: Path, tokenizer_dir: Path, model: str = "qwen3-target") -> dict:
    """lm-eval's `local-completions` model over both tasks against the server at base_url (samples logged).
    Set HF_HUB_OFFLINE / HF_DATASETS_OFFLINE in the environment: the tasks read only local files."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    model_args = {"model": model, "base_url": f"{base_url}/v1/completions", "tokenizer_backend": "huggingface",
                  "tokenizer": str(tokenizer_dir), "num_concurrent": 1, "max_retries": 1, "timeout": 600}
    return lm_eval.simple_evaluate(model="local-completions", model_args=model_args,
                                   tasks=[GENERATE_TASK, CHOICE_TASK],
                                   task_manager=TaskManager(include_path=str(task_dir)), log_samples=True)


def samples_by_doc(result: dict, task: str) -> list[dict]:
    return sorted(result["samples"][task], key=lambda s: s["doc_id"])


def compare(spec: dict, alone: dict) -> dict:
    """What lm-eval read through speculation against the target alone: per-question generate outputs, exact-match
    scores, and the largest per-item log-likelihood difference."""
    spec_gen, alone_gen = samples_by_doc(spec, GENERATE_TASK), samples_by_doc(alone, GENERATE_TASK)
    outputs = [(s["resps"][0][0], a["resps"][0][0]) for s, a in zip(spec_gen, alone_gen)]
    spec_ll = [float(r[0][0]) for s in samples_by_doc(spec, CHOICE_TASK) for r in s["resps"]]
    alone_ll = [float(r[0][0]) for s in samples_by_doc(alone, CHOICE_TASK) for r in s["resps"]]
    score = "exact_match,number"
    return {"questions": len(outputs), "same_outputs": sum(x == y for x, y in outputs),
            "different_questions": [i for i, (x, y) in enumerate(outputs) if x != y],
            "exact_match": spec["results"][GENERATE_TASK][score],
            "exact_match_target_alone": alone["results"][GENERATE_TASK][score],
            "loglikelihood_items": len(spec_ll),
            "loglikelihood_max_difference": max((abs(x - y) for x, y in zip(spec_ll, alone_ll)), default=0.0)}
