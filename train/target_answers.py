"""The target's own greedy answers to GSM8K train questions (.jsonl of question/answer): the text a drafter
reads at inference, for train_eagle3.py --target-answers.

    python train/target_answers.py --target models/qwen3-target --num 2048 --out runs/qwen3-target-answers.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.config import SamplingParams  # noqa: E402
from anydraft.llm import LLM  # noqa: E402

DATA = Path("/work/shared/data/gsm8k")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--num", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    questions = [json.loads(line)["question"] for line in open(DATA / "train.jsonl")][:args.num]
    llm = LLM(model=args.target, dtype="bfloat16", device="cpu", max_num_seqs=32, max_model_len=512)
    start = time.time()
    outputs = llm.generate([f"Question: {q}\nAnswer:" for q in questions],
                           SamplingParams(temperature=0, max_tokens=args.max_tokens))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for question, output in zip(questions, outputs):
            f.write(json.dumps({"question": question, "answer": output.outputs[0].text.strip()}) + "\n")
    print(f"{len(questions)} answers in {time.time() - start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
