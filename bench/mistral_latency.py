"""Decode latency of the mistral pairs (python bench/mistral_latency.py OUT.json), measured like `train/train.py eval` (eval_models.decode_latency): bf16, batch 1, 1 thread, drafts' heads
pruned to the intersection with the pair's target vocabulary; median of 3 interleaved rounds."""
import json, sys, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "train"))
import train as T, eval_models as E
torch.set_num_threads(1)
pairs = [("mistral-target", "qwen3-draft"), ("mistral-target", "smollm2-draft"), ("qwen3-target", "mistral-draft"),
         ("mistral-target", "mistral-draft")]
loaded, lat = {}, {}
for t, d in pairs:
    for n in (t, d):
        loaded.setdefault(n, T.load_shipped(n, torch.bfloat16))
    m, c = loaded[t]; lat[t] = (m, c, m.lm_head.weight)
    m, c = loaded[d]; tt = T.SPECS[t]["tok"]
    rows = torch.arange(c.vocab_size) if T.SPECS[d]["tok"] == tt else torch.tensor(E.intersection_ids(T.SPECS[d]["tok"], tt))
    lat[f"{d}@{tt}"] = (m, c, m.lm_head.weight[rows].contiguous())
ms = E.decode_latency(lat)
out = {k: round(v, 3) for k, v in ms.items()}
for t, d in pairs:
    out[f"ratio {t}/{d}"] = round(ms[t] / ms[f"{d}@{T.SPECS[t]['tok']}"], 2)
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
