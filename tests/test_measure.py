"""ragdot.measure: the timing plan and the clocks (on stand-in CUDA events), single-call timing, the
correctness checks and tolerances, run records and their files."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time

import pytest
import torch

from ragdot.bench.runner import Result
from ragdot.measure import checks, records, timing
from ragdot.measure.checks import normalised_error
from ragdot.measure.timing import MIN_ITERS, Timed, measure, measure_clocks, plan_counts
from ragdot.shapes import get_shape

CPU = torch.device("cpu")
TINY = get_shape("tiny-8e")
CUDA = torch.device("cuda")  # only a name here: nothing below touches a GPU


# ------------------------------------------------------------------------------------------ timing plan


def test_plan_counts_bound_slow_calls_and_keep_fast_ones():
    assert plan_counts(1e-4, 10, 50, 1.0) == (10, 50)
    warm, iters = plan_counts(0.2, 10, 50, 1.0)  # the padded baseline on a big shape
    assert warm == 1 and iters == 4
    assert plan_counts(5.0, 10, 50, 1.0) == (1, MIN_ITERS)  # never skipped
    assert plan_counts(5.0, 10, 50, None) == (10, 50)
    with pytest.raises(ValueError, match="iters"):
        plan_counts(1.0, 1, 0, 1.0)


def test_measure_rotates_inputs_and_counts_calls():
    seen: list[int] = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    timings = measure([Timed("a", calls), Timed("b", [lambda: None])], CPU, warmup=2, iters=7, rounds=3)
    assert timings["a"].iters == 7 and len(timings["a"].samples_ms) == 7
    assert len(seen) == 1 + 1 + 7  # estimate, one more warm-up, the iterations
    assert set(seen) == {0, 1, 2}
    assert timings["a"].p20 <= timings["a"].median <= timings["a"].p80



def test_normalised_error_edge_cases():
    a = torch.ones(3, 4)
    assert normalised_error(a, a) == 0.0
    assert normalised_error(a, torch.ones(4, 3)) == math.inf
    assert math.isclose(normalised_error(a * 1.5, a), 0.5)
    assert normalised_error(torch.ones(10) * 2, torch.ones(10), chunk=3) == pytest.approx(1.0)
    assert normalised_error(torch.zeros(2), torch.zeros(2)) == 0.0



# -------------------------------------------------------------------------------------------- clocks

def test_clock_names_batches_and_lanes():
    graphable, eager_only = Timed("a", []), Timed("b", [], graphable=False)
    asynchronous = Timed("x", [], sync=lambda out: None)
    assert timing.lane_clocks(graphable, CUDA, timing.CLOCKS) == ["eager", "graph"]
    assert timing.lane_clocks(graphable, CUDA, ("graph",)) == ["graph"]
    assert timing.lane_clocks(eager_only, CUDA, timing.CLOCKS) == ["eager"]
    assert timing.lane_clocks(eager_only, CUDA, ("graph",)) == ["eager"]  # timed eagerly; its clock says so
    assert timing.lane_clocks(asynchronous, CUDA, timing.CLOCKS) == ["batch"]
    assert timing.lane_clocks(graphable, CPU, timing.CLOCKS) == ["wall"]
    assert [timing.eager_batch(n) for n in (50, 30, 9, 4, 1)] == [10, 10, 3, 1, 1]
    # calls long enough to fill a sample alone are a sample each; shorter ones fill EAGER_SAMPLE_S
    assert [timing.eager_batch(50, t) for t in (6e-3, 5e-3, 1e-3, 4e-4, 2e-5)] == [1, 1, 5, 10, 10]
    assert timing.eager_batch(6, 1e-4) == 2  # still MIN_ITERS samples
    assert timing.parse_clocks(["graph", "eager", "graph"]) == ("eager", "graph")
    with pytest.raises(ValueError, match="--clocks: device"):
        timing.parse_clocks(["device"])
    assert [timing.view_of(c) for c in ("eager", "event", "batch", "graph", "wall", "")] == [
        "eager", "eager", "eager", "graph", "wall", "eager"]
    assert [sum(timing._share(3, 5, r) for r in range(5)), timing._share(3, 5, 0)] == [3, 0]


def test_host_bound_flag():
    share = timing.HOST_BOUND_SHARE
    assert timing.is_host_bound("eager", 1.0, share) and timing.is_host_bound("graph", 0.01, 0.02)
    assert not timing.is_host_bound("eager", 1.0, 0.99 * share)
    assert not timing.is_host_bound("wall", 1.0, 1.0) and not timing.is_host_bound("batch", 1.0, 1.0)
    assert not timing.is_host_bound("eager", None, 1.0) and not timing.is_host_bound("eager", 1.0, None)
    r = Result(TINY, "fwd_wi", "balanced", "x", "ok", 1, 1, 1e-6, ms=0.1, host_ms=0.2, clock="eager")
    assert r.host_bound and not dataclasses.replace(r, clock="wall").host_bound


class _HostEvent:
    """A stand-in for torch.cuda.Event on the host clock (a device that runs each call as it is issued)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) * 1e3


