"""Quality and cost report of the shipped models (run: `python train/train.py eval`).

- perplexity of each model on GSM8K test answers (answer tokens + EOS given "Question: ...\\nAnswer:"),
  computed exactly over the tokenizer's ids (padding rows excluded) in fp32;
- greedy continuations of test questions (bf16, CausalLM + KVCache);
- proxy acceptance for both pairs: the target greedy-answers the first N test questions; the draft, fed
  that text tokenized its own way (teacher forcing), predicts each next token with its head pruned to
  the vocabulary intersection. A target token counts as matched when it starts at a draft-token
  boundary and the draft's argmax has exactly its bytes. Then AL at k=3 is simulated over the matched
  flags (k proposals per step, accepted while they match, +1 recovered/bonus token), and also given as
  1 + a + a^2 + a^3 from the per-token match rate a;
- bf16 decode latency per token at batch 1 (drafts with the head pruned to the intersection rows).
"""
from __future__ import annotations

import json
import math
import statistics
import time

import torch

import family as T
from anydraft.model.kv_cache import KVCache
from anydraft.tokenizer import Tokenizer
from anydraft.vocab.token_bytes import TokenKind


_VOCAB_BYTES = {}


def vocab_bytes(tok_name):
    """id -> bytes for regular tokens (byte-level BPE, or SentencePiece `▁` / `<0xNN>` pieces, as anydraft reads
    them); None for added/special tokens."""
    if tok_name not in _VOCAB_BYTES:
        table = Tokenizer.from_dir(T.TOKENIZERS / tok_name).token_table
        matchable = (int(TokenKind.REGULAR), int(TokenKind.BYTE_FALLBACK))
        _VOCAB_BYTES[tok_name] = [b if int(k) in matchable else None
                                  for b, k in zip(table.token_bytes, table.token_kinds)]
    return _VOCAB_BYTES[tok_name]


def intersection_ids(draft_tok, target_tok):
    tb = {b for b in vocab_bytes(target_tok) if b is not None}
    return [i for i, b in enumerate(vocab_bytes(draft_tok)) if b is not None and b in tb]


@torch.no_grad()
def perplexity(name, rows):
    spec = T.SPECS[name]
    model, cfg = T.load_shipped(name, torch.float32)
    tok = T.tokenizer(spec["tok"])
    n_tok = tok.get_vocab_size()
    eos = tok.token_to_id(spec["eos"])
    E = model.model.embed_tokens.weight
    nz = (E[:n_tok] != 0).any(-1).nonzero()[:, 0]
    log_zero = math.log(n_tok - len(nz))   # rows whose logit is exactly 0 (same math as the full softmax)
    W = E[nz]
    pos_of = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    pos_of[nz] = torch.arange(len(nz))
    nll, count = 0.0, 0
    for r in rows:
        p = T.encode(spec, tok, [T.prompt_text(r["question"])])[0]
        full = T.encode(spec, tok, [T.doc_text(r["question"], r["answer"])])[0] + [eos]
        assert full[:len(p)] == p
        h = model(torch.tensor([full[:-1]]))[0, len(p) - 1:]
        logits = h @ W.T
        lse = torch.logaddexp(torch.logsumexp(logits, -1), torch.tensor(log_zero))
        tgt = torch.tensor(full[len(p):])
        idx = pos_of[tgt]
        tl = torch.where(idx >= 0, logits.gather(-1, idx.clamp(min=0)[:, None])[:, 0], torch.zeros(()))
        nll += float((lse - tl).sum())
        count += len(tgt)
    return math.exp(nll / count), count


@torch.no_grad()
def draft_match_flags(draft, dspec, ttok_name, prompt_text, target_ids, inter_mask):
    """Per target token of the completion: does the draft (teacher-forced on the text) predict exactly it?"""
    dtok_name = dspec["tok"]
    tbytes, dbytes = vocab_bytes(ttok_name), vocab_bytes(dtok_name)
    dtok = T.tokenizer(dtok_name)
    comp = b"".join(tbytes[i] or b"" for i in target_ids)
    text = prompt_text + comp.decode("utf-8", errors="replace")
    d_ids = T.encode(dspec, dtok, [text])[0]
    # a SentencePiece draft spells the text with a dummy-prefix space: its offsets start that much earlier
    starts, off = {}, len(text.encode()) - sum(len(dbytes[i] or b"") for i in d_ids)
    for j, i in enumerate(d_ids):
        starts[off] = j
        off += len(dbytes[i] or b"")
    h = draft(torch.tensor([d_ids]).long())
    logits = draft.logits(h)[0].float()
    logits[:, ~inter_mask] = float("-inf")
    pred = logits.argmax(-1).tolist()
    flags, off = [], len(prompt_text.encode())
    for i in target_ids:
        b = tbytes[i]
        j = starts.get(off)
        flags.append(b is not None and j is not None and j > 0 and dbytes[pred[j - 1]] == b)
        off += len(b or b"")
    return flags


