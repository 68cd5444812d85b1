"""The memory-bandwidth roofline of batch-1 decoding: how close each system's target-alone step comes to it.

At batch 1 a decode step reads every target weight once, so no system can beat weight_bytes / bandwidth per
token. The bandwidth is measured the same way a decode step reads: one GEMV (matrix times one vector) over a
matrix of as many bytes as the target's weights, in the bench's dtype and thread count, median of a few runs,
by every GEMV at hand (torch's, anydraft's native bf16 head kernel on the row-major matrix, and the native body's
kernel on the matrix packed in its tile layout, where each runs): the bound is the fastest of them, since a slower
GEMV gives a bound a decode can beat (torch's bf16 GEMV reads far below what the memory delivers). anydraft's
own decode steps are also timed alternately with that GEMV (`decode_steps`), the headline share of the bound.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable

import torch


READERS = ("torch.mm", "anydraft native head_logits", "anydraft native body (packed)")


def _reader(name: str, rows: int, columns: int, dtype: torch.dtype, native) -> Callable[[], object] | None:
    """One GEMV over its own [rows, columns] matrix (written once, so every page is resident before timing), or
    None where it does not run here. Each holds its matrix alone, so two copies never sit in memory at once."""
    vector = torch.ones(1, columns, dtype=dtype)
    if name == "torch.mm":
        matrix = torch.ones(rows, columns, dtype=dtype)
        return lambda: torch.mm(matrix, vector.t())
    if native is None:
        return None
    if name == "anydraft native head_logits":
        matrix = torch.ones(rows, columns, dtype=dtype)
        return lambda: native.head_logits(vector, matrix)
    packed = native.pack_body_weight(torch.ones(rows, columns, dtype=dtype))   # None at an odd width
    return None if packed is None else (lambda: native.body_linear(vector, packed, rows))


@torch.inference_mode()
def measure_bandwidth(num_bytes: int, dtype: torch.dtype, warmup: int = 2, repeats: int = 5,
                      columns: int = 4096, decode_steps: Iterable[float] | None = None) -> dict:
    """{'bytes', 'seconds', 'bytes_per_second', 'gemv', 'readers'} of the fastest GEMV over one
    [num_bytes / (columns * itemsize), columns] matrix; 'readers' holds each GEMV's own seconds.

    decode_steps: the seconds of decode steps as they are taken (a generator that runs them): each is followed by
    one fastest GEMV, and 'interleaved' gets the pairs' medians. This machine's bandwidth swings by half within
    minutes, so a bound measured before the decoding can sit far from the one the decoding met; alternated step
    by step, the two read memory under the same conditions."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, num_bytes // (columns * itemsize))
    native = _native_extension() if dtype == torch.bfloat16 else None
    seconds_by_reader = {}
    for name in READERS:
        gemv = _reader(name, rows, columns, dtype, native)
        if gemv is not None:
            seconds_by_reader[name] = _median_seconds(gemv, warmup, repeats)
        del gemv
    fastest = min(seconds_by_reader, key=seconds_by_reader.get)
    seconds = seconds_by_reader[fastest]
    size = rows * columns * itemsize
    result = {"bytes": size, "seconds": seconds, "bytes_per_second": size / seconds, "gemv": fastest,
              "readers": seconds_by_reader, "dtype": str(dtype).split(".")[-1],
              "threads": torch.get_num_threads(), "repeats": repeats}
    if decode_steps is not None:
        result["interleaved"] = _interleave(decode_steps, _reader(fastest, rows, columns, dtype, native))
    return result


def _interleave(decode_steps: Iterable[float], gemv: Callable[[], object]) -> dict:
    """Each decode step, then one GEMV: medians of both and of their per-pair ratio (GEMV / step = the share of
    the bound the step reaches)."""
    steps, gemvs = [], []
    for step_seconds in decode_steps:
        start = time.perf_counter()
        gemv()
        gemvs.append(time.perf_counter() - start)
        steps.append(step_seconds)
    if not steps:
        return {"pairs": 0}
    return {"pairs": len(steps), "step_seconds_median": statistics.median(steps),
            "gemv_seconds_median": statistics.median(gemvs),
            "fraction_of_bound_median": statistics.median(g / s for g, s in zip(gemvs, steps))}


def _median_seconds(gemv, warmup: int, repeats: int) -> float:
    times = []
    for repeat in range(warmup + repeats):
        start = time.perf_counter()
        gemv()
        if repeat >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _native_extension():
    """anydraft's native kernels where they build and run here, else None."""
    from ..model.native_extension import BuildFailed, load_extension, why_not_hardware
    if why_not_hardware() is not None:
        return None
    try:
        return load_extension()
    except BuildFailed:
        return None


def roofline_rows(runs: list[dict], target_bytes: int, bandwidth: dict) -> list[dict]:
    """Each system's target alone (k = 0) against the bound: seconds per token measured (median tok/s of the
    whole request, prompt forward included) and the bandwidth bound's share of it (1.0 = at the bound); where the
    system tells when each first token came, also per decoded token after it (TPOT: the prompt's forward, a
    compute-bound GEMM over the prompt's tokens, is outside the one-read-per-token bound)."""
    bound = target_bytes / bandwidth["bytes_per_second"]
    rows = []
    for run in runs:
        if run["k"] != 0 or not run.get("tokens_per_second_median"):
            continue
        seconds = 1.0 / run["tokens_per_second_median"]
        row = {"name": run["name"], "seconds_per_token": seconds, "bound_seconds_per_token": bound,
               "fraction_of_bound": bound / seconds}
        if run.get("decode_tokens_per_second_median"):
            row["decode_seconds_per_token"] = 1.0 / run["decode_tokens_per_second_median"]
            row["decode_fraction_of_bound"] = bound * run["decode_tokens_per_second_median"]
        rows.append(row)
    return rows
