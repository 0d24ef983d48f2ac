"""`ragdot host-bench` on the CPU: the timing loop, the systems' calls, the rows and ratios, the CLI and its errors."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch

from ragdot.bench import host
from ragdot.cli import main
from ragdot.measure import host as measure_host
from ragdot.shapes import Shape

CPU = torch.device("cpu")
TINY = Shape("32,16,16,4", 32, 16, 16, 4)
FAST = ["--device", "cpu", "--calls", "3", "--repeats", "1", "--warmup", "1"]


def test_time_host_counts_warmup_pilot_and_passes():
    count = [0]

    def call() -> None:
        count[0] += 1

    timing = measure_host.time_host(call, CPU, calls=7, repeats=3, warmup=2)
    assert count[0] == 2 + 7 + 3 * 7  # warm-up, pilot (min(calls, 10)), passes
    assert timing.calls == 7 and timing.host_us > 0
    assert timing.eager_us is None and timing.device_us is None and timing.host_bound is None


def test_budget_and_chunks():
    assert host._budgeted_calls(1000.0, 300, 5, 0.1) == 20  # 0.1 s / (5 passes x 1 ms)
    assert host._budgeted_calls(1e6, 300, 5, 0.1) == host.MIN_CALLS  # never below the floor
    assert host._budgeted_calls(1e6, 4, 5, 0.1) == 4  # nor above the count asked for
    assert host._budgeted_calls(1e6, 300, 5, 0.0) == 300  # 0: unbounded
    assert list(host._chunk_sizes(35, 16)) == [16, 16, 3]
    assert list(host._chunk_sizes(35, 0)) == [35]


def test_host_bound_compares_host_with_device_time():
    assert host.HostTiming(30.0, 10, eager_us=31.0, device_us=12.0).host_bound is True
    assert host.HostTiming(30.0, 10, eager_us=90.0, device_us=88.0).host_bound is False


def test_calls_compute_the_same_product_and_backward_sets_grads():
    ops = host.make_operands(TINY, torch.float32, CPU, "skewed", seed=0)
    raw = host.make_call("raw", "fwd", ops)()
    for system in ("raw+cumsum", "ragdot-torch", "ragdot-auto"):
        torch.testing.assert_close(host.make_call(system, "fwd", ops)(), raw, rtol=1e-5, atol=1e-5)
    host.make_call("ragdot-torch", "fwdbwd", ops)()
    assert ops.x_leaf.grad is not None and ops.w_leaf.grad is not None
    assert ops.x.grad is None and not ops.x.requires_grad  # the forward operands stay grad-free
    with pytest.raises(ValueError, match="not timed"):
        host.make_call("cumsum", "fwdbwd", ops)
    assert host.phases_of("empty_like", host.PHASES) == ["fwd"]


def _measured(system: str, phase: str, us: float, shape: Shape = TINY) -> host.Measured:
    return host.Measured(shape, system, phase, host.HostTiming(us, 5))


META = {"gpu": "cpu", "commit": "abc", "date": "2026-01-01T00:00:00", "dtype": "float32", "routing": "balanced",
        "repeats": 5}  # fmt: skip


def test_rows_ratio_and_margin_against_raw_cumsum_of_the_same_phase():
    other = Shape("8,8,8,2", 8, 8, 8, 2)
    measured = [
        _measured("raw+cumsum", "fwd", 20.0), _measured("ragdot-torch", "fwd", 50.0),
        _measured("raw+cumsum", "fwdbwd", 100.0), _measured("ragdot-torch", "fwdbwd", 150.0),
        _measured("ragdot-triton", "fwd", 40.0, other),  # no baseline for this shape
    ]  # fmt: skip
    rows = {(r["shape"], r["system"], r["phase"]): r for r in host.result_rows(measured, META)}
    assert rows[TINY.name, "ragdot-torch", "fwd"]["ratio"] == 2.5
    assert rows[TINY.name, "ragdot-torch", "fwd"]["margin_us"] == 30.0
    assert rows[TINY.name, "ragdot-torch", "fwdbwd"]["ratio"] == 1.5
    assert rows[TINY.name, "raw+cumsum", "fwd"]["ratio"] == 1.0
    assert rows["8,8,8,2", "ragdot-triton", "fwd"]["ratio"] is None
    assert list(rows[TINY.name, "raw+cumsum", "fwd"])[:8] == list(host.COLUMNS[:8])
    lines = host.summary_lines(list(rows.values()), "fwd")
    assert any("ragdot-torch: host time 2.50x raw+cumsum" in line and "+30.0 µs" in line for line in lines)


def test_plain_text_report(capsys):
    rows = host.result_rows([_measured("raw+cumsum", "fwd", 20.0), _measured("ragdot-auto", "fwd", 30.0)], META)
    host.print_report(rows, META, console=None)
    out = capsys.readouterr().out
    assert "host µs per call, fwd" in out and "30.0 (1.50x, +10.0)" in out and "fwdbwd" not in out


def test_cli_writes_rows_of_every_usable_system(tmp_path, capsys):
    assert main(["host-bench", *FAST, "--out", str(tmp_path), "--commit", "abc"]) == 0
    (csv_path,) = tmp_path.glob("ragdot-host-cpu-abc-*.csv")
    with open(csv_path) as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [dict(zip(header, line)) for line in reader]
    assert header[:8] == ["gpu", "commit", "date", "shape", "system", "phase", "host_us", "ratio"]
    pairs = {(r["system"], r["phase"]) for r in rows}
    for system in ("raw", "raw+cumsum", "ragdot-torch", "ragdot-auto"):
        assert {(system, "fwd"), (system, "fwdbwd")} <= pairs
    assert {("empty_like", "fwd"), ("cumsum", "fwd")} <= pairs and ("cumsum", "fwdbwd") not in pairs
    assert all(float(r["host_us"]) > 0 and r["shape"] == "64,32,32,4" for r in rows)
    assert all(float(r["ratio"]) == 1.0 for r in rows if r["system"] == "raw+cumsum")
    meta = json.loads(csv_path.with_suffix(".json").read_text())["meta"]
    assert "ragdot-triton" in meta["left_out"] and not any(r["system"] == "ragdot-triton" for r in rows)
    assert "ragdot-triton left out" in capsys.readouterr().out
    # A second run in the same second gets a file of its own.
    assert main(["host-bench", *FAST, "--systems", "cumsum", "--out", str(tmp_path), "--commit", "abc"]) == 0
    assert len(list(tmp_path.glob("*.csv"))) == 2


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--calls", "0"], "--calls"),
        (["--repeats", "0"], "--repeats"),
        (["--warmup", "-1"], "--warmup"),
        (["--chunk", "-2"], "--chunk"),
        (["--max-seconds", "-1"], "--max-seconds"),
        (["--systems", "raw", "vendor"], "--systems"),
        (["--phases", "bwd"], "--phases"),
        (["--shapes", "no-such-shape"], "--shapes"),
        (["--shapes", "1,2,3"], "--shapes"),
        (["--dtype", "fp64"], "--dtype"),
        (["--routing", "zipf"], "--routing"),
        (["--device", "nonsense"], "--device"),
    ],
)
def test_cli_errors_are_one_line(argv, flag, tmp_path, capsys):
    assert main(["host-bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ragdot host-bench: error: {flag}") and "\n" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_cuda_without_cuda(capsys):
    assert main(["host-bench", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


class _FakeEvent:
    """A CUDA event stand-in on the host clock; `query()` answers from a shared script of booleans."""

    answers: list[bool] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.answers.pop(0) if self.answers else False

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3


# (early answers of query(), device-time passes run, device time given up): query() is asked once per chunk
# (3 chunks of a 20-call pass); a pass in which the GPU started early is repeated with a 4x longer hold, at
# most 4 tries per device sample, 2 samples.
@pytest.mark.parametrize("early,device_passes,gave_up", [(0, 2, False), (2, 3, False), (99, 8, True)])
def test_cuda_path_chunks_holds_and_retries(monkeypatch, early, device_passes, gave_up):
    """The CUDA branch with fake events: chunked passes, a hold per chunk, a longer hold when the GPU was early."""
    holds: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", holds.append, raising=False)
    monkeypatch.setattr(_FakeEvent, "answers", [True] * early)
    count = [0]

    def call() -> None:
        count[0] += 1

    timing = measure_host.time_host(call, torch.device("cuda"), calls=20, repeats=2, warmup=1, chunk=8)
    assert count[0] == 1 + 10 + 2 * 20 + 20 * device_passes  # warm-up, pilot, host passes, device passes
    assert timing.eager_us is not None and timing.eager_us >= 0
    assert (timing.device_us is None) == gave_up and (timing.host_bound is None) == gave_up
    assert len(holds) == 3 * device_passes and len(set(holds[:3])) == 1
    if early:
        assert holds[3] >= 4 * holds[0] - 4  # the repeated pass holds the GPU 4x longer


def test_interleaved_passes_alternate_between_calls():
    order: list[str] = []
    named = {name: (lambda n=name: order.append(n)) for name in ("a", "b")}
    timings = measure_host.time_host_interleaved(named, CPU, calls=2, repeats=3, warmup=1)
    assert set(timings) == {"a", "b"} and all(t.calls == 2 for t in timings.values())
    timed = order[2 * (1 + 2):]  # after each call's warm-up and pilot
    assert timed == ["a", "a", "b", "b"] * 3  # one pass of each per round


def test_async_batches_rotate_their_arguments_and_wait_as_asked():
    """`async_batch`: calls rotating over the argument sets, one wait for the last result ("block"), a spin on
    is_ready() first ("spin"), or a wait after every call ("each"); bad arguments name themselves."""
    from ragdot.measure.host import async_batch, async_us_per_call

    log = []

    class Result:
        def __init__(self, tag):
            self.tag, self.polls = tag, 0

        def is_ready(self):
            self.polls += 1
            log.append(("poll", self.tag))
            return self.polls > 2

        def block_until_ready(self):
            log.append(("wait", self.tag))
            return self

    def fn(tag):
        log.append(("call", tag))
        return Result(tag)

    async_batch(fn, [("a",), ("b",)], 3)()
    assert log == [("call", "a"), ("call", "b"), ("call", "a"), ("wait", "a")]
    log.clear()
    async_batch(fn, [("a",)], 2, wait="each")()
    assert log == [("call", "a"), ("wait", "a"), ("call", "a"), ("wait", "a"), ("wait", "a")]
    log.clear()
    async_batch(fn, [("a",)], 1, wait="spin")()
    assert log == [("call", "a"), ("poll", "a"), ("poll", "a"), ("poll", "a"), ("wait", "a")]
    assert async_us_per_call(fn, [("a",)], 4, repeats=3) > 0
    with pytest.raises(ValueError, match="wait"):
        async_batch(fn, [("a",)], 1, wait="later")
    with pytest.raises(ValueError, match="calls"):
        async_batch(fn, [], 1)
