"""The memory-bandwidth roofline of batch-1 decoding: how close each system's target-alone step comes to it.

At batch 1 a decode step reads every target weight once, so no system can beat weight_bytes / bandwidth per
token. The bandwidth is measured the same way a decode step reads: one GEMV (matrix times one vector) over a
matrix of as many bytes as the target's weights, in the bench's dtype and thread count, median of a few runs,
by every GEMV at hand (torch's, anydraft's native bf16 head kernel on the row-major matrix, and the native body's
kernel on the matrix packed for AMX tiles, where each runs): the bound is the fastest of them, since a slower
GEMV gives a bound a decode can beat (torch's bf16 GEMV reads far below what the memory delivers).
"""
from __future__ import annotations

import statistics
import time

import torch


@torch.inference_mode()
def measure_bandwidth(num_bytes: int, dtype: torch.dtype, warmup: int = 2, repeats: int = 5,
                      columns: int = 4096) -> dict:
    """{'bytes', 'seconds', 'bytes_per_second', 'gemv', 'readers'} of the fastest GEMV over one
    [num_bytes / (columns * itemsize), columns] matrix; 'readers' holds each GEMV's own seconds."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, num_bytes // (columns * itemsize))
    matrix = torch.ones(rows, columns, dtype=dtype)   # written once, so every page is resident before timing
    vector = torch.ones(1, columns, dtype=dtype)
    readers = {"torch.mm": lambda: torch.mm(matrix, vector.t())}
    native = _native_extension() if dtype == torch.bfloat16 else None
    if native is not None:
        readers["anydraft native head_logits"] = lambda: native.head_logits(vector, matrix)
    seconds_by_reader = {name: _median_seconds(gemv, warmup, repeats) for name, gemv in readers.items()}
    packed = None if native is None else native.pack_body_weight(matrix)   # None where AMX tiles do not run
    if packed is not None:
        del matrix, readers   # only the packing holds both copies; the timing holds the packed one alone
        seconds_by_reader["anydraft native body (AMX tiles)"] = _median_seconds(
            lambda: native.body_linear(vector, packed, rows), warmup, repeats)
    fastest = min(seconds_by_reader, key=seconds_by_reader.get)
    seconds = seconds_by_reader[fastest]
    size = rows * columns * itemsize
    return {"bytes": size, "seconds": seconds, "bytes_per_second": size / seconds, "gemv": fastest,
            "readers": seconds_by_reader, "dtype": str(dtype).split(".")[-1],
            "threads": torch.get_num_threads(), "repeats": repeats}


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
