"""The embedded model family's specification and data: names, shapes, tokenizers, training text, loading.

Shared by train/train.py (training, growth, export) and train/eval_models.py (the quality report).
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anydraft.model.config import ModelConfig  # noqa: E402
from anydraft.model.kv_cache import KVCache  # noqa: E402
from anydraft.model.llama import CausalLM  # noqa: E402

DATA = Path(os.environ.get("ANYDRAFT_GSM8K", "/work/shared/data/gsm8k"))
TOKENIZERS = Path(os.environ.get("ANYDRAFT_TOKENIZERS", "/work/shared/tokenizers"))
RUNS = ROOT / "runs"
MODELS = ROOT / "models"
SEED = 1234

# copied verbatim from the shared tokenizer folder, with its LICENSE* and SOURCE.txt (mistral_v0.1's SOURCE.txt
# names tokenizer_config.orig.json, the config as published before tokenizer_class was changed)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer_config.orig.json")

# family -> architecture, tokenizer, vocab rows, special tokens. bos_in_text: the tokenizer's own encoding adds
# BOS (mistral's post-processor prepends <s>, so the engine, transformers and vLLM all feed it): train with it too.
FAMILIES = {
    "qwen3": dict(arch="Qwen3ForCausalLM", tok="qwen3", rows=151936, eos="<|im_end|>", bos=None, bos_in_text=False),
    "smollm2": dict(arch="LlamaForCausalLM", tok="smollm2", rows=49152, eos="<|endoftext|>", bos="<|endoftext|>",
                    bos_in_text=False),
    "mistral": dict(arch="MistralForCausalLM", tok="mistral_v0.1", rows=32000, eos="</s>", bos="<s>", bos_in_text=True),
}
TARGET_SHAPE = dict(hidden=192, layers=10, inter=512, heads=3, kv=1, steps=900, lr=2e-3, batch=1024)
DRAFT_SHAPE = dict(hidden=192, layers=1, inter=512, heads=3, kv=1, steps=1800, lr=3e-3, batch=1024)
# name -> family, shape, schedule
SPECS = {
    "qwen3-target": dict(FAMILIES["qwen3"], **TARGET_SHAPE),
    # then grown to 15 layers (identity-initialized layers, fine-tuned): see cmd_grow
    "smollm2-target": dict(FAMILIES["smollm2"], **TARGET_SHAPE, grow=dict(layers=15, steps=150, lr=6e-4)),
    # 14 layers from the start: its 32000-row head is cheap, so 10 layers cost < 4x a 1-layer draft
    "mistral-target": dict(FAMILIES["mistral"], **dict(TARGET_SHAPE, layers=14)),
    "qwen3-draft": dict(FAMILIES["qwen3"], **DRAFT_SHAPE),
    "smollm2-draft": dict(FAMILIES["smollm2"], **DRAFT_SHAPE),
    "mistral-draft": dict(FAMILIES["mistral"], **DRAFT_SHAPE),
}
TARGETS = sorted(n for n in SPECS if n.endswith("-target"))
# draft -> the target whose greedy answers it was distilled from (another family's: a cross-vocabulary pair).
# mistral-draft: from qwen3-target, the default target, so that qwen3-target + mistral-draft (byte-level BPE
# target, SentencePiece draft) drafts as well as qwen3-target + smollm2-draft; mistral-target's own pair
# uses qwen3-draft (distilled from smollm2-target).
DISTILLED_FROM = {"smollm2-draft": "qwen3-target", "qwen3-draft": "smollm2-target", "mistral-draft": "qwen3-target"}
# (target, draft) pairs the eval reports: every cross-family pair of a target with a draft
EVAL_PAIRS = [(t, d) for t in TARGETS for d in sorted(DISTILLED_FROM) if SPECS[t]["tok"] != SPECS[d]["tok"]]
HEAD_DIM = 64


def tokenizer(name):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(TOKENIZERS / name / "tokenizer.json"))


def prompt_text(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def doc_text(question: str, answer: str) -> str:
    return f"{prompt_text(question)} {answer}"


def encode(spec, tok, texts):
    """Token ids of texts as the model reads them: the tokenizer's encoding, without specials but the BOS
    that this family's tokenizer adds by default (bos_in_text)."""
    enc = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    if spec["bos_in_text"]:
        bos = tok.token_to_id(spec["bos"])
        enc = [[bos] + ids for ids in enc]
    return enc


def load_jsonl(path):
    return [json.loads(line) for line in open(path)]


def model_config(spec, vocab_rows, eos_id, bos_id) -> ModelConfig:
    return ModelConfig(architecture=spec["arch"], vocab_size=vocab_rows, hidden_size=spec["hidden"],
                       intermediate_size=spec["inter"], num_hidden_layers=spec["layers"],
                       num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"], head_dim=HEAD_DIM,
                       max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
                       tie_word_embeddings=True, qk_norm=spec["arch"] == "Qwen3ForCausalLM",
                       bos_token_id=bos_id, eos_token_id=eos_id)


