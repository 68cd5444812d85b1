"""A full-vocabulary variant of a reduced-vocabulary speculators drafter: the same trained body, the target's
own output head (left out of the checkpoint: shared at load), no d2t / t2d tables.

    python train/full_vocab_variant.py models/qwen3-eagle3 models/qwen3-eagle3-full

No retraining: the reduced head started as the target's rows at t2d and was fine-tuned from there, so the body
already writes hidden states the target's head reads; AL is measured, not assumed (train/README.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main():
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((source / "config.json").read_text())
    config["draft_vocab_size"] = config["transformer_layer_config"]["vocab_size"]
    tensors = load_file(str(source / "model.safetensors"))
    state = {k: v for k, v in tensors.items() if k not in ("lm_head.weight", "d2t", "t2d")}
    if "markov_head.markov_w2.weight" in state:
        # DSpark's Markov bias writes onto the head rows: its rows move to their target ids, zero elsewhere (the
        # same bias on the same tokens, none on the others; the zero rows cost nothing packed).
        reduced = state["markov_head.markov_w2.weight"]
        full = torch.zeros(config["draft_vocab_size"], reduced.shape[1], dtype=reduced.dtype)
        full[torch.arange(len(tensors["d2t"])) + tensors["d2t"]] = reduced
        state["markov_head.markov_w2.weight"] = full
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out / "model.safetensors"))
    (out / "SOURCE.txt").write_text(f"Made by train/full_vocab_variant.py from {source.name}: the same body, the "
                                    f"target's own head (shared at load), no d2t/t2d.\n")
    print(f"{out}: {sorted(state)}")


if __name__ == "__main__":
    main()
