"""`ragdot moe-bench --eager`: the variants' train steps timed in interleaved rounds (CPU, tiny config)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ragdot.bench import moe_train
from ragdot.moe.model import get_config
from ragdot.moe.variants import VARIANTS, Variant

CPU = torch.device("cpu")
A, B, C = "sparse-torch", "dense_drop", "dense_dropless"
NAME_OF = {variant: name for name, variant in VARIANTS.items()}

Step = tuple[str, bool | str]  # (variant, timed) of one train step: True, False or "loop" (the loop clock's)


def _args(variants: list[str], **overrides: Any) -> argparse.Namespace:
    args = {"steps": 4, "measure_from": 1, "max_seconds": 60.0, "no_profile": True, "routing_impl": "torch",
            "eager": True, "variants": variants}  # fmt: skip
    return argparse.Namespace(**(args | overrides))


def _variant_of(model) -> str:
    layer = model.moe_layers[0]
    return NAME_OF[Variant(layer.path, layer.backend, layer.fused, layer.recompute)]


@pytest.fixture
def steps(monkeypatch) -> list[Step]:
    """Every train step run_config makes, in order: the variant the model is set to and whether it is timed."""
    log: list[Step] = []
    timing: list[bool | str] = [False]
    real_step, real_event_ms, real_loop_ms = moe_train._train_step, moe_train.event_ms, moe_train.loop_ms

    def train_step(model, opt, tokens) -> None:
        log.append((_variant_of(model), timing[0]))
        real_step(model, opt, tokens)

    def event_ms(fn: Callable[[], Any], device: torch.device) -> float:
        timing[0] = True
        try:
            return real_event_ms(fn, device)
        finally:
            timing[0] = False

    def loop_ms(fn: Callable[[], Any], device: torch.device, calls: int, repeats: int = 3) -> float:
        timing[0] = "loop"
        try:
            return real_loop_ms(fn, device, calls, repeats)
        finally:
            timing[0] = False

    monkeypatch.setattr(moe_train, "_train_step", train_step)
    monkeypatch.setattr(moe_train, "event_ms", event_ms)
    monkeypatch.setattr(moe_train, "loop_ms", loop_ms)
    return log


def _run(args: argparse.Namespace, stop: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
    emitted: list[dict[str, Any]] = []
    rows = moe_train.run_config(get_config("tiny"), args, CPU, torch.float32, emitted.append, stop)
    assert emitted == rows
    return rows


def _visits(log: list[Step]) -> list[tuple[str, int]]:
    """The timed visits: (variant, timed steps), each checked to follow one untimed step of its variant."""
    visits: list[tuple[str, int]] = []
    for i, (name, timed) in enumerate(log):
        if timed is not True:
            continue
        if log[i - 1] == (name, True):
            visits[-1] = (name, visits[-1][1] + 1)
        else:
            assert log[i - 1] == (name, False), f"timed step {i} of {name} not after an untimed one: {log}"
            visits.append((name, 1))
    return visits


def test_two_variants_alternate_round_by_round(steps):
    rows = _run(_args([A, B]))
    assert [r["variant"] for r in rows] == [A, B]
    for row in rows:
        assert row["status"] == "ok" and row["mode"] == "eager (interleaved)", row
        assert row["steps"] == 4 and row["step_s"] > 0 and row["config"] == "tiny"
    assert steps[:4] == [(A, False), (A, False), (B, False), (B, False)]  # the warm-ups, one variant each
    assert _visits(steps) == [(A, 2), (B, 2), (B, 2), (A, 2)]  # the first variant rotates round by round


def test_each_visit_ends_with_as_many_steps_back_to_back(steps):
    """The loop clock: after a visit's steps timed one by one, as many of the same variant in one loop."""
    rows = _run(_args([A, B]))
    assert all(r["loop_step_s"] > 0 for r in rows)
    visit = [(A, False), (A, True), (A, True), (A, "loop"), (A, "loop")]
    assert steps[4:9] == visit
    assert [name for name, timed in steps if timed == "loop"] == [A, A, B, B, B, B, A, A]