def _stand_in_cuda(monkeypatch, replays: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(timing, "synchronize", lambda device: None)

    def capture(system):
        return None if system.name == "nocapture" else [lambda: replays.append(system.name)] * len(system.calls)

    monkeypatch.setattr(timing, "_capture", capture)


def test_cuda_clocks_interleave_batches_and_replays(monkeypatch):
    replays: list[str] = []
    _stand_in_cuda(monkeypatch, replays)
    calls: list[str] = []

    def call(name):
        def run():
            calls.append(name)
            time.sleep(2e-4)  # the host's cost of the call: the stand-in device is idle otherwise

        return run

    systems = [Timed("a", [call("a")] * 2), Timed("b", [call("b")], graphable=False),
               Timed("nocapture", [call("n")])]
    monkeypatch.setattr(timing, "EAGER_SAMPLE_S", 1.0)  # calls short against a sample: the full batch
    got = measure_clocks(systems, CUDA, clocks=timing.CLOCKS, warmup=2, iters=30, rounds=5)
    assert set(got) == {("a", "eager"), ("a", "graph"), ("b", "eager"), ("nocapture", "eager")}
    eager, graph = got[("a", "eager")], got[("a", "graph")]
    assert (eager.clock, eager.batch, eager.iters, len(eager.samples_ms), len(eager.host_ms)) == ("eager", 10, 30, 3, 3)
    assert (graph.clock, graph.batch, graph.iters, len(graph.samples_ms)) == ("graph", 1, 30, 30)
    assert calls.count("a") == 1 + 1 + 30 and replays.count("a") == 30  # estimate, warm-up, eager iterations
    assert eager.host_bound and eager.median >= eager.host > 0  # events on the host clock: host-bound by design
    # a call that spans a sample alone is a sample of its own: as many samples as graph replays
    monkeypatch.setattr(timing, "EAGER_SAMPLE_S", 1e-4)
    long = measure_clocks(systems[:1], CUDA, clocks=timing.CLOCKS, warmup=2, iters=30, rounds=5)[("a", "eager")]
    assert (long.batch, long.iters, len(long.samples_ms)) == (1, 30, 30)
    # the tuner's single-clock view: a graph where it can be captured, eager calls where not
    one = measure(systems, CUDA, warmup=1, iters=6, graphs=True)
    assert {n: t.clock for n, t in one.items()} == {"a": "graph", "b": "eager", "nocapture": "eager"}


def test_a_slow_first_call_does_not_size_the_eager_batch(monkeypatch):
    _stand_in_cuda(monkeypatch, [])
    made: list[int] = []

    def call():  # the first call of a signature does one-time work (e.g. a launch recorded for replay)
        made.append(1)
        time.sleep(5e-2 if len(made) == 1 else 2e-5)

    monkeypatch.setattr(timing, "EAGER_SAMPLE_S", 2e-2)  # the first call would make a batch of 1, later ones 10
    got = measure_clocks([Timed("a", [call])], CUDA, clocks=("eager",), warmup=1, iters=30, rounds=5)
    assert got[("a", "eager")].batch == timing.EAGER_BATCH  # sized by the fastest warm-up call, not the first


def test_an_asynchronous_system_is_timed_in_batches_with_one_wait_each(monkeypatch):
    replays: list[str] = []
    _stand_in_cuda(monkeypatch, replays)
    waits: list[int] = []
    issued: list[int] = []

    def call():
        issued.append(1)
        return len(issued)

    system = Timed("jax", [call] * 3, sync=lambda out: waits.append(out))
    got = measure_clocks([system], CUDA, clocks=timing.CLOCKS, warmup=2, iters=30, rounds=25)
    t = got[("jax", "batch")]
    assert list(got) == [("jax", "batch")] and (t.batch, t.iters, len(t.samples_ms)) == (10, 30, 3)
    assert len(issued) == 1 + 1 + 30  # the estimate, the warm-up, the timed calls
    # one wait after the estimate, one after the warm-up, then one per batch of ten, on each batch's last call
    assert waits == [1, 2, 12, 22, 32] and t.host_ms == t.samples_ms
    assert timing.sync_batch(2) == 1 and timing.sync_batch(30) == 10


def test_the_program_clock_times_one_program_of_n_calls_per_sample(monkeypatch):
    replays: list[str] = []
    _stand_in_cuda(monkeypatch, replays)
    runs: list[int] = []
    waits: list[int] = []

    def program(n):
        runs.append(n)
        time.sleep(1e-4 * n)  # n calls of 0.1 ms on the stand-in device
        return n

    system = Timed("jax", [lambda: 1] * 2, sync=lambda out: waits.append(out), programs=[program] * 2)
    assert timing.lane_clocks(system, CUDA, timing.CLOCKS) == ["batch", "program"]
    assert timing.lane_clocks(system, CUDA, ("eager",)) == ["batch"]  # no program clock unless graph is asked
    got = measure_clocks([system], CUDA, clocks=timing.CLOCKS, warmup=1, iters=30, rounds=25)
    t = got[("jax", "program")]
    assert (t.clock, t.batch, t.iters, len(t.samples_ms)) == ("program", 10, 30, 3)
    assert runs == [10] * 5  # each program warmed once, then one program of ten calls per sample
    assert waits.count(10) == 5 and all(ms >= 0.1 for ms in t.samples_ms)  # per call: the program's time / 10
    assert timing.view_of("program") == "graph" and not timing.is_host_bound("program", 1.0, 1.0)


def test_cpu_has_one_clock_whatever_is_asked():
    got = measure_clocks([Timed("a", [lambda: None])], CPU, clocks=timing.CLOCKS, warmup=1, iters=4, rounds=2)
    assert list(got) == [("a", "wall")]
    assert got[("a", "wall")].host_ms == got[("a", "wall")].samples_ms and not got[("a", "wall")].host_bound



# ---------------------------------------------------------------------------------------- single calls


def test_single_call_helpers_on_the_wall_clock():
    log: list[int] = []
    ms, host = timing.timed_call(lambda: log.append(1), CPU)
    assert ms == host >= 0 and log == [1]
    assert timing.event_ms(lambda: time.sleep(1e-3), CPU) >= 1.0
    assert timing.median_ms(lambda: log.append(2), CPU, graph=True, reps=3) >= 0  # no graph off CUDA
    assert log.count(2) == 2 + 3  # two warm-up calls, then the timed ones


def test_single_call_helpers_on_stand_in_cuda_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    log: list[int] = []
    ms, host = timing.timed_call(lambda: (log.append(1), time.sleep(2e-3)), CUDA)
    assert ms >= host >= 2.0 and log == [1]
    per_call = timing.sustained_ms(lambda: (log.append(2), time.sleep(1e-4)), seconds=0.0)
    assert per_call >= 0.1 and log.count(2) == 1 + 3  # the estimate, then at least three timed calls
    spans = [timing.span(lambda: time.sleep(1e-3)) for _ in range(2)]
    assert all(ms >= 1.0 for ms in timing.spans_ms(spans)) and timing.spans_ms([]) == []


def test_loop_ms_issues_calls_back_to_back(monkeypatch):
    """The loop clock: events around `calls` calls with no synchronisation between them, per call, median of
    `repeats` runs (one synchronisation before each run)."""
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    syncs: list[int] = []
    log: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(len(log)))
    ms = timing.loop_ms(lambda: (log.append(1), time.sleep(1e-3)), CUDA, calls=4, repeats=3)
    assert len(log) == 12 and syncs == [0, 4, 8] and ms >= 1.0
    assert timing.loop_ms(lambda: time.sleep(1e-3), CPU, calls=2, repeats=1) >= 1.0
    for calls, repeats in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="calls and repeats"):
            timing.loop_ms(lambda: None, CPU, calls=calls, repeats=repeats)


