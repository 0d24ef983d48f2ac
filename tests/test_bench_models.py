"""`ragdot bench-models` on the CPU: a tiny config end to end, the run plan, the budget and the ratios."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("transformers", minversion="5")

from ragdot.bench import models as bm  # noqa: E402
from ragdot.cli import main  # noqa: E402


def _rows(out):
    (path,) = out.glob("bench-models-*.json")
    doc = json.loads(path.read_text())
    assert list(out.glob("bench-models-*.csv"))
    return doc["meta"], doc["rows"]


def test_tiny_run_writes_rows_with_times_memory_and_ratios(tmp_path):
    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "ragdot", "--phases", "train", "decode",
                 "--decode-batches", "2", "--steps", "1", "--warmup", "0", "--out", str(tmp_path), "-q"])
    assert code == 0
    meta, rows = _rows(tmp_path)
    assert [(r["phase"], r["batch"], r["impl"]) for r in rows] == [
        ("train", 2, "grouped_mm"), ("train", 2, "ragdot"), ("decode", 2, "grouped_mm"), ("decode", 2, "ragdot")
    ]
    assert all(r["status"] == "ok" and r["ms"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["tokens"] == 32 and rows[2]["tokens"] == 2
    assert all("vs_grouped_mm" in r for r in rows if r["impl"] == "ragdot")
    assert "wall clock" in json.dumps(meta)
    assert all(r["timing"] == "interleaved" for r in rows)
    assert [r["steps"] for r in rows] == [1, 1, 4, 4]  # decode: four times --steps


def test_autocast_runs_each_forward_in_the_region_and_the_backward_outside(tmp_path, monkeypatch):
    """--autocast: float32 parameters (--dtype fp32), every forward inside torch.autocast, the loss's backward
    outside it (a mixed-precision trainer's step); recorded in the run's meta; a bad dtype is one clear error."""
    import torch

    states = []
    real = bm._in_autocast

    def spy(run, dtype):
        wrapped = real(run, dtype)

        def forward(ids, **kwargs):
            out = wrapped(ids, **kwargs)
            states.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), out.logits.dtype))
            return out
        return forward

    monkeypatch.setattr(bm, "_in_autocast", spy)
    code = main(["bench-models", "--tiny", "--impls", "ragdot", "--phases", "train", "--dtype", "fp32",
                 "--autocast", "bf16", "--steps", "1", "--warmup", "0", "--out", str(tmp_path), "-q"])
    assert code == 0
    meta, rows = _rows(tmp_path)
    assert meta["autocast"] == "bfloat16" and rows[0]["status"] == "ok"
    # the logits of the float32 model came out of the region in bfloat16; autocast is off again after the forward
    assert states and all(s == (False, torch.bfloat16, torch.bfloat16) for s in states)
    for bad in ("fp32", "int8"):
        assert main(["bench-models", "--tiny", "--autocast", bad, "--out", str(tmp_path), "-q"]) == 2


def test_interleaved_rounds_visit_each_implementation_and_a_failure_ends_only_its_lane(tmp_path, monkeypatch):
    """Eager implementations of one (model, phase, batch) take turns; one that fails gets its status, the others
    finish their steps. --sequential times them one after the other."""
    visits = []
    real = bm._step_fn

    def step_fn(item, model, run, device):
        for fn in real(item, model, run, device):
            def step(fn=fn, impl=item.impl):
                visits.append(impl)
                if impl == "ragdot" and visits.count("ragdot") > 1:  # its warm-up passes, then it fails
                    raise RuntimeError("broken implementation")
                fn()
            yield step

    monkeypatch.setattr(bm, "_step_fn", step_fn)
    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "ragdot", "ragdot_torch", "--phases", "train",
                 "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "a"), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path / "a")
    by = {r["impl"]: r for r in rows}
    assert by["ragdot"]["status"] == "error" and "broken implementation" in by["ragdot"]["note"]
    assert by["grouped_mm"]["status"] == by["ragdot_torch"]["status"] == "ok"
    assert by["grouped_mm"]["steps"] == by["ragdot_torch"]["steps"] == 2
    # a warm-up step each, then a visit each: one untimed step and two timed ones (ragdot's first one fails)
    assert visits == ["grouped_mm", "ragdot", "ragdot_torch"] + ["grouped_mm"] * 3 + ["ragdot"] + ["ragdot_torch"] * 3
    visits.clear()
    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "ragdot_torch", "--phases", "train",
                 "--steps", "2", "--warmup", "1", "--sequential", "--out", str(tmp_path / "b"), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path / "b")
    assert [r["timing"] for r in rows] == ["sequential", "sequential"]
    assert visits == ["grouped_mm"] * 3 + ["ragdot_torch"] * 3


def test_ragdot_unfused_is_registered_without_the_fused_block(tmp_path):
    import ragdot.integrations.transformers as rt

    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "ragdot_unfused", "--phases", "train", "--steps",
                 "1", "--warmup", "0", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert [r["impl"] for r in rows] == ["grouped_mm", "ragdot_unfused"] and all(r["status"] == "ok" for r in rows)
    assert "vs_grouped_mm" in rows[1]
    assert rt.is_registered("ragdot_unfused") and (None, False) in rt._FORWARDS


def test_no_experts_row_is_the_bound_and_does_no_expert_work(tmp_path):
    """The no_experts step: every layer's experts output is its input scaled by the routing weights' sum, no
    expert weight is read; its row carries grouped_mm's ms over its own as the bound, not a speed-up."""
    import torch

    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "no_experts", "--phases", "train", "--steps",
                 "1", "--warmup", "0", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert [r["impl"] for r in rows] == ["grouped_mm", "no_experts"] and all(r["status"] == "ok" for r in rows)
    assert rows[1]["bound_vs_grouped_mm"] == pytest.approx(rows[0]["ms"] / rows[1]["ms"])
    assert "vs_grouped_mm" not in rows[1]
    h = torch.randn(5, 4, dtype=torch.float64)
    w = torch.rand(5, 2, dtype=torch.float64, requires_grad=True)
    out = bm._no_experts(torch.nn.Module(), h, torch.zeros(5, 2, dtype=torch.long), w)
    torch.testing.assert_close(out, h * (w[:, :1] + w[:, 1:]), rtol=0, atol=0)
    out.sum().backward()
    torch.testing.assert_close(w.grad, h.sum(-1, keepdim=True).expand(5, 2))


@pytest.mark.parametrize("impls", [["ragdot"], ["grouped_mm", "ragdot"]], ids=["alone", "interleaved"])
def test_profile_adds_kernel_time_and_top_kernels(tmp_path, impls):
    code = main(["bench-models", "--tiny", "--impls", *impls, "--phases", "train", "--steps", "1", "--warmup",
                 "0", "--profile", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert [r["impl"] for r in rows] == impls
    assert all(r["status"] == "ok" and r["kernel_ms"] > 0 and "=" in r["top_kernels"] for r in rows)


def test_compiled_train_step_runs(tmp_path):
    code = main(["bench-models", "--tiny", "--impls", "ragdot", "--modes", "compile", "--compile-backend",
                 "aot_eager", "--phases", "train", "--steps", "1", "--warmup", "0", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert [(r["mode"], r["status"]) for r in rows] == [("compile", "ok")]


def test_compiled_implementations_are_interleaved_on_one_compile(tmp_path, monkeypatch):
    """Compiled rows of one (model, phase, batch) take turns like eager ones, each visit running its own
    implementation's cached graph: no graph is compiled during timed steps, and the model is compiled once."""
    compiles, lengths = [], []
    real = bm.torch.compile

    def compile_(*a, **k):
        compiles.append(1)
        fn = real(*a, **k)

        def call(ids, **kw):  # the token count of each compiled call
            lengths.append(ids.shape[1])
            return fn(ids, **kw)

        return call

    monkeypatch.setattr(bm.torch, "compile", compile_)
    code = main(["bench-models", "--tiny", "--impls", "grouped_mm", "ragdot", "--modes", "compile",
                 "--compile-backend", "aot_eager", "--phases", "decode", "--decode-batches", "2", "--steps", "2",
                 "--warmup", "1", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert [(r["impl"], r["status"], r["timing"]) for r in rows] == [
        ("grouped_mm", "ok", "interleaved"), ("ragdot", "ok", "interleaved")]
    assert all(r["steps"] == 8 and not r.get("note") for r in rows)
    assert compiles == [1]
    assert lengths and set(lengths) == {1}  # the prompt runs eagerly: no prefill graph is compiled for decode


def test_spent_budget_writes_the_rest_as_budget_rows(tmp_path):
    code = main(["bench-models", "--tiny", "--budget", "1e-9", "--out", str(tmp_path), "-q"])
    assert code == 0
    _, rows = _rows(tmp_path)
    assert rows and all(r["status"] == "budget" for r in rows)


def _args(**kw):
    base = dict(modes=["eager", "compile"], phases=["train", "decode"], impls=["grouped_mm", "ragdot", "eager"],
                decode_batches=[1, 8], eager_impl_phases=["train"])
    return argparse.Namespace(**{**base, **kw})


def test_plan_runs_the_eager_loop_only_where_asked():
    items = bm.plan([bm.MODELS["qwen3-moe"]], _args())
    assert [i.impl for i in items if i.mode == "compile"].count("eager") == 0
    assert [(i.phase, i.mode) for i in items if i.impl == "eager"] == [("train", "eager")]
    assert items[0].tokens() == 8192  # the config: 4 x 2048 tokens
    assert len(items) == 3 + 2 * 2 + 2 + 2 * 2
    two = bm.plan([bm.MODELS["qwen3-moe"], bm.MODELS["gpt-oss"]], _args(impls=["ragdot"]))
    assert [(i.mode, i.model.name, i.phase) for i in two][:5] == [
        ("eager", "qwen3-moe", "train"), ("eager", "gpt-oss", "train"),
        ("compile", "qwen3-moe", "train"), ("compile", "gpt-oss", "train"), ("eager", "qwen3-moe", "decode"),
    ]  # every model's train steps, eager and compiled, before any decode


def test_relative_compares_with_grouped_mm_of_the_same_group():
    key = dict(model="m", mode="eager", phase="train", batch=1, tokens=8)
    rows = [key | dict(impl="grouped_mm", ms=10.0, peak_gib=2.0, status="ok"),
            key | dict(impl="ragdot", ms=5.0, peak_gib=1.0, status="ok"),
            key | dict(impl="ragdot_fused", status="OOM"),
            key | dict(impl="ragdot", ms=5.0, status="ok", batch=2)]  # fmt: skip
    rows.append(key | dict(impl="no_experts", ms=4.0, status="ok"))
    bm.relative(rows)
    assert rows[1]["vs_grouped_mm"] == 2.0 and rows[1]["mem_vs_grouped_mm"] == 0.5
    assert rows[4]["bound_vs_grouped_mm"] == 2.5 and "vs_grouped_mm" not in rows[4]
    assert "vs_grouped_mm" not in rows[2] and "vs_grouped_mm" not in rows[3]


@pytest.mark.parametrize("argv, match", [(["--steps", "0"], "--steps"), (["--decode-batches", "0"], "decode"),
                                         (["--layers", "0"], "--layers")])
def test_bad_arguments_exit_with_one_line(tmp_path, capsys, argv, match):
    assert main(["bench-models", "--tiny", *argv, "--out", str(tmp_path)]) == 2
    assert match in capsys.readouterr().err