def test_rotation_changes_which_variant_comes_first(steps):
    rows = _run(_args([A, B, C]))
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert [name for name, _ in _visits(steps)] == [A, B, C, B, C, A]


def test_a_spent_time_budget_still_gives_every_variant_three_steps(steps):
    rows = _run(_args([A, B], steps=10, max_seconds=0.0))
    assert [r["steps"] for r in rows] == [3, 3]
    assert _visits(steps) == [(A, 2), (B, 2), (B, 1), (A, 1)]


@pytest.mark.parametrize("fail_at", [1, 6, 8], ids=["warm-up", "first-loop", "second-round"])
def test_a_failing_variant_leaves_the_rotation_and_the_other_keeps_going(steps, monkeypatch, fail_at):
    """B raises at its fail_at-th step (1: its first warm-up step; 6: in its first visit's loop; 8: its visit
    of the second round: two warm-up steps, then a visit of one untimed, two timed and two looped steps)."""
    counted = moe_train._train_step

    def failing(model, opt, tokens) -> None:
        counted(model, opt, tokens)
        if sum(name == B for name, _ in steps) == fail_at and _variant_of(model) == B:
            raise RuntimeError("kernel failed (simulated)")

    monkeypatch.setattr(moe_train, "_train_step", failing)
    ok, failed = _run(_args([A, B], steps=6))
    assert failed["status"] == "error" and "kernel failed (simulated)" in failed["note"], failed
    assert "step_s" not in failed
    assert ok["status"] == "ok" and ok["steps"] == 6 and ok["mode"] == "eager (interleaved)", ok
    assert sum(name == B for name, _ in steps) == fail_at  # no step of B after its failure
    assert [name for name, _ in _visits(steps)][-2:] == [A, A]  # A keeps being timed alone


def test_the_budget_stop_skips_the_variants_not_yet_warmed_up(steps):
    asked: list[bool] = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) > 1

    rows = _run(_args([A, B]), stop)
    assert [r["status"] for r in rows] == ["ok", "skipped"]
    assert rows[1]["note"] == "the run's --budget was spent"
    assert {name for name, _ in steps} == {A}


def test_an_unavailable_variant_gets_its_row_and_no_steps(steps, monkeypatch):
    import ragdot

    monkeypatch.setattr(ragdot, "backends", lambda: ("reference", "torch"))
    rows = _run(_args([A, "sparse-triton", B]))
    assert [r["status"] for r in rows] == ["ok", "unavailable", "ok"]
    assert rows[0]["mode"] == rows[2]["mode"] == "eager (interleaved)"
    assert {name for name, _ in steps} == {A, B}


@pytest.mark.parametrize("eager,variants", [(False, [A, B]), (True, [A])], ids=["graph-mode", "one-variant"])
def test_one_variant_after_another_without_interleaving(steps, eager, variants):
    """Not eager (CUDA graphs; off CUDA eager steps) or a single variant: each variant's steps back to back."""
    rows = _run(_args(variants, eager=eager))
    assert [r["mode"] for r in rows] == ["eager"] * len(variants)
    assert [name for name, timed in steps if timed] == [v for v in variants for _ in range(4)]


def test_interleaved_rows_carry_the_profile_of_their_own_variant(steps):
    rows = _run(_args([A, B], steps=3, no_profile=False))
    sparse, dense = rows
    assert sparse["status"] == dense["status"] == "ok"
    assert sparse["moe_ms"] > 0 and sparse["routing_share"] is not None
    assert sparse["gemm_ms"] > 0 and sparse["routing_ms"] > 0
    assert dense["moe_ms"] > 0 and dense["routing_share"] is None
    assert dense["routing_ms"] == dense["gemm_ms"] == 0  # profiled as dense_drop, though sparse-torch ran last