def test_sustained_ms_without_cuda_times_one_call(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    log: list[int] = []
    assert timing.sustained_ms(lambda: log.append(1), seconds=10.0) >= 0 and log == [1]


def test_a_call_that_cannot_be_captured_has_no_graph(monkeypatch):
    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(timing, "capture_graph", refuse)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert timing._capture(Timed("a", [lambda: None])) is None


class _Graph:
    """A stand-in for torch.cuda.CUDAGraph in the CPU tests of capture_graph."""

    def replay(self) -> None:
        pass


def test_capture_holds_off_the_cyclic_collector_and_restores_it(monkeypatch):
    """A cycle collected mid-capture can release CUDA resources, which a global-mode capture does not allow:
    capture_graph keeps the collector off while fn() is captured, and leaves it as it found it, also when the
    capture fails."""
    import contextlib
    import gc

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "graph",
                        lambda graph, capture_error_mode: modes.append(capture_error_mode) or contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: None)
    seen: list[bool] = []
    was = gc.isenabled()
    try:
        gc.enable()
        replay = timing.capture_graph(lambda: seen.append(gc.isenabled()))
        assert seen == [False] and gc.isenabled() and callable(replay)
        assert modes == ["thread_local"]  # other threads' (another runtime's) calls never fail the capture

        def fails() -> None:
            raise RuntimeError("operation failed due to a previous error during capture")

        with pytest.raises(RuntimeError, match="during capture"):
            timing.capture_graph(fails)
        assert gc.isenabled()
        gc.disable()  # a caller that had it off keeps it off
        timing.capture_graph(lambda: None)
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_failed_capture_restores_the_stream_and_takes_the_generators_out_of_capture(monkeypatch):
    """When ending a capture raises, torch's context manager leaves the capture's side stream current and (torch
    2.11) the CUDA generators in their capture state, so every later random draw on the device raises:
    capture_graph sets the stream back and gives each default generator a copy of its own state, then re-raises.
    A capture that succeeds touches neither."""

    class _Gen:
        def __init__(self) -> None:
            self.log: list[str] = []

        def clone_state(self) -> str:
            return "copy"

        def graphsafe_set_state(self, state: str) -> None:
            self.log.append(state)

    class _Capture:
        def __init__(self, graph, fail: bool) -> None:
            self.fail = fail

        def __enter__(self) -> None:
            streams.append("side")

        def __exit__(self, *exc) -> None:
            if self.fail:  # as capture_end raises: the side stream stays current
                raise RuntimeError("operation failed due to a previous error during capture")
            streams.append("stream")

    streams: list[str] = []
    gens = (_Gen(), _Gen())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "set_stream", streams.append)
    monkeypatch.setattr(torch.cuda, "default_generators", gens)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **_: _Capture(graph, fail=False))
    assert callable(timing.capture_graph(lambda: None))
    assert streams == ["side", "stream"] and all(g.log == [] for g in gens)

    streams.clear()
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **_: _Capture(graph, fail=True))
    with pytest.raises(RuntimeError, match="during capture"):
        timing.capture_graph(lambda: None)
    assert streams == ["side", "stream"] and all(g.log == ["copy"] for g in gens)


