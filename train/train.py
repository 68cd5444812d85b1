"""Train the embedded model family: three targets and three drafts on GSM8K, on CPU.

    models/qwen3-target    Qwen3ForCausalLM    qwen3 tokenizer        (151936 vocab rows, 151669 tokens)
    models/qwen3-draft     Qwen3ForCausalLM    qwen3 tokenizer
    models/smollm2-target  LlamaForCausalLM    smollm2 tokenizer      (49152 vocab rows)
    models/smollm2-draft   LlamaForCausalLM    smollm2 tokenizer
    models/mistral-target  MistralForCausalLM  mistral_v0.1 tokenizer (32000 rows; SentencePiece, byte fallback)
    models/mistral-draft   MistralForCausalLM  mistral_v0.1 tokenizer

Pairs used for verification (vocabularies differ in both directions; byte-level BPE with SentencePiece):
    qwen3-target   + smollm2-draft        smollm2-target + qwen3-draft
    qwen3-target   + mistral-draft        mistral-target + qwen3-draft   (and mistral-target + smollm2-draft)

Exact commands (run from the repository root; every stage is seeded and resumable: rerunning a
command continues from runs/<name>/ckpt.pt; CI never runs this):

    python train/train.py train qwen3-target --threads 1             # stage 1 (these two ran side by
    python train/train.py train smollm2-target --threads 1           #   side: 1260 s and 1191 s)
    python train/train.py distill qwen3-target --threads 1           # stage 2: greedy answers to 1024
    python train/train.py distill smollm2-target --threads 1         #   train questions (147 s, 101 s)
    python train/train.py train smollm2-draft --distill qwen3-target --threads 1   # stage 3 (671 s,
    python train/train.py train qwen3-draft --distill smollm2-target --threads 1   #   705 s, side by side)
    python train/train.py grow smollm2-target --threads 1            # stage 4: 10 -> 15 layers (123 s)
    python train/train.py train mistral-target --threads 1           # stage 5 (side by side, see
    python train/train.py train mistral-draft --distill qwen3-target --threads 1   #   train/README.md)
    python train/train.py eval --threads 1                           # perplexity, samples, proxy AL, latency

Or everything in order: `bash train/run_all.sh` (logs in runs/). Wall times measured on the 2-core
build machine (shared with other jobs, so they vary) are in train/README.md.

Design
- Text: "Question: {question}\nAnswer: {answer}" + the tokenizer's EOS token (qwen3: <|im_end|>,
  smollm2: <|endoftext|>, mistral: </s>), encoded as each tokenizer encodes by default: no BOS for qwen3
  and smollm2 (their tokenizers add none), <s> first for mistral (its post-processor prepends it, so the
  engine, transformers and vLLM all feed it). One example per row, rows bucketed by length, loss on
  every token.
- Compact vocabulary: only the ids that occur in the training text (+ EOS) get a trainable row. All
  other rows of the exported embedding (tied with the output head) are exactly zero, so their logit is
  exactly 0; the training loss accounts for them in closed form: logsumexp over
  [compact logits, log(n_zero)] where n_zero = tokenizer size - compact size. Padding rows past the
  tokenizer size are excluded (they are masked to -inf at inference). The zero rows compress to almost
  nothing in git while the checkpoint stays a standard HF checkpoint.
- Sizes: decode at batch 1 on CPU is dominated by per-layer overhead, so the targets are deep and
  narrow (>= 4x a draft's per-token latency) and the drafts have 1 layer. smollm2-target was trained
  with 10 layers, then grown to 15 (see cmd_grow) when 10 measured only 3.8-4.8x qwen3-draft;
  mistral-target (a 32000-row head, cheaper than smollm2's) was trained with 14 layers from the start.
- Drafts are distilled: trained on the original data mixed with a target's greedy answers to train
  questions, re-tokenized with the draft's tokenizer (DISTILLED_FROM: always another family's target).
- bf16 autocast (AMX) with fp32 master weights, AdamW, cosine schedule; weights exported in bf16.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from family import (DATA, MODELS, RUNS, SEED, SPECS, TARGETS, TOKENIZER_FILES, TOKENIZERS, collate,  # train/family.py
                    compact_vocab, encode, greedy_generate, load_jsonl, load_shipped, make_batches, model_config,
                    prompt_text, tokenizer, training_docs)
from anydraft.model.llama import CausalLM


def init_weights(model: CausalLM, num_layers):
    g = torch.Generator().manual_seed(SEED)
    for n, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * num_layers) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)



def set_cosine_lr(opt, base_lr: float, step: int, warmup: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to 10% of base_lr; sets it on every param group."""
    lr = base_lr * (step + 1) / warmup if step < warmup else \
        base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))
    for group in opt.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(model, opt, loss) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def make_optimizer(model, lr: float):
    """AdamW with weight decay on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=0.1), dict(params=no_decay, weight_decay=0.0)],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def resume(run, model, opt, label: str):
    """(checkpoint path, step, elapsed seconds): from run/ckpt.pt when a previous run left one, else zeros."""
    run.mkdir(parents=True, exist_ok=True)
    ckpt_path = run / "ckpt.pt"
    step, t_prev = 0, 0.0
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, t_prev = ck["step"], ck.get("elapsed", 0.0)
        print(f"{label}: resumed at step {step}", flush=True)
    return ckpt_path, step, t_prev


def save_checkpoint(run, ckpt_path, model, opt, step: int, elapsed: float) -> None:
    """Atomic: a run killed mid-save resumes from the previous checkpoint."""
    tmp = run / "ckpt.tmp"
    torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step, elapsed=elapsed), tmp)
    os.replace(tmp, ckpt_path)

def compact_loss(model, hidden, targets, valid, log_n_zero):
    """Mean NLL over valid positions; the zero-logit rows enter the normalizer in closed form."""
    h = hidden[valid]
    logits = model.logits(h).float()
    lse = torch.logaddexp(torch.logsumexp(logits, -1), torch.tensor(log_n_zero))
    return (lse - logits.gather(-1, targets[valid][:, None])[:, 0]).mean()


def cmd_train(args):
    torch.set_num_threads(args.threads)
    name, spec = args.name, SPECS[args.name]
    torch.manual_seed(SEED)
    tok = tokenizer(spec["tok"])
    used = compact_vocab(spec["tok"])
    n_tok = tok.get_vocab_size()
    log_n_zero = math.log(n_tok - len(used))
    remap = torch.full((spec["rows"],), -1, dtype=torch.long)
    remap[torch.tensor(used)] = torch.arange(len(used))
    docs = training_docs(name, args.distill)
    cfg = model_config(spec, len(used), None, None)
    model = CausalLM(cfg)
    init_weights(model, spec["layers"])
    opt = make_optimizer(model, spec["lr"])
    steps = args.steps or spec["steps"]
    warmup = 30
    run = RUNS / name
    ckpt_path, step, t_prev = resume(run, model, opt, name)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {cfg.num_hidden_layers}L h{cfg.hidden_size} compact vocab {len(used)}/{n_tok}, "
          f"{n_params/1e6:.2f}M trained params, {len(docs)} docs, {steps} steps", flush=True)
    batches_per_epoch = len(make_batches(docs, 0, spec["batch"]))
    t0 = time.time()
    tokens = 0
    model.train()
    stop = min(args.stop_at or steps, steps)
    while step < stop:
        epoch, pos = divmod(step, batches_per_epoch)
        idx = make_batches(docs, epoch, spec["batch"])[pos]
        ids, mask = collate(docs, idx, remap)
        lr = set_cosine_lr(opt, spec["lr"], step, warmup, steps)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model(ids[:, :-1])
            loss = compact_loss(model, hidden, ids[:, 1:], mask[:, 1:], log_n_zero)
        optimizer_step(model, opt, loss)
        step += 1
        tokens += int(mask.sum())
        if step % 10 == 0 or step == stop:
            el = time.time() - t0
            print(f"{name} step {step}/{steps} ep {epoch} loss {loss.item():.4f} lr {lr:.2e} "
                  f"{tokens/el:.0f} tok/s elapsed {t_prev+el:.0f}s", flush=True)
        if step % 25 == 0 or step == stop:
            save_checkpoint(run, ckpt_path, model, opt, step, t_prev + time.time() - t0)
    export(name, model, used, tok)
    print(f"{name}: done, total training wall time {t_prev + time.time() - t0:.0f}s", flush=True)


def export(name, model, used, tok, spec=None):
    """Scatter the compact rows into the full-size embedding (zeros elsewhere); write a HF checkpoint."""
    from safetensors.torch import save_file
    spec = spec or SPECS[name]
    eos_id = tok.token_to_id(spec["eos"])
    bos_id = tok.token_to_id(spec["bos"]) if spec["bos"] else None
    cfg = model_config(spec, spec["rows"], eos_id, bos_id)
    sd = {k: v.detach().float() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    full = torch.zeros(spec["rows"], cfg.hidden_size)
    full[torch.tensor(used)] = sd["model.embed_tokens.weight"]
    sd["model.embed_tokens.weight"] = full
    out = MODELS / name
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sorted(sd.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    gen = dict(bos_token_id=bos_id, eos_token_id=eos_id, do_sample=False)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    src = TOKENIZERS / spec["tok"]
    for f in sorted(src.iterdir()):
        if f.name in TOKENIZER_FILES or f.name.startswith("LICENSE") or f.name == "SOURCE.txt":
            (out / f.name).write_bytes(f.read_bytes())
    print(f"exported {out}", flush=True)


def cmd_grow(args):
    """Depth growth of a trained target (smollm2-target: 10 -> 15 layers), then a short fine-tune.

    Why: at batch 1 on CPU a decode step costs mostly per-layer overhead, and the 10-layer
    smollm2-target measured only 3.8-4.8x its 1-layer draft (qwen3-draft) depending on threads.
    A new layer after every second trained layer starts as an exact identity (o_proj and down_proj
    zero: the residual branch adds nothing), so the grown model computes the same function at step 0;
    then all layers are fine-tuned on the training data (a fresh batch order) at a low learning rate.
    qwen3-draft was distilled from the 10-layer model's answers (the fine-tune changes them little).
    """
    torch.set_num_threads(args.threads)
    name = args.name
    base_spec = SPECS[name]
    g = base_spec["grow"]
    spec = dict(base_spec, layers=g["layers"])
    torch.manual_seed(SEED + 1)
    tok = tokenizer(spec["tok"])
    used = compact_vocab(spec["tok"])
    log_n_zero = math.log(tok.get_vocab_size() - len(used))
    remap = torch.full((spec["rows"],), -1, dtype=torch.long)
    remap[torch.tensor(used)] = torch.arange(len(used))
    docs = training_docs(name, None)
    base = CausalLM(model_config(base_spec, len(used), None, None))
    base.load_state_dict(torch.load(RUNS / name / "ckpt.pt", weights_only=False)["model"])
    model = CausalLM(model_config(spec, len(used), None, None))
    init_weights(model, spec["layers"])
    n_new = spec["layers"] - base_spec["layers"]
    every = base_spec["layers"] // n_new
    order, k = [], 0               # index of the base layer, or None for a new one
    for i in range(base_spec["layers"]):
        order.append(i)
        if (i + 1) % every == 0 and k < n_new:
            order.append(None)
            k += 1
    assert len(order) == spec["layers"]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(base.model.embed_tokens.weight)
        model.model.norm.weight.copy_(base.model.norm.weight)
        for j, i in enumerate(order):
            if i is None:
                model.model.layers[j].self_attn.o_proj.weight.zero_()
                model.model.layers[j].mlp.down_proj.weight.zero_()
            else:
                model.model.layers[j].load_state_dict(base.model.layers[i].state_dict())
        probe = torch.tensor([docs[0][:64]]).apply_(lambda i: int(remap[i]))
        diff = (model.logits(model(probe)) - base.logits(base(probe))).abs().max().item()
    assert diff < 1e-4, f"grown model is not the identity at init: {diff}"
    opt = make_optimizer(model, g["lr"])
    steps, warmup = g["steps"], 10
    run = RUNS / f"{name}-grow"
    ckpt_path, step, t_prev = resume(run, model, opt, f"{name} grow")
    print(f"{name} grow: {base_spec['layers']} -> {spec['layers']} layers (new at {[j for j, i in enumerate(order) if i is None]}), "
          f"identity check {diff:.1e}, {steps} steps", flush=True)
    batches_per_epoch = len(make_batches(docs, 0, spec["batch"]))
    t0, tokens = time.time(), 0
    model.train()
    while step < steps:
        epoch, pos = divmod(step, batches_per_epoch)
        idx = make_batches(docs, 1 + epoch, spec["batch"])[pos]     # a batch order the base run never used
        ids, mask = collate(docs, idx, remap)
        lr = set_cosine_lr(opt, g["lr"], step, warmup, steps)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compact_loss(model, model(ids[:, :-1]), ids[:, 1:], mask[:, 1:], log_n_zero)
        optimizer_step(model, opt, loss)
        step += 1
        tokens += int(mask.sum())
        if step % 10 == 0 or step == steps:
            el = time.time() - t0
            print(f"{name} grow step {step}/{steps} loss {loss.item():.4f} lr {lr:.2e} {tokens/el:.0f} tok/s "
                  f"elapsed {t_prev+el:.0f}s", flush=True)
        if step % 25 == 0 or step == steps:
            save_checkpoint(run, ckpt_path, model, opt, step, t_prev + time.time() - t0)
    export(name, model, used, tok, spec)
    print(f"{name} grow: done, wall time {t_prev + time.time() - t0:.0f}s", flush=True)


def cmd_distill(args):
    """Greedy answers of a target to the first N train questions -> runs/distill/<target>.jsonl."""
    torch.set_num_threads(args.threads)
    name, spec = args.name, SPECS[args.name]
    out = RUNS / "distill" / f"{name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = load_jsonl(out) if out.exists() else []
    rows = load_jsonl(DATA / "train.jsonl")[:args.n]
    model, cfg = load_shipped(name, torch.bfloat16)
    tok = tokenizer(spec["tok"])
    eos = tok.token_to_id(spec["eos"])
    t0 = time.time()
    with open(out, "a") as f:
        for b0 in range(len(done), len(rows), 256):   # resumable in blocks of 256 questions
            block = rows[b0:b0 + 256]
            prompts = encode(spec, tok, [prompt_text(r["question"]) for r in block])
            gens = greedy_generate(model, cfg, prompts, args.max_new, eos, tok.get_vocab_size())
            for r, g in zip(block, gens):
                ended = bool(g) and g[-1] == eos
                text = tok.decode([i for i in g if i != eos], skip_special_tokens=False)
                f.write(json.dumps(dict(question=r["question"], completion=text, ended=ended)) + "\n")
            f.flush()
            print(f"{name}: {b0 + len(block)} distilled, {time.time() - t0:.0f}s", flush=True)


def cmd_eval(args):
    """Perplexity on GSM8K test answers, sample continuations, proxy acceptance, decode latency."""
    from eval_models import main as eval_main   # train/eval_models.py
    eval_main(args)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("name", choices=sorted(SPECS))
    t.add_argument("--distill", choices=TARGETS, help="also train on this target's greedy answers")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--stop-at", type=int, default=None,
                   help="export at this step of the --steps schedule (its learning rate not yet at the end)")
    t.add_argument("--threads", type=int, default=2)
    d = sub.add_parser("distill")
    d.add_argument("name", choices=TARGETS)
    d.add_argument("--n", type=int, default=1024)
    d.add_argument("--max-new", type=int, default=200)
    d.add_argument("--threads", type=int, default=2)
    gr = sub.add_parser("grow")
    gr.add_argument("name", choices=sorted(n for n, s in SPECS.items() if "grow" in s))
    gr.add_argument("--threads", type=int, default=1)
    e = sub.add_parser("eval")
    # 1 thread: with 2 OpenMP threads on 2 cores shared with other jobs, every parallel region can wait
    # a whole scheduler slice at its barrier (measured: ~30x slower decode)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--n", type=int, default=100, help="test questions for the proxy acceptance")
    e.add_argument("--ppl-n", type=int, default=400, help="test questions for perplexity")
    e.add_argument("--out", default=str(RUNS / "eval.json"))
    e.add_argument("--only", default=None, help="only the models whose name contains this (and their pairs)")
    args = ap.parse_args()
    {"train": cmd_train, "distill": cmd_distill, "grow": cmd_grow, "eval": cmd_eval}[args.cmd](args)


if __name__ == "__main__":
    main()
