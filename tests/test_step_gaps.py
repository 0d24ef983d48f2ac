"""benchmarks/step_gaps.py: its trace reader (GPU idle time, phases, gap owners, host self times) on a made-up
Chrome trace, and its refusal without a CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import benchmark_script

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "step_gaps.py"


@pytest.fixture(scope="module")
def step_gaps():
    return benchmark_script("step_gaps")


def _trace() -> list[dict]:
    """fwd [0, 100) on thread 1, bwd [100, 300) with its ops on thread 2; timestamps in µs."""
    return [
        {"cat": "user_annotation", "name": "fwd", "ts": 0, "dur": 100, "tid": 1},
        {"cat": "user_annotation", "name": "bwd", "ts": 100, "dur": 200, "tid": 1},
        {"cat": "cpu_op", "name": "outer", "ts": 2, "dur": 40, "tid": 1},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 5, "dur": 20, "tid": 1},
        {"cat": "cpu_op", "name": "aten::empty", "ts": 6, "dur": 3, "tid": 1},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 2, "tid": 1, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "k1", "ts": 20, "dur": 30, "args": {"correlation": 1}},
        {"cat": "cpu_op", "name": "aten::add", "ts": 140, "dur": 20, "tid": 2},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150, "dur": 2, "tid": 2, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "k2", "ts": 160, "dur": 30, "args": {"correlation": 2}},
        {"cat": "cpu_op", "name": "aten::fill_", "ts": 195, "dur": 4, "tid": 2},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 196, "dur": 1, "tid": 2, "args": {"correlation": 3}},
        {"cat": "gpu_memset", "name": "fill", "ts": 200, "dur": 10, "args": {"correlation": 3}},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 250, "dur": 40, "tid": 1, "args": {}},
    ]


def test_idle_time_is_split_by_phase_and_by_the_op_that_ended_each_gap(step_gaps):
    out = step_gaps.gaps_of_trace(_trace())
    # the step runs from the first launch (10) to the last GPU end (210); busy 30 + 30 + 10 = 70 µs
    assert out["kernels"] == 3
    assert out["span_ms"] == pytest.approx(0.200)
    assert out["busy_ms"] == pytest.approx(0.070)
    assert out["idle_ms"] == pytest.approx(0.130)
    phases = out["phases"]
    assert phases["fwd"] == {"host_ms": pytest.approx(0.1), "idle_ms": pytest.approx(0.010), "kernels": 1}
    assert phases["bwd"]["idle_ms"] == pytest.approx(0.120) and phases["bwd"]["kernels"] == 2
    owners = {name: (ms, n) for name, ms, n in out["owners"]}
    assert owners["bwd: aten::add"] == (pytest.approx(0.110), 1)  # the gap 50 -> 160 ended by k2's launch
    assert owners["bwd: aten::fill_"] == (pytest.approx(0.010), 1)
    assert owners["fwd: aten::mm"] == (pytest.approx(0.010), 1)


def test_host_self_times_subtract_nested_ops(step_gaps):
    host = {name: (ms, n) for name, ms, n in step_gaps.gaps_of_trace(_trace())["host_ops"]}
    assert host["fwd: outer"][0] == pytest.approx(0.020)  # 40 less mm's 20
    assert host["fwd: aten::mm"][0] == pytest.approx(0.017)  # 20 less empty's 3
    assert host["fwd: aten::empty"][0] == pytest.approx(0.003)
    assert host["bwd: aten::add"][0] == pytest.approx(0.020)


def test_runtime_calls_include_the_ones_without_a_kernel(step_gaps):
    calls = {name: (ms, n, mx) for name, ms, n, mx in step_gaps.gaps_of_trace(_trace())["runtime_calls"]}
    assert calls["cudaStreamSynchronize"] == (pytest.approx(0.040), 1, 40)
    assert calls["cudaLaunchKernel"][1] == 3


def test_a_trace_without_gpu_work_has_no_gaps(step_gaps):
    out = step_gaps.gaps_of_trace([e for e in _trace() if e["cat"] not in step_gaps.GPU_CATS])
    assert out["kernels"] == 0 and out["idle_ms"] == 0.0 and out["owners"] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_it_refuses_without_cuda(step_gaps, capsys):
    assert step_gaps.main(["--configs", "deepseek3-test"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.fixture(scope="module")
def loop_gaps():
    return benchmark_script("loop_gaps")


def test_loop_gaps_splits_equal_steps_and_leaves_the_first_out(loop_gaps):
    """Three steps of two activities each (µs): the first step's 40 µs of idle time is not counted; steps two and
    three each hold k1 (10 µs) and k2 (20 µs, overlapping k1 by 5 in step three), one 10 µs gap between them."""
    acts = [
        {"cat": "kernel", "name": "k1", "ts": 0, "dur": 10}, {"cat": "kernel", "name": "k2", "ts": 50, "dur": 20},
        {"cat": "kernel", "name": "k1", "ts": 100, "dur": 10}, {"cat": "kernel", "name": "k2", "ts": 120, "dur": 20},
        {"cat": "kernel", "name": "k1", "ts": 140, "dur": 10}, {"cat": "kernel", "name": "k2", "ts": 145, "dur": 20},
    ]
    s = loop_gaps.steady_steps(acts, 3)
    assert s["activities_per_step"] == 2
    assert s["span_ms"] == pytest.approx((165 - 100) / 1e3 / 2)
    assert s["busy_ms"] == pytest.approx((10 + 20 + 25) / 1e3 / 2)
    assert s["idle_ms"] == pytest.approx(10 / 1e3 / 2)
    assert s["kernels_ms"] == pytest.approx({"k1": 10 / 1e3, "k2": 20 / 1e3})
    with pytest.raises(ValueError, match="equal steps"):
        loop_gaps.steady_steps(acts[:5], 3)


def test_loop_gaps_refuses_without_a_cuda_device(loop_gaps, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert loop_gaps.main(["--steps", "2"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_loop_gaps_cold_step_names_the_kernel_after_each_gap(loop_gaps):
    acts = [{"name": "mm", "ts": 0, "dur": 5}, {"name": "topk", "ts": 60, "dur": 5},
            {"name": "gemm", "ts": 70, "dur": 100}, {"name": "swiglu", "ts": 165, "dur": 10}]
    c = loop_gaps.cold_gaps(acts)
    assert c["span_ms"] == pytest.approx(0.175) and c["busy_ms"] == pytest.approx(0.115)
    assert c["idle_ms"] == pytest.approx(0.060)  # both gaps
    assert c["gaps"] == [(pytest.approx(0.055), "topk", pytest.approx(0.060))]  # 65-70: 5 µs, under the bound
    assert loop_gaps.cold_gaps([])["gaps"] == []
