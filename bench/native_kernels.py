"""Native kernels vs the PyTorch path vs the memory roofline, on a random-weight model of a real shape.

    PYTHONPATH=. python bench/native_kernels.py [--shape qwen3-0.6b] [--repeats 5] [--threads 2] [--out bench/results/DATE]

Builds the model in memory (random bf16 weights; speed does not depend on the values), runs the target alone's
decode step (a 1-token forward of every row + the greedy head) on two runners of identical weights, one on the
native kernels and one on the PyTorch path (ANYDRAFT_NATIVE=0: oneDNN), and one large bf16 GEMV / GEMM over as
many bytes as the model's weights (torch.nn.functional.linear, oneDNN; and the native linear kernel) as the
roofline. Quantities are interleaved repeat by repeat (this machine's speed drifts over minutes); medians are
reported. Also: the greedy head on degenerate activations (one huge outlier) against the full logits.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from anydraft.model.config import ModelConfig
from anydraft.model.llama import CausalLM, rope_inv_freq
from anydraft.model.native_extension import _cpuinfo, load_extension
from anydraft.model.runner import ModelRunner

SHAPES = {   # Qwen3 configs (tied embeddings, q/k norm)
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
}


def random_model(shape: str) -> CausalLM:
    cfg = ModelConfig(architecture="Qwen3ForCausalLM", qk_norm=True, tie_word_embeddings=True, rope_theta=1e6,
                      **SHAPES[shape])
    with torch.device("meta"):
        model = CausalLM(cfg).to(torch.bfloat16)
    model = model.to_empty(device="cpu")   # bf16 from the start: no fp32 copy of the weights
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:   # row-by-row randn keeps the fp32 temporary small
                flat = param.view(param.shape[0], -1)
                for i in range(0, flat.shape[0], 4096):
                    flat[i:i + 4096] = torch.randn(flat[i:i + 4096].shape, generator=gen) / flat.shape[1] ** 0.5
    model._inv_freq = rope_inv_freq(cfg)
    return model


def timed(fn, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=32, help="prompt tokens in every row before timing")
    parser.add_argument("--out", type=Path, default=Path("bench/results") / datetime.date.today().isoformat())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = 16

    runners = {}
    for kind, flag in (("native", "1"), ("pytorch", "0")):   # the same seed: identical weights
        os.environ["ANYDRAFT_NATIVE"] = flag
        runners[kind] = ModelRunner(random_model(args.shape), max_batch=batch, max_len=args.context + 64)
        print(kind, runners[kind].kernels, file=sys.stderr)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 151000, (batch, args.context), generator=gen)
    prefill_ms = {}
    for kind, runner in runners.items():   # prefill: every row's prompt, one forward per row
        start = time.perf_counter()
        for row in range(batch):
            runner.prefill(row, prompts[row].tolist())
        prefill_ms[kind] = (time.perf_counter() - start) * 1e3 / batch

    weight_elements = sum(p.numel() for n, p in runners["native"].model.named_parameters()
                          if "embed_tokens" not in n or runners["native"].cfg.tie_word_embeddings)
    K = runners["native"].cfg.hidden_size
    roofline_weight = torch.randn(weight_elements // K, K, generator=gen).bfloat16()
    extension = load_extension()
    x1, x16 = torch.randn(1, K).bfloat16(), torch.randn(batch, K).bfloat16()

    def step(runner, rows, tokens: int = 1):   # tokens > 1: a verification forward of that many per row
        ids = torch.randint(0, 151000, (len(rows), tokens))
        hidden = runner.forward(rows, ids)
        runner.greedy_ids(hidden)
        runner.cache.rewind(rows, [tokens] * len(rows))

    # Degenerate activations: one outlier coordinate (a repeated token's hidden state looks like this).
    degenerate = torch.randn(batch, K, generator=gen) * 0.05
    degenerate[:, 7] = 3000.0
    degenerate = degenerate.bfloat16()[:, None]
    native, pytorch = runners["native"], runners["pytorch"]
    # "native greedy head": the screened head where it runs, else the argmax of native logits (AVX2)
    with torch.inference_mode():   # ordinary activations: the model's own hidden states
        ordinary = native.forward(list(range(batch)), torch.randint(0, 151000, (batch, 1), generator=gen))
        native.cache.rewind(list(range(batch)), [1] * batch)
    quantities = {
        "native step b1": lambda: step(native, [0]),
        "pytorch step b1": lambda: step(pytorch, [0]),
        "native verify 4 tokens b1": lambda: step(native, [0], 4),
        "pytorch verify 4 tokens b1": lambda: step(pytorch, [0], 4),
        "oneDNN GEMV same bytes": lambda: torch.nn.functional.linear(x1, roofline_weight),
        "native GEMV same bytes": lambda: extension.head_logits(x1, roofline_weight),
        "native step b16": lambda: step(native, list(range(batch))),
        "pytorch step b16": lambda: step(pytorch, list(range(batch))),
        "oneDNN GEMM 16 same bytes": lambda: torch.nn.functional.linear(x16, roofline_weight),
        "native GEMM 16 same bytes": lambda: extension.head_logits(x16, roofline_weight),
        "native greedy head b1": lambda: native.greedy_ids(ordinary[:1]),
        "native full logits b1": lambda: native.logits(ordinary[:1]),
        "pytorch full logits b1": lambda: pytorch.logits(ordinary[:1]),
        "native greedy head b4": lambda: native.greedy_ids(ordinary[:4]),
        "native full logits b4": lambda: native.logits(ordinary[:4]),
        "native greedy head b16": lambda: native.greedy_ids(ordinary),
        "native greedy head b16 degenerate": lambda: native.greedy_ids(degenerate),
        "native full logits b16": lambda: native.logits(degenerate),
        "pytorch full logits b16": lambda: pytorch.logits(degenerate),
    }
    samples = {name: [] for name in quantities}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for name, fn in quantities.items():
                samples[name].append(timed(fn))
        screened = native.native_head   # None where the CPU has no AVX-512 VNNI: greedy ids from the full logits
        fell_back = None if screened is None else screened.greedy_with_report(degenerate, native.num_token_rows)[1]
        ordinary_fell_back = (None if screened is None
                              else screened.greedy_with_report(ordinary[:8], native.num_token_rows)[1])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "machine": {"cpu": _cpuinfo("model name"), "cores": os.cpu_count(), "threads": args.threads,
                    "note": "a VM: timings drift over minutes, hence interleaved repeats and medians"},
        "command": " ".join(["python"] + sys.argv), "shape": {"name": args.shape, **SHAPES[args.shape]},
        "context_tokens": args.context, "batch": batch, "weight_bytes": weight_elements * 2,
        "kernels": {kind: runner.kernels for kind, runner in runners.items()},
        "prefill_ms_per_row": prefill_ms, "median_ms": medians, "samples_ms": samples,
        "degenerate_rows_that_fell_back": None if fell_back is None else int(fell_back.sum()),
        "ordinary_rows_of_8_that_fell_back": None if ordinary_fell_back is None else int(ordinary_fell_back.sum()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"native_kernels_{args.shape}.json"
    path.write_text(json.dumps(result, indent=1))
    for name, value in medians.items():
        print(f"{name:40s} {value:8.1f} ms")
    print(f"prefill ms per row of {args.context} tokens: {prefill_ms}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
