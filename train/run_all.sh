#!/usr/bin/env bash
# Retrain the whole embedded model family from scratch (see train/train.py and train/README.md).
# Two stages run side by side with one thread each (the build machine has 2 cores). Resumable: rerun
# after an interruption and every stage continues from its checkpoint under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs/logs
both() {  # run two commands (separated by ::) in parallel, fail if either fails
  local i
  for ((i = 1; i <= $#; i++)); do [[ ${!i} == "::" ]] && break; done
  "${@:1:i-1}" > "runs/logs/$LOG1.log" 2>&1 & p1=$!
  "${@:i+1}" > "runs/logs/$LOG2.log" 2>&1 & p2=$!
  wait $p1; wait $p2
}
LOG1=qwen3-target LOG2=smollm2-target both \
  python train/train.py train qwen3-target --threads 1 :: \
  python train/train.py train smollm2-target --threads 1
LOG1=distill-qwen3-target LOG2=distill-smollm2-target both \
  python train/train.py distill qwen3-target --threads 1 :: \
  python train/train.py distill smollm2-target --threads 1
LOG1=smollm2-draft LOG2=qwen3-draft both \
  python train/train.py train smollm2-draft --distill qwen3-target --threads 1 :: \
  python train/train.py train qwen3-draft --distill smollm2-target --threads 1
# smollm2-target: 10 -> 15 layers after the drafts (qwen3-draft was distilled from the 10-layer model)
python train/train.py grow smollm2-target --threads 1 > runs/logs/smollm2-target-grow.log 2>&1
# the SentencePiece family: mistral-draft is distilled from qwen3-target's answers (stage 2), so both train at once
LOG1=mistral-target LOG2=mistral-draft both \
  python train/train.py train mistral-target --threads 1 :: \
  python train/train.py train mistral-draft --distill qwen3-target --threads 1
# smollm2-draft, the default draft: fitted to qwen3-target's sampled distribution at T 0.7 (docs/distillation.md)
python -m anydraft distill --target qwen3-target --draft models/smollm2-draft --corpus ../shared/data/gsm8k/train.jsonl \
  --out runs/smollm2-draft-t07 --steps 300 --num-prompts 512 --held-out 32 --batch-size 8 --lr 5e-4 --eval-every 50 \
  --json > runs/logs/smollm2-draft-distill.json && cp runs/smollm2-draft-t07/{model.safetensors,distill.json} models/smollm2-draft/
# qwen3-draft (for smollm2-target) and mistral-draft (for qwen3-target), fitted the same way, side by side
distill_draft() {  # TARGET DRAFT: 200 steps, 384 continuations, into models/DRAFT
  python -m anydraft distill --target "$1" --draft "models/$2" --corpus ../shared/data/gsm8k/train.jsonl \
    --out "runs/$2-t07" --steps 200 --num-prompts 384 --held-out 32 --batch-size 8 --lr 5e-4 --eval-every 50 \
    --threads 1 --json && cp "runs/$2-t07"/{model.safetensors,distill.json} "models/$2/"
}
LOG1=qwen3-draft-distill LOG2=mistral-draft-distill both \
  distill_draft smollm2-target qwen3-draft :: distill_draft qwen3-target mistral-draft
python train/train.py eval --threads 1 | tee runs/logs/eval.log