@pytest.mark.gpu
def test_gpu_after_a_failed_capture_random_draws_and_captures_work():
    """A host synchronisation inside a capture invalidates it; afterwards the device's random draws, the current
    stream and a new capture are as before (on torch 2.11 the draw raised "Offset increment outside graph
    capture encountered unexpectedly" and failed every later test of the run)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    stream = torch.cuda.current_stream()
    x = torch.ones(4, device="cuda")
    with pytest.raises(Exception):  # noqa: B017 (torch raises RuntimeError or its AcceleratorError subclass)
        timing.capture_graph(lambda: x.sum().item())
    assert torch.cuda.current_stream() == stream
    torch.manual_seed(0)
    first = torch.randn(8, device="cuda")
    torch.manual_seed(0)
    assert torch.equal(first, torch.randn(8, device="cuda"))
    y = torch.zeros(4, device="cuda")
    replay = timing.capture_graph(lambda: y.add_(1))
    replay()
    torch.cuda.synchronize()
    assert y.tolist() == [1.0, 1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------- checks


def test_one_tolerance_table():
    assert {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4} == checks.TOLERANCE
    assert checks.tolerance(torch.float64) == 1e-4 and checks.tolerance(torch.float64, default=2e-2) == 2e-2
    assert checks.within_tolerance(1e-2, torch.bfloat16) and not checks.within_tolerance(1e-2, torch.float16)
    assert not checks.within_tolerance(math.nan, torch.bfloat16)


def test_max_abs_error_and_failure_status():
    ref = torch.tensor([1.0, -4.0])
    assert checks.max_abs_error(ref, ref) == 0.0
    assert checks.max_abs_error(ref + torch.tensor([0.0, 0.4]), ref) == pytest.approx(0.1)
    assert checks.max_abs_error(torch.tensor([math.nan, 0.0]), ref) == math.inf
    assert checks.max_abs_error(torch.ones(2), torch.zeros(2)) == math.inf
    assert checks.max_abs_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert checks.failure_status(torch.OutOfMemoryError("CUDA out of memory")) == ("OOM", "")
    assert checks.failure_status(RuntimeError("RESOURCE_EXHAUSTED: 2 GB"))[0] == "OOM"
    assert checks.failure_status(NotImplementedError("not here")) == ("n/a", "not here")
    assert checks.failure_status(ValueError("bad")) == ("error", "ValueError: bad")


# --------------------------------------------------------------------------------------------- records


def test_run_meta_and_commit(monkeypatch):
    monkeypatch.setenv("RAGDOT_COMMIT", "abc123")
    assert records.commit() == "abc123"
    meta = records.run_meta(CPU, torch.bfloat16, with_triton=True)
    assert list(meta) == ["gpu", "commit", "date", "torch", "triton", "dtype"]
    assert (meta["gpu"], meta["commit"], meta["dtype"]) == ("cpu", "abc123", "bfloat16")
    assert meta["torch"] == torch.__version__
    assert records.run_meta("cpu", commit_id="given")["commit"] == "given" and records.gpu_name(CPU) == "cpu"


def test_csv_and_json_writers(tmp_path):
    rows = [{"a": 1, "b": 2}, {"a": 3, "c": 4}]
    path = records.write_csv(rows, tmp_path / "x.csv")
    with open(path) as f:
        assert list(csv.DictReader(f)) == [{"a": "1", "b": "2", "c": ""}, {"a": "3", "b": "", "c": "4"}]
    records.write_csv([], tmp_path / "e.csv", ["shape"])
    assert (tmp_path / "e.csv").read_text().strip() == "shape"
    doc = tmp_path / "x.json"
    records.write_json(doc, {"m": 1}, rows, columns=("a", "b"), newline=True)
    assert json.loads(doc.read_text()) == {"meta": {"m": 1}, "columns": ["a", "b"], "rows": rows}
    assert doc.read_text().endswith("\n") and not list(tmp_path.glob("*.tmp"))
    records.write_json(doc, {"when": dataclasses}, [])  # what JSON lacks becomes text
    assert list(json.loads(doc.read_text())) == ["meta", "rows"]


def test_row_writer_never_overwrites_a_run(tmp_path):
    first = records.RowWriter(tmp_path, "run", {"n": 1}, ("a", "b"))
    first.add({"a": 1, "b": 2, "extra": 3})
    second = records.RowWriter(tmp_path, "run", {"n": 2}, ("a", "b"))
    assert {first.csv, first.json}.isdisjoint({second.csv, second.json})
    assert first.csv.read_text().splitlines() == ["a,b", "1,2"]
    assert json.loads(first.json.read_text()) == {"meta": {"n": 1}, "rows": [{"a": 1, "b": 2, "extra": 3}]}


def test_measurement_needs_no_optional_dependency_and_the_library_no_benchmark_code():
    from pathlib import Path

    src = Path(timing.__file__).resolve().parents[1]
    for path in (src / "measure").glob("*.py"):
        text = path.read_text()
        assert not any(f"import {m}" in text for m in ("numpy", "rich", "matplotlib")), path.name
    top = [p for p in src.glob("*.py") if p.name != "cli.py"]
    library = [*top, *(p for pkg in ("tune", "moe", "mxfp8", "backends", "kernels") for p in (src / pkg).glob("*.py"))]
    for path in library:  # the op, the tuner and the MoE/MXFP8 layers import no benchmark code
        text = path.read_text()
        assert "ragdot.bench" not in text and "from ragdot import bench" not in text, path.name


def test_row_writer_with_open_columns_rewrites_whole_files(tmp_path):
    writer = records.RowWriter(tmp_path, "open", {"n": 1})
    writer.add({"a": 1})
    writer.add({"a": 2, "b": 3})
    assert writer.csv.read_text().splitlines() == ["a,b", "1,", "2,3"]
    writer.rows[0]["b"] = 9  # a later row made a ratio of an earlier one known
    writer.rewrite()
    assert writer.csv.read_text().splitlines()[1] == "1,9"
    assert json.loads(writer.json.read_text())["rows"][0] == {"a": 1, "b": 9}
    assert writer.files == [writer.csv, writer.json]
