"""The memory-bandwidth roofline of batch-1 decoding: how close each system's target-alone step comes to it.

At batch 1 a decode step reads every target weight once, so no system can beat weight_bytes / bandwidth per
token. The bandwidth is measured the same way a decode step reads: one GEMV (matrix times one vector) over a
matrix of as many bytes as the target's weights, in the bench's dtype and thread count, median of a few runs.
"""
from __future__ import annotations

import statistics
import time

import torch


@torch.inference_mode()
def measure_bandwidth(num_bytes: int, dtype: torch.dtype, warmup: int = 2, repeats: int = 5,
                      columns: int = 4096) -> dict:
    """{'bytes', 'seconds', 'bytes_per_second'} of one [num_bytes / (columns * itemsize), columns] GEMV."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = max(1, num_bytes // (columns * itemsize))
    matrix = torch.ones(rows, columns, dtype=dtype)   # written once, so every page is resident before timing
    vector = torch.ones(columns, 1, dtype=dtype)
    times = []
    for repeat in range(warmup + repeats):
        start = time.perf_counter()
        torch.mm(matrix, vector)
        if repeat >= warmup:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    size = rows * columns * itemsize
    return {"bytes": size, "seconds": seconds, "bytes_per_second": size / seconds, "dtype": str(dtype).split(".")[-1],
            "threads": torch.get_num_threads(), "repeats": repeats}


def roofline_rows(runs: list[dict], target_bytes: int, bandwidth: dict) -> list[dict]:
    """Each system's target alone (k = 0) against the bound: seconds per token measured (median tok/s of the
    whole request, prompt forward included) and the bandwidth bound's share of it (1.0 = at the bound)."""
    bound = target_bytes / bandwidth["bytes_per_second"]
    rows = []
    for run in runs:
        if run["k"] != 0 or not run.get("tokens_per_second_median"):
            continue
        seconds = 1.0 / run["tokens_per_second_median"]
        rows.append({"name": run["name"], "seconds_per_token": seconds, "bound_seconds_per_token": bound,
                     "fraction_of_bound": bound / seconds})
    return rows