def simulate_al(flags, k=3):
    t, steps = 0, 0
    while t < len(flags):
        n = 0
        while n < k and t + n < len(flags) and flags[t + n]:
            n += 1
        t += n + 1
        steps += 1
    return len(flags), steps


@torch.no_grad()
def decode_latency(models, n=80, rounds=3):
    """Median bf16 ms/token at batch 1 after a 100-token prompt; models interleaved in rounds."""
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, (model, cfg, head) in models.items():
            cache = KVCache(cfg.num_hidden_layers, 1, 256, cfg.num_key_value_heads, cfg.head_dim, torch.bfloat16, "cpu")
            ids = torch.randint(0, 1000, (1, 100))
            win = cache.window(None, 100)
            h = model(ids, cache, win)
            cache.advance(None, 100)
            nxt = (h[:, -1:] @ head.T).argmax(-1)
            for _ in range(n):
                t0 = time.perf_counter()
                win = cache.window(None, 1)
                h = model(nxt, cache, win)
                cache.advance(None, 1)
                nxt = (h[:, -1:] @ head.T).argmax(-1)
                times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def main(args):
    torch.set_num_threads(args.threads)
    test = T.load_jsonl(T.DATA / "test.jsonl")
    report = dict(ppl={}, samples={}, proxy={}, latency_ms={})
    wanted = [n for n in T.SPECS if not args.only or args.only in n]
    pairs = [(t, d) for t, d in T.EVAL_PAIRS if not args.only or args.only in t or args.only in d]
    for name in wanted:
        ppl, n = perplexity(name, test[:args.ppl_n])
        report["ppl"][name] = dict(ppl=round(ppl, 3), answer_tokens=n, questions=args.ppl_n)
        print(f"{name}: perplexity {ppl:.3f} over {n} answer tokens of {args.ppl_n} test questions", flush=True)
    prompts = [T.prompt_text(r["question"]) for r in test[:args.n]]
    target_gens = {}
    for target, draft in pairs:
        ts, ds = T.SPECS[target], T.SPECS[draft]
        ttok = T.tokenizer(ts["tok"])
        eos = ttok.token_to_id(ts["eos"])
        if target not in target_gens:
            tmodel, tcfg = T.load_shipped(target, torch.bfloat16)
            target_gens[target] = T.greedy_generate(tmodel, tcfg, T.encode(ts, ttok, prompts), 150, eos,
                                                    ttok.get_vocab_size())
            report["samples"][target] = [dict(question=test[i]["question"],
                                              completion=ttok.decode([x for x in target_gens[target][i] if x != eos]))
                                         for i in range(3)]
            for s in report["samples"][target]:
                print(f"--- {target}: {s['question']}\n{s['completion']}", flush=True)
        dmodel, dcfg = T.load_shipped(draft, torch.float32)
        inter = intersection_ids(ds["tok"], ts["tok"])
        inter_mask = torch.zeros(dcfg.vocab_size, dtype=torch.bool)
        inter_mask[torch.tensor(inter)] = True
        all_flags, steps = [], 0
        for p, g in zip(prompts, target_gens[target]):
            g = [i for i in g if i != eos]
            flags = draft_match_flags(dmodel, ds, ts["tok"], p, g, inter_mask)
            all_flags += flags
            steps += simulate_al(flags)[1]
        a = sum(all_flags) / len(all_flags)
        al_sim = len(all_flags) / steps
        report["proxy"][f"{target}+{draft}"] = dict(
            match_rate=round(a, 4), al_k3_formula=round(1 + a + a * a + a ** 3, 3), al_k3_simulated=round(al_sim, 3),
            intersection=len(inter), target_tokens=len(all_flags), questions=args.n)
        print(f"{target}+{draft}: per-token match {a:.3f}, AL(k=3) formula {1 + a + a*a + a**3:.3f}, "
              f"simulated {al_sim:.3f}  (intersection {len(inter)} rows)", flush=True)
    # latency: each target with its full head; each draft with its head pruned to the intersection with the
    # pair's target vocabulary (what TLI runs), so a draft is timed once per target tokenizer
    lat, loaded = {}, {}
    for target, draft in pairs:
        for name in (target, draft):
            if name not in loaded:
                loaded[name] = T.load_shipped(name, torch.bfloat16)
        model, cfg = loaded[target]
        lat[target] = (model, cfg, model.lm_head.weight)
        model, cfg = loaded[draft]
        ttok = T.SPECS[target]["tok"]
        rows = torch.tensor(intersection_ids(T.SPECS[draft]["tok"], ttok))
        lat[f"{draft}@{ttok}"] = (model, cfg, model.lm_head.weight[rows].contiguous())
    ms = decode_latency(lat)
    report["latency_ms"] = {k: round(v, 3) for k, v in ms.items()}
    for target, draft in pairs:
        d = f"{draft}@{T.SPECS[target]['tok']}"
        r = ms[target] / ms[d]
        report["latency_ms"][f"ratio {target}/{draft}"] = round(r, 2)
        print(f"latency bf16 b=1: {target} {ms[target]:.2f} ms, {d} {ms[d]:.2f} ms, ratio {r:.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