def compact_vocab(tok_name):
    """Sorted ids occurring in the training text (+EOS): the rows that are trained."""
    path = RUNS / "data" / f"vocab-{tok_name}.json"
    if path.exists():
        return json.loads(path.read_text())
    tok = tokenizer(tok_name)
    rows = load_jsonl(DATA / "train.jsonl")
    spec = next(s for s in SPECS.values() if s["tok"] == tok_name)
    enc = encode(spec, tok, [doc_text(r["question"], r["answer"]) for r in rows])
    used = sorted(set(i for ids in enc for i in ids) | {tok.token_to_id(spec["eos"])})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(used))
    return used


def training_docs(name, distill_from):
    """Token-id lists (full ids, EOS-terminated) of every training document."""
    spec = SPECS[name]
    tok = tokenizer(spec["tok"])
    eos = tok.token_to_id(spec["eos"])
    texts = [doc_text(r["question"], r["answer"]) for r in load_jsonl(DATA / "train.jsonl")]
    ended = [True] * len(texts)
    if distill_from:
        # the paired target's greedy answers, re-tokenized by this draft's tokenizer, weighted 3x;
        # an answer cut at max_new tokens gets no EOS
        gen = load_jsonl(RUNS / "distill" / f"{distill_from}.jsonl")
        texts += [prompt_text(g["question"]) + g["completion"] for g in gen] * 3
        ended += [g["ended"] for g in gen] * 3
        print(f"{name}: {len(gen)} distilled examples from {distill_from} "
              f"({sum(g['ended'] for g in gen)} ended with EOS)", flush=True)
    enc = encode(spec, tok, texts)
    used = set(compact_vocab(spec["tok"]))
    docs, dropped = [], 0
    for e, end in zip(enc, ended):
        ids = e + [eos] if end else e
        if not all(i in used for i in ids):   # a distilled text with a token the data never had
            dropped += 1
            continue
        docs.append(ids)
    if dropped:
        print(f"{name}: dropped {dropped} documents with ids outside the compact vocabulary", flush=True)
    return docs


def make_batches(docs, epoch, tokens_per_batch):
    """Length-bucketed batches of <= tokens_per_batch padded tokens, shuffled per epoch (seeded)."""
    rng = random.Random(SEED * 1000 + epoch)
    order = sorted(range(len(docs)), key=lambda i: (len(docs[i]), rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        L = len(docs[i])
        if cur and max(cur_max, L) * (len(cur) + 1) > tokens_per_batch:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, L)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(docs, idx, remap):
    L = max(len(docs[i]) for i in idx)
    ids = torch.zeros(len(idx), L, dtype=torch.long)
    mask = torch.zeros(len(idx), L, dtype=torch.bool)
    for r, i in enumerate(idx):
        ids[r, :len(docs[i])] = remap[torch.tensor(docs[i])]
        mask[r, :len(docs[i])] = True
    return ids, mask


def load_shipped(name, dtype=torch.float32):
    from safetensors.torch import load_file
    path = MODELS / name
    cfg = ModelConfig.from_file(path / "config.json")
    model = CausalLM(cfg)
    sd = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model.to(dtype).eval(), cfg


@torch.no_grad()
def greedy_generate(model, cfg, prompts, max_new, eos_id, n_tokens, batch=64, head_rows=None, dtype=torch.bfloat16):
    """Batched greedy continuation through CausalLM + KVCache. Padding rows are never chosen."""
    outs = []
    for b0 in range(0, len(prompts), batch):
        chunk = prompts[b0:b0 + batch]
        B = len(chunk)
        cache = KVCache(cfg.num_hidden_layers, B, max(len(p) for p in chunk) + max_new + 1,
                        cfg.num_key_value_heads, cfg.head_dim, dtype, "cpu")
        nxt = torch.zeros(B, 1, dtype=torch.long)
        for r, p in enumerate(chunk):
            win = cache.window([r], len(p))
            h = model(torch.tensor([p]), cache, win)
            cache.advance([r], len(p))
            lg = model.logits(h[:, -1]).float()
            lg[:, n_tokens:] = float("-inf")
            nxt[r, 0] = lg.argmax(-1)[0]
        gen = [[int(nxt[r, 0])] for r in range(B)]
        active = [r for r in range(B) if gen[r][-1] != eos_id]
        for _ in range(max_new - 1):
            if not active:
                break
            win = cache.window(active, 1)
            h = model(nxt[active], cache, win)
            cache.advance(active, 1)
            lg = model.logits(h[:, -1]).float()
            lg[:, n_tokens:] = float("-inf")
            am = lg.argmax(-1)
            for j, r in enumerate(active):
                gen[r].append(int(am[j]))
                nxt[r, 0] = am[j]
            active = [r for r in active if gen[r][-1] != eos_id]
        outs.extend(gen)
        print(f"  generated {b0 + B}/{len(prompts)}", flush=True)
    return outs
