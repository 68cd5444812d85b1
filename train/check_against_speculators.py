"""Our EAGLE-3 module against the speculators package's own model forward, on the same checkpoint and inputs.

Run with a Python that has `speculators` installed (its own venv: it pins transformers and pulls datasets):

    /path/to/venv/bin/python train/check_against_speculators.py --draft models/qwen3-eagle3 --target models/qwen3-target

Inputs: a GSM8K prompt through the target (its aux-layer states, float32); the draft's first pass over every
entry (speculators' TTT step 0) and one chained step at an entry (TTT step 1: the draft's own output carried,
the next token given), compared as logits. speculators numbers positions from 1 and we from 0; rotary
attention depends only on differences, so the two agree up to float rounding.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.model.kv_cache import KVCache  # noqa: E402
from anydraft.model.loader import load_model  # noqa: E402
from anydraft.model.speculators_loader import load_speculators_draft  # noqa: E402
from anydraft.tokenizer import Tokenizer  # noqa: E402


def speculators_logits(draft_path: Path, states: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    from speculators.models.eagle3 import Eagle3DraftModel
    model = Eagle3DraftModel.from_pretrained(str(draft_path), torch_dtype=torch.float32).float().eval()
    # Weights the checkpoint leaves out come from the verifier (speculators' load_verifier_weights). With the
    # transformers this venv has, from_pretrained leaves them uninitialized rather than NaN, which that
    # method's NaN test misses: put the verifier's in explicitly.
    names = set(load_file(str(draft_path / "model.safetensors")))
    verifier = load_file(str(Path(model.config.speculators_config.verifier.name_or_path) / "model.safetensors"))
    embed = verifier.get("model.embed_tokens.weight")
    head = verifier.get("lm_head.weight", embed)
    if "embed_tokens.weight" not in names:
        model.embed_tokens.weight.data.copy_(embed.float())
    if "lm_head.weight" not in names:
        t2d = getattr(model, "t2d", None)
        model.lm_head.weight.data.copy_((head if t2d is None else head[t2d.bool()]).float())
    model.config.transformer_layer_config._attn_implementation = "eager"
    model._attn_impl = "eager"
    from speculators.models.attention import create_float_mask
    model._create_mask_fn = create_float_mask
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    captured = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: captured.append(out.detach()))
    with torch.no_grad():
        model(hidden_states=states, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=2)
    hook.remove()
    return captured   # [1, S, N] per TTT step


def our_logits(draft_path: Path, target, states: torch.Tensor, ids: torch.Tensor):
    draft = load_speculators_draft(draft_path, target, target.lm_head.weight, torch.float32, torch.device("cpu"))
    module = draft.module
    cfg = module.cfg
    seq_len = ids.shape[1]
    cache = KVCache(cfg.num_hidden_layers, 1, seq_len + 4, cfg.num_key_value_heads, cfg.head_dim, torch.float32, "cpu")
    with torch.no_grad():
        hidden = module.fuse_target_states(states)
        out0 = module(ids, hidden, cache, cache.window([0], seq_len))
        cache.advance([0], seq_len)
        step0 = module.logits(out0)
        # TTT step 1 at entry S-2: token ids[S-1], the draft's own output at S-2, after entries 0..S-2 only
        cache.truncate(0, seq_len - 1)
        out1 = module(ids[:, -1:], out0[:, -2:-1], cache, cache.window([0], 1))
        step1 = module.logits(out1)
    return step0, step1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--draft", required=True, type=Path)
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    target, _ = load_model(args.target, torch.float32, torch.device("cpu"))
    tokenizer = Tokenizer.from_dir(args.target)
    question = json.loads(open("/work/shared/data/gsm8k/test.jsonl").readline())["question"]
    target_ids = torch.tensor([tokenizer.encode(f"Question: {question}\nAnswer:")])
    config = json.loads((args.draft / "config.json").read_text())
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    with torch.no_grad():
        _, states = target(target_ids, capture_layers=aux)
    ids, states = target_ids[:, 1:], states[:, :-1]          # entry j: token x_j with the states of x_{j-1}
    theirs = speculators_logits(args.draft, states, ids)
    step0, step1 = our_logits(args.draft, target, states, ids)
    ref0, ref1 = theirs[0][0], theirs[1][0, -2]
    result = {
        "draft": str(args.draft), "entries": int(ids.shape[1]),
        "step0_max_abs_diff": float((step0[0] - ref0).abs().max()),
        "step0_logit_scale": float(ref0.abs().max()),
        "step0_argmax_equal": int((step0[0].argmax(-1) == ref0.argmax(-1)).sum()),
        "step1_max_abs_diff": float((step1[0, 0] - ref1).abs().max()),
        "step1_argmax_equal": bool(step1[0, 0].argmax() == ref1.argmax()),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
