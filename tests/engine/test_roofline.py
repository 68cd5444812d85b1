"""The roofline's bandwidth: every GEMV at hand is timed and the bound is the fastest of them (a slower reader
gives a bound that decoding beats, as the row-major GEMV did once the body's weights were packed for AMX tiles)."""
import torch

from anydraft.bench.roofline import measure_bandwidth
from anydraft.model.native_extension import why_not_hardware


def test_the_bandwidth_comes_from_the_fastest_gemv_and_times_the_packed_body_kernel():
    result = measure_bandwidth(32 << 20, torch.bfloat16, warmup=1, repeats=3)
    readers = result["readers"]
    assert result["gemv"] == min(readers, key=readers.get)
    assert result["bytes_per_second"] == result["bytes"] / readers[result["gemv"]]
    expected = {"torch.mm"}
    if why_not_hardware() is None:
        expected |= {"anydraft native head_logits", "anydraft native body (packed)"}
    assert set(readers) == expected
    assert all(seconds > 0 for seconds in readers.values())
