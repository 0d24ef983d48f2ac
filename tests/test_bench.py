"""`ragdot bench`: shape table, routing generators, counting, the vendor baseline, correctness guard, CSV, CLI.

The clocks and checks are in test_measure.py, the summaries, tables and plots in test_bench_summary.py."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ragdot
from ragdot import routing
from ragdot.bench import runner
from ragdot.bench.ceilings import Ceilings, speed_of_light_s
from ragdot.bench.report import COLUMNS, result_rows, write_csv
from ragdot.bench.runner import BenchConfig, make_operands, normalised_error, run_cell
from ragdot.bench.systems import FunctionSystem, Operands, RagdotSystem, VendorSystem
from ragdot.cli import main
from ragdot.measure import timing
from ragdot.measure.classes import CLASS_NAMES, CLASSES, flops, get_class, min_bytes
from ragdot.shapes import SHAPES, Shape, get_shape, parse_shapes, shapes_with_tag

CPU = torch.device("cpu")
TINY = get_shape("tiny-8e")

# ---------------------------------------------------------------------------------------------- shapes

SEED_TABLE = {
    "deepseek2-16b": (3840, 2048, 1408, 64),
    "deepseek3-test": (5120, 512, 512, 256),
    "gemma4-26b": (10240, 2816, 704, 128),
    "qwen3-30b-a3b": (10240, 2048, 768, 128),
    "qwen3-235b-a22b": (20480, 4096, 1536, 128),
    "llama4-17b-16e": (1280, 5120, 8192, 16),
    "mixtral-8x7b": (15360, 6144, 20480, 32),
    "mixtral-8x7b-large": (40960, 8192, 28672, 64),
    "deepseek-v2-like": (1920, 5120, 1536, 160),
    "gpt-oss-120b-like": (10240, 2880, 2880, 128),
    "qwen3-next-like": (6400, 2048, 512, 512),
}
ANCHORS = {
    "deepseek2-16b",
    "deepseek3-test",
    "gemma4-26b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "llama4-17b-16e",
    "mixtral-8x7b",
    "gpt-oss-120b-like",
}


def test_seed_and_anchor_tags_match_the_tables():
    assert {s.name: s.dims for s in shapes_with_tag("seed")} == SEED_TABLE
    assert {s.name for s in shapes_with_tag("anchor")} == ANCHORS
    tiny = shapes_with_tag("tiny")
    assert tiny and all(s.M * s.K * s.N <= 1 << 22 and s.E >= 8 for s in tiny)
    assert len({s.name for s in SHAPES}) == len(SHAPES)


def test_shape_lookup_by_name_and_inline():
    assert get_shape("mixtral-8x7b").dims == (15360, 6144, 20480, 32)
    inline = get_shape(" 64, 32,16,4 ")
    assert inline.dims == (64, 32, 16, 4) and inline.spec == "64,32,16,4"
    got = parse_shapes(["tag:anchor", "mixtral-8x7b", "8,8,8,2"])
    assert len(got) == 9 and got[-1].dims == (8, 8, 8, 2)


@pytest.mark.parametrize("bad", ["nope", "1,2,3", "1,2,x,4", "0,2,3,4", "-1,2,3,4", "tag:nope"])
def test_bad_shapes_name_the_entry(bad):
    with pytest.raises(ValueError, match="nope|shape|tag"):
        parse_shapes([bad])
    with pytest.raises(TypeError, match="shape"):
        get_shape(12)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- routing


@pytest.mark.parametrize("m,e", [(3840, 64), (5120, 256), (1280, 16), (6400, 512), (100, 7), (7, 10)])
def test_balanced_is_the_seed_rule(m, e):
    gs = routing.balanced(m, e)
    assert gs.dtype == torch.int32 and gs.shape == (e,) and int(gs.sum()) == m
    expected = [m // e + (1 if i < m % e else 0) for i in range(e)]
    assert gs.tolist() == expected


@pytest.mark.parametrize("shape", [s for s in SHAPES if "seed" in s.tags], ids=lambda s: s.name)
def test_skewed_ramp_peaks_at_one_and_a_half_the_mean(shape):
    gs = routing.skewed(shape.M, shape.E).tolist()
    mean = shape.M / shape.E
    assert sum(gs) == shape.M
    assert abs(max(gs) - 1.5 * mean) <= 1 and abs(min(gs) - 0.5 * mean) <= 1
    steps = [b - a for a, b in zip(gs, gs[1:], strict=False)]
    assert min(steps) >= 0  # a ramp, ascending
    assert max(steps) - min(steps) <= 2  # linear up to rounding


@pytest.mark.parametrize("shape", [s for s in SHAPES if "seed" in s.tags], ids=lambda s: s.name)
def test_empty_routing_empties_every_eighth_expert(shape):
    gs = routing.empty(shape.M, shape.E).tolist()
    assert sum(gs) == shape.M
    empty = [i for i, g in enumerate(gs) if g == 0]
    assert empty == list(range(7, shape.E, 8))
    live = [g for g in gs if g > 0]
    assert abs(max(live) - 1.5 * shape.M / len(live)) <= 1


@pytest.mark.parametrize("kind", routing.ROUTINGS)
def test_round_to_keeps_multiples_and_the_sum(kind):
    for m, e, r in [(15360, 32, 256), (6400, 512, 32), (4096, 6, 32)]:
        gs = routing.group_sizes(kind, m, e, round_to=r)
        assert int(gs.sum()) == m and all(g % r == 0 for g in gs.tolist())
    with pytest.raises(ValueError, match="round_to"):
        routing.group_sizes(kind, 1000, 8, round_to=256)


def test_routed_sizes_are_one_seeded_draw_that_scatters_about_the_mean():
    """`routed`: the same sizes on every call, spread about the mean as a uniform router's (not the exact
    multiples of `balanced`), whole blocks with round_to."""
    first, again = routing.routed(32768, 128), routing.routed(32768, 128)
    assert torch.equal(first, again) and int(first.sum()) == 32768
    spread = first.double().std().item()
    assert 8 < spread < 32  # sqrt(256) = 16 for a uniform draw of 32768 rows over 128 experts
    assert sum(int(v) % 64 == 0 for v in first) < 16  # balanced: every one of them
    assert all(int(v) % 64 == 0 for v in routing.routed(32768, 128, round_to=64))


def test_routing_rejects_bad_arguments():
    with pytest.raises(ValueError, match="routing"):
        routing.group_sizes("zipf", 10, 2)
    with pytest.raises(ValueError, match="E must be"):
        routing.balanced(10, 0)
    with pytest.raises(ValueError, match="M must be"):
        routing.skewed(-1, 4)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 50_000), e=st.integers(1, 600), kind=st.sampled_from(routing.ROUTINGS))
def test_every_routing_sums_to_m(m, e, kind):
    gs = routing.group_sizes(kind, m, e, device=CPU)
    assert gs.device == CPU and gs.shape == (e,) and int(gs.sum()) == m and int(gs.min()) >= 0


# ------------------------------------------------------------------------------------ classes, counting


def _oracle(lhs, rhs, sizes, cls):
    """Independent einsum over the layout letters, group by group (float64)."""
    lhs, rhs = lhs.double(), rhs.double()
    ends = torch.cumsum(sizes.long(), 0).tolist()
    starts = [0, *ends[:-1]]
    dims = dict(zip(cls.lhs, lhs.shape, strict=True)) | dict(zip(cls.rhs, rhs.shape, strict=True))
    if "E" in cls.rhs:  # non-contracting: rows of group g use rhs[g]
        out = torch.zeros([dims[c] for c in cls.out], dtype=torch.float64)
        spec = f"{cls.lhs},{cls.rhs[1:]}->{cls.out}"
        for g, (a, b) in enumerate(zip(starts, ends, strict=True)):
            out[a:b] = torch.einsum(spec, lhs[a:b], rhs[g])
        return out
    spec = f"{cls.lhs},{cls.rhs}->{cls.out[1:]}"
    return torch.stack([torch.einsum(spec, lhs[a:b], rhs[a:b]) for a, b in zip(starts, ends, strict=True)])


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.name)
def test_class_dimension_numbers_give_the_documented_op(cls):
    shape = Shape("t", 40, 12, 20, 5)
    cfg = BenchConfig(CPU, torch.float32, Ceilings(1e11, 1e10))
    ops = make_operands(cls, shape, "empty", cfg)
    lhs_shape, rhs_shape, out_shape = cls.shapes(shape)
    assert tuple(ops.lhs.shape) == lhs_shape and tuple(ops.rhs.shape) == rhs_shape
    assert ops.lhs.abs().min() > 0 and ops.rhs.abs().min() > 0  # random normal, never zeros
    out = ragdot.ragged_dot_general(
        ops.lhs, ops.rhs, ops.group_sizes, cls.ragdot_dimension_numbers(), backend="reference"
    )
    assert tuple(out.shape) == out_shape
    assert normalised_error(out, _oracle(ops.lhs, ops.rhs, ops.group_sizes, cls)) < 1e-5


def test_flop_and_byte_counts():
    s = Shape("t", 10, 3, 7, 4)
    assert flops(s) == 2 * 10 * 3 * 7 and flops(s, tokens=6) == 2 * 6 * 3 * 7
    # every class reads a token operand of each width once, the weights once, and writes one of them
    expected = {
        "fwd_wi": 10 * 3 + 4 * 3 * 7 + 10 * 7,
        "fwd_wo": 10 * 7 + 4 * 7 * 3 + 10 * 3,
        "dgrad_wi": 10 * 7 + 4 * 3 * 7 + 10 * 3,
        "dgrad_wo": 10 * 3 + 4 * 7 * 3 + 10 * 7,
        "wgrad_wi": 10 * 3 + 10 * 7 + 4 * 3 * 7,
        "wgrad_wo": 10 * 7 + 10 * 3 + 4 * 7 * 3,
    }
    for name in CLASS_NAMES:
        assert min_bytes(get_class(name), s, 2) == 2 * expected[name]
        assert min_bytes(get_class(name), s, 2, out_itemsize=4) > 2 * expected[name]
    ceil = Ceilings(peak_flops=100.0, bandwidth=10.0)
    assert speed_of_light_s(1000, 10, ceil) == 10.0 and speed_of_light_s(100, 1000, ceil) == 100.0
    with pytest.raises(ValueError, match="class"):
        get_class("fwd_up")


# ----------------------------------------------------------------------- correctness guard, CSV schema


def _cfg() -> BenchConfig:
    return BenchConfig(CPU, torch.float32, Ceilings(1e11, 1e10), warmup=1, iters=3, max_seconds=0.2)


def _counting(name, fn):
    count = {"n": 0}

    def wrapped(lhs, rhs, sizes, cls, out_dtype):
        count["n"] += 1
        return fn(lhs, rhs, sizes, cls, out_dtype)

    return FunctionSystem(name, wrapped), count


def _right(lhs, rhs, sizes, cls, out_dtype):
    return _oracle(lhs, rhs, sizes, cls).to(out_dtype)


def _off_by_a_percent(lhs, rhs, sizes, cls, out_dtype):
    return _right(lhs, rhs, sizes, cls, out_dtype) * 1.01


def _nan(lhs, rhs, sizes, cls, out_dtype):
    out = _right(lhs, rhs, sizes, cls, out_dtype)
    out.view(-1)[0] = math.nan
    return out


def _oom(*args):
    raise torch.OutOfMemoryError("CUDA out of memory (simulated)")


def _unsupported(*args):
    raise NotImplementedError("not for this case")


@pytest.mark.parametrize("cls_name", ["fwd_wi", "wgrad_wo"])
def test_wrong_results_are_reported_and_never_timed(cls_name):
    right, n_right = _counting("right", _right)
    wrong, n_wrong = _counting("wrong", _off_by_a_percent)
    nan, n_nan = _counting("nan", _nan)
    systems = [right, wrong, nan, FunctionSystem("oom", _oom), FunctionSystem("na", _unsupported)]
    results = {r.backend: r for r in run_cell(TINY, get_class(cls_name), "skewed", systems, _cfg())}
    assert results["right"].status == "ok" and results["right"].ms > 0 and n_right["n"] > 3
    assert results["right"].err < 1e-5
    for name, count in (("wrong", n_wrong), ("nan", n_nan)):
        assert results[name].status == "wrong" and results[name].ms is None
        assert count["n"] == 1  # the check call only
    assert 5e-3 < results["wrong"].err < 2e-2 and math.isnan(results["nan"].err)
    assert results["oom"].status == "OOM" and results["oom"].ms is None
    assert results["na"].status == "n/a" and results["na"].ms is None


def test_without_a_reference_results_are_timed_but_marked_unchecked():
    right, _ = _counting("right", _right)
    results = run_cell(
        TINY, get_class("fwd_wo"), "balanced", [right], _cfg(), reference=FunctionSystem("r", _oom)
    )
    assert results[0].status == "unchecked" and results[0].ms > 0 and results[0].err is None
    assert results[0].note == "reference: OOM"


def test_csv_schema_and_speedups(tmp_path):
    systems = [
        RagdotSystem("padded"),
        RagdotSystem("reference"),
        RagdotSystem("auto"),
        FunctionSystem("wrong", _off_by_a_percent),
    ]
    results = run_cell(TINY, get_class("dgrad_wi"), "empty", systems, _cfg())
    meta = {
        "gpu": "cpu",
        "commit": "abc1234",
        "date": "2026-01-01T00:00:00",
        "dtype": "float32",
        "torch": torch.__version__,
        "peak_tflops": 0.1,
        "bandwidth_gbs": 10.0,
    }
    path = write_csv(result_rows(results, meta), tmp_path / "x.csv")
    with open(path) as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [dict(zip(header, r, strict=True)) for r in reader]
    assert ",".join(header[:13]) == "gpu,commit,shape,M,K,N,E,cls,routing,dtype,backend,ms,tflops"
    assert header == list(COLUMNS)
    for col in (
        "status",
        "p20",
        "p80",
        "pct_sol",
        "speedup_vs_padded",
        "speedup_vs_torch",
        "peak_mem_mb",
        "err",
    ):
        assert col in header
    by = {r["backend"]: r for r in rows}
    assert by["padded"]["status"] == "ok" and float(by["padded"]["speedup_vs_padded"]) == 1.0
    auto = by["auto"]
    assert auto["status"] == "ok" and float(auto["ms"]) > 0
    assert auto["note"].startswith("auto: ") and by["padded"]["note"] == ""  # what auto ran, per cell
    assert math.isclose(float(auto["tflops"]), flops(TINY) / float(auto["ms"]) / 1e9, rel_tol=1e-3)
    assert math.isclose(
        float(auto["speedup_vs_padded"]), float(by["padded"]["ms"]) / float(auto["ms"]), rel_tol=1e-3
    )
    assert by["wrong"]["status"] == "wrong" and by["wrong"]["ms"] == "" and by["wrong"]["tflops"] == ""



# -------------------------------------------------------------------------------------- vendor baseline

SMALL = Shape("small", 40, 16, 24, 5)  # every stride a multiple of 16 bytes in fp32, bf16 and fp16


def _profiled(call):
    """(result, Python functions entered, C functions called) of one call."""
    py, c = [], []

    def prof(frame, event, arg):
        if event == "call":
            py.append((frame.f_code.co_filename, frame.f_code.co_name))
        elif event == "c_call":
            c.append(getattr(arg, "__name__", str(arg)))

    sys.setprofile(prof)
    try:
        out = call()
    finally:
        sys.setprofile(None)
    return out, py, [name for name in c if name != "setprofile"]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.name)
def test_vendor_is_the_raw_grouped_mm_call_and_right(cls):
    cfg = BenchConfig(CPU, torch.float32, Ceilings(1e11, 1e10))
    ops = make_operands(cls, SMALL, "empty", cfg)
    (call,) = VendorSystem().prepare(cls, [ops], torch.float32)
    out, py, c = _profiled(call)
    assert c == ["cumsum", "_grouped_mm"]  # the user's two calls, nothing else
    assert len(py) == 1 and py[0][0].endswith("systems.py") and py[0][1] == "<lambda>"
    assert tuple(out.shape) == cls.shapes(SMALL)[2]
    assert normalised_error(out, _oracle(ops.lhs, ops.rhs, ops.group_sizes, cls)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vendor_passes_the_check_in_half_precision(dtype):
    cfg = BenchConfig(CPU, dtype, Ceilings(1e11, 1e10), warmup=1, iters=3, max_seconds=0.1)
    for name in ("dgrad_wi", "wgrad_wo"):
        (r,) = run_cell(SMALL, get_class(name), "skewed", [VendorSystem()], cfg)
        assert r.status == "ok" and r.ms > 0 and r.clock == "wall", r.note


def test_vendor_cells_are_na_where_grouped_mm_does_not_run(monkeypatch):
    cfg = BenchConfig(CPU, torch.bfloat16, Ceilings(1e11, 1e10), warmup=1, iters=3)
    odd = Shape("odd", 40, 12, 20, 5)  # bf16 rows of 24 bytes: torch._grouped_mm rejects the strides
    (r,) = run_cell(odd, get_class("fwd_wi"), "balanced", [VendorSystem()], cfg)
    assert r.status == "n/a" and r.ms is None and "_grouped_mm" in r.note
    ops = Operands(torch.ones(8, 4, dtype=torch.float64), torch.ones(2, 4, 4, dtype=torch.float64),
                   torch.tensor([4, 4], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="float64"):
        VendorSystem().prepare(get_class("fwd_wi"), [ops], torch.float64)
    monkeypatch.delattr(torch, "_grouped_mm")
    assert "no torch._grouped_mm" in ragdot.bench.systems.vendor_unavailable_reason(CPU, torch.float32)


def test_vendor_check_compares_only_the_rows_inside_groups():
    cls = get_class("fwd_wi")
    cfg = BenchConfig(CPU, torch.float32, Ceilings(1e11, 1e10))
    ops = make_operands(cls, SMALL, "balanced", cfg)
    ops.group_sizes = torch.tensor([8, 0, 12, 10, 0], dtype=torch.int32)  # 30 of 40 rows in groups
    ref = ragdot.ragged_dot_general(ops.lhs, ops.rhs, ops.group_sizes, cls.ragdot_dimension_numbers(),
                                    backend="reference")
    (call,) = VendorSystem().prepare(cls, [ops], torch.float32)
    out = call()
    out[30:] = math.nan  # what uninitialised rows may hold
    mine, theirs = VendorSystem().compared(out, ref, cls, ops)
    assert mine.shape == (30, SMALL.N) and normalised_error(mine, theirs) < 1e-5
    assert math.isnan(normalised_error(out, ref))
    status, err, _, _ = runner._check(VendorSystem(), lambda: out, ref, cfg, cls, [ops])
    assert status == "ok" and err < 1e-5
    wgrad = get_class("wgrad_wi")
    assert VendorSystem().compared(out, ref, wgrad, ops) == (out, ref)  # no uninitialised part there



# ------------------------------------------------------------------------------------------------- CLI


def test_quick_run_end_to_end(tmp_path, capsys):
    code = main(
        [
            "bench",
            "--quick",
            "--classes",
            "fwd_wi",
            "wgrad_wo",
            "--routing",
            "balanced",
            "empty",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
            "--no-xla",
            "--backends",
            "padded",
            "torch",
            "auto",
            "reference",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    csvs, jsons, mds = (list(tmp_path.glob(f"*.{ext}")) for ext in ("csv", "json", "md"))
    assert len(csvs) == 1 and len(jsons) == 1 and len(mds) == 1 and len(list(tmp_path.glob("*.png"))) >= 2
    assert "-cpu-" in csvs[0].name
    data = json.loads(jsons[0].read_text())
    backends = {r["backend"] for r in data["rows"]}
    assert {"vendor", "auto", "padded", "reference"} <= backends  # vendor joins every run
    assert len(data["rows"]) == 2 * 2 * 2 * len(backends)  # shapes x classes x routings x backends, one clock
    assert all(r["status"] in ("ok", "n/a") for r in data["rows"])
    assert {r["clock"] for r in data["rows"]} == {"wall"} and data["meta"]["clocks"] == ["wall"]
    assert all(r["host_ms"] and r["host_bound"] == "" for r in data["rows"] if r["status"] == "ok")
    vendor = [r for r in data["rows"] if r["backend"] == "vendor"]
    assert all(r["status"] == "ok" and r["speedup_vs_vendor"] == 1.0 for r in vendor)
    assert "auto" in out and "TFLOP/s" in out and "x vendor" in out
    assert "wall clock" in mds[0].read_text()


def test_cli_dry_run_and_bad_options(capsys):
    assert main(["bench", "--anchors", "--routing", "balanced", "skewed", "--dry-run", "--no-xla"]) == 0
    out = capsys.readouterr().out
    assert "8 shapes x 6 classes x 2 routings = 96 cells" in out and "estimated time" in out
    assert main(["bench", "--shapes", "nope", "--dry-run"]) == 2
    assert "--shapes" in capsys.readouterr().err
    assert main(["bench", "--backends", "cublas", "--dry-run"]) == 2
    assert "--backends" in capsys.readouterr().err
    assert main(["bench", "--cuda-graphs", "--clocks", "eager", "--dry-run"]) == 2
    assert "--cuda-graphs" in capsys.readouterr().err
    assert main(["bench", "--clocks", "graph", "--dry-run", "--no-xla"]) == 0
    assert "systems: vendor, " in capsys.readouterr().out
    assert main(["bench", "--no-vendor", "--dry-run", "--no-xla"]) == 0
    assert "vendor" not in capsys.readouterr().out


def test_clock_options():
    from ragdot.bench.cli import _clocks

    ns = lambda clocks=None, graphs=False: argparse.Namespace(clocks=clocks, cuda_graphs=graphs)
    assert _clocks(ns(), cuda=True) == ("eager", "graph")
    assert _clocks(ns(graphs=True), cuda=True) == ("graph",) == _clocks(ns(["graph"], True), cuda=True)
    assert _clocks(ns(["graph", "eager"]), cuda=True) == ("eager", "graph")
    assert _clocks(ns(["eager"]), cuda=False) == ("wall",)
    with pytest.raises(ValueError, match="--cuda-graphs"):
        _clocks(ns(["eager"], True), cuda=True)


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_cell_both_clocks_vendor_memory_and_xla():
    from ragdot.bench.xla import XlaSystem, xla_unavailable_reason

    dev = torch.device("cuda")
    cfg = BenchConfig(dev, torch.bfloat16, Ceilings(700e12, 4e12), warmup=2, iters=20, max_seconds=0.5)
    shape = Shape("g", 4096, 1024, 512, 16)
    systems = [VendorSystem(), *(RagdotSystem(n) for n in ("padded", "torch", "auto", "reference"))]
    if xla_unavailable_reason(dev) is None:
        systems.append(XlaSystem(dev))
    rows = run_cell(shape, get_class("fwd_wi"), "skewed", systems, cfg)
    res = {(r.backend, r.clock): r for r in rows}
    assert all(r.status == "ok" and r.ms > 0 and r.host_ms > 0 for r in rows), {k: r.note for k, r in res.items()}
    for name in ("vendor", "padded", "torch", "auto"):
        assert {(name, "eager"), (name, "graph")} <= set(res)
        eager = res[(name, "eager")]  # EAGER_BATCH calls a sample, fewer where the time budget allows few calls
        assert 1 <= eager.batch <= timing.EAGER_BATCH and eager.iters % eager.batch == 0
        assert res[(name, "graph")].batch == 1
    assert ("reference", "eager") in res and ("reference", "graph") not in res  # it cannot be captured
    assert res[("vendor", "graph")].speedup_vs_vendor == 1.0
    assert res[("torch", "graph")].speedup_vs_vendor == pytest.approx(
        res[("vendor", "graph")].ms / res[("torch", "graph")].ms
    )
    out_mb = shape.M * shape.N * 2 / 2**20
    assert res[("torch", "eager")].peak_mem_mb >= 0.99 * out_mb
    assert res[("padded", "eager")].peak_mem_mb > 0.9 * shape.E * out_mb  # the E-fold temporaries of the baseline
    assert res[("torch", "graph")].speedup_vs_padded > 1
    if ("xla", "batch") in res:
        assert res[("xla", "batch")].peak_mem_mb >= 0.99 * out_mb
        assert res[("xla", "batch")].speedup_vs_vendor is not None  # compared in the eager view
    graph_only = dataclasses.replace(cfg, clocks=("graph",))
    rows = run_cell(shape, get_class("wgrad_wi"), "empty", systems[:1] + systems[-2:], graph_only)
    assert {(r.backend, r.clock) for r in rows} >= {("vendor", "graph"), ("reference", "eager")}


@pytest.mark.gpu
def test_cuda_vendor_is_not_ragdot_and_matches_every_class():
    dev = torch.device("cuda")
    cfg = BenchConfig(dev, torch.bfloat16, Ceilings(700e12, 4e12), warmup=1, iters=3, max_seconds=0.2)
    for cls in CLASSES:
        for routing_name in routing.ROUTINGS:
            (r,) = [r for r in run_cell(Shape("g", 1024, 256, 128, 8), cls, routing_name, [VendorSystem()], cfg)
                    if r.clock == "graph"]
            assert r.status == "ok", (cls.name, routing_name, r.note)
