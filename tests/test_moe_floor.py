"""`moe-bench`'s floor: the train step without routed-expert work (`no_experts`), and the bounds and routed
rates that the report derives from it (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from ragdot.bench.moe_report import check_targets, relative, routed_sol_s
from ragdot.moe import MoELayer
from ragdot.moe.variants import DEFAULT_VARIANTS, FLOOR, VARIANTS


def _layer(shared: int = 0) -> MoELayer:
    torch.manual_seed(0)
    return MoELayer(16, 12, 6, 2, dtype=torch.float64, backend="reference", num_shared_experts=shared)


def test_the_floor_scales_each_token_by_its_routing_weights_and_keeps_the_router_trained():
    layer = _layer()
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    VARIANTS[FLOOR].apply(layer)
    y = layer(x)
    weights = layer.router(x.detach().reshape(-1, 16)).weights.sum(-1, keepdim=True)
    assert torch.equal(y.detach(), (x.detach().reshape(-1, 16) * weights).reshape(x.shape))
    assert torch.equal(layer.expert_counts.sum(), torch.tensor(3 * 7 * 2, dtype=torch.int32))
    (y.square().sum() + layer.aux_loss + layer.z_loss).backward()
    assert layer.router.weight.grad.abs().sum() > 0  # the router still learns
    assert layer.w_gate_up.grad is None and layer.w_down.grad is None  # no routed-expert work at all


def test_another_variant_restores_the_routed_experts():
    layer, plain = _layer(shared=1), _layer(shared=1)
    x = torch.randn(20, 16, dtype=torch.float64)
    VARIANTS[FLOOR].apply(layer)
    assert not torch.equal(layer(x), plain(x))
    VARIANTS["sparse-unfused"].apply(layer)
    assert "_sparse" not in vars(layer) and type(plain)._sparse is MoELayer._sparse  # the class untouched
    assert torch.equal(layer(x), plain(x))


def test_the_floor_is_a_default_train_variant_and_not_a_layer_variant(tmp_path):
    from ragdot.cli import main

    assert FLOOR in DEFAULT_VARIANTS
    assert main(["moe-bench", "--layer", "--quick", "--variants", FLOOR, "--out", str(tmp_path)]) == 2


def _row(variant: str, step: float, sol_ms: float | None = 0.5, mode: str = "graph") -> dict:
    return {"config": "c", "variant": variant, "status": "ok", "step_s": step, "experts": 64, "moe_gflop": 300.0,
            "routed_sol_ms": sol_ms, "mode": mode}


def test_bounds_and_routed_rates_from_the_floor():
    rows = [_row("sparse-auto", 0.040), _row("dense_drop", 0.050), _row(FLOOR, 0.030), _row("sparse-padded", 0.2)]
    relative(rows, matmul_tflops=600.0)
    sparse, drop, floor, _ = rows
    assert floor["bound_vs_dense_drop"] == pytest.approx(0.050 / 0.030)
    assert floor["bound_at_sol"] == pytest.approx(0.050 / (0.030 + 0.0005))
    assert "speedup_vs_dense_drop" not in floor  # a floor is no result
    assert sparse["routed_ms"] == pytest.approx(10.0) and drop["routed_ms"] == pytest.approx(20.0)
    assert sparse["routed_tflops"] == pytest.approx(300e9 / 0.010 / 1e12)
    assert sparse["routed_pct"] == pytest.approx(100 * 30.0 / 600.0)
    assert sparse["routed_sol_pct"] == pytest.approx(5.0) and drop["routed_sol_pct"] == pytest.approx(2.5)
    assert sparse["speedup_vs_dense_drop"] == pytest.approx(1.25)


def test_without_the_floor_or_the_ceilings_nothing_is_derived():
    rows = [_row("sparse-auto", 0.040), _row("dense_drop", 0.050)]
    relative(rows)
    assert rows[0]["routed_ms"] is None and rows[0]["routed_tflops"] is None and rows[0]["routed_sol_pct"] is None
    rows = [_row("sparse-auto", 0.040, None), _row("dense_drop", 0.050, None), _row(FLOOR, 0.030, None)]
    relative(rows)
    assert rows[2]["bound_vs_dense_drop"] == pytest.approx(5 / 3) and rows[2]["bound_at_sol"] is None
    assert rows[0]["routed_ms"] == pytest.approx(10.0) and rows[0]["routed_pct"] is None


def test_eager_steps_get_the_bound_only():
    """An eager floor is host time, which a real step's device work hides: no routed time or speed-of-light
    bound from it."""
    rows = [_row(v, t, mode="eager (interleaved)") for v, t in (("sparse-auto", 0.0505), ("dense_drop", 0.062),
                                                                (FLOOR, 0.0403))]
    relative(rows, matmul_tflops=600.0)
    assert rows[2]["bound_vs_dense_drop"] == pytest.approx(0.062 / 0.0403) and rows[2]["bound_at_sol"] is None
    assert rows[0]["routed_ms"] is None and rows[0]["routed_sol_pct"] is None
    assert rows[0]["speedup_vs_dense_drop"] == pytest.approx(0.062 / 0.0505)
    assert rows[0]["loop_vs_dense_drop"] is None  # no loop clock on these rows
    rows[0]["loop_step_s"], rows[1]["loop_step_s"] = 0.045, 0.060
    relative(rows, matmul_tflops=600.0)
    assert rows[0]["loop_vs_dense_drop"] == pytest.approx(0.060 / 0.045) and rows[1]["loop_vs_dense_drop"] == 1.0


def test_the_dense_drop_check_shows_the_floors_bounds():
    rows = [_row("sparse-auto", 0.040), _row("dense_drop", 0.050), _row(FLOOR, 0.032)]
    relative(rows, matmul_tflops=600.0)
    goals = {"fast_variants": ["sparse-auto"], "faster_than": [{"baseline": "dense_drop", "min_ratio": 1.3}]}
    ((text, passed, numbers),) = check_targets(rows, goals)
    assert passed is False
    assert numbers == "1.25x (floor: at most 1.56x, 1.54x with the routed GEMMs at speed of light)"


def test_routed_speed_of_light_takes_the_slower_of_compute_and_bytes_per_pass():
    from ragdot.moe.model import get_config

    cfg = get_config("tiny")  # 2 layers, dim 64, hidden 32, 8 experts, top-2, 64 tokens: 128 routed rows
    rows, d, h, e = 128, 64, 32, 8
    up, down = 2 * rows * d * 2 * h, 2 * rows * h * d
    assert routed_sol_s(cfg, 1e12, 1e30, 2) == pytest.approx(2 * 3 * (up + down) / 1e12)  # compute-bound
    up_bytes = 2 * (rows * d + e * d * 2 * h + rows * 2 * h)  # every pass reads two operands, writes one
    down_bytes = 2 * (rows * h + e * h * d + rows * d)
    assert routed_sol_s(cfg, 1e30, 1e9, 2) == pytest.approx(2 * 3 * (up_bytes + down_bytes) / 1e9)


def test_moe_bench_quick_with_the_floor(tmp_path):
    from ragdot.cli import main

    assert main(["moe-bench", "--quick", "--variants", "sparse-torch", "dense_drop", FLOOR, "--out",
                 str(tmp_path)]) == 0  # fmt: skip
    (results,) = tmp_path.glob("moe-bench-*.json")
    data = json.loads(results.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert data["meta"]["matmul_tflops"] > 0
    assert rows[FLOOR]["status"] == "ok" and rows[FLOOR]["path"] == "none" and rows[FLOOR]["tflops"] is None
    assert rows[FLOOR]["bound_vs_dense_drop"] > 0 and rows[FLOOR]["bound_at_sol"] is None  # eager steps here
    assert data["meta"]["copy_gbs"] > 0 and rows["sparse-torch"]["routed_sol_ms"] == rows[FLOOR]["routed_sol_ms"] > 0
    assert "routing_ms" not in rows[FLOOR]  # nothing routed to profile
    assert rows["sparse-torch"]["moe_gflop"] > 0 and rows["sparse-torch"]["routing_ms"] > 0


def test_the_floors_step_updates_the_expert_weights_from_zero_gradients():
    from ragdot.bench.moe_train import _train_step, training_setup, use_variant
    from ragdot.moe.model import get_config
    from ragdot.moe.variants import FLOOR_GRAD

    model, opt, tokens = training_setup(get_config("tiny"), torch.device("cpu"), torch.float32)
    layer = model.moe_layers[0]
    use_variant(model, FLOOR)
    before = layer.w_gate_up.detach().clone()
    _train_step(model, opt, tokens)
    state = opt.state[layer.w_gate_up]
    assert torch.equal(state["exp_avg"], torch.zeros_like(before))  # a zero gradient, not none: AdamW ran on it
    assert not torch.equal(layer.w_gate_up.detach(), before)  # its weight decay moved the weight
    assert layer.w_gate_up.grad is None and layer.router.weight.grad is None  # zero_grad as after every step
    use_variant(model, "sparse-torch")
    assert not hasattr(layer.w_gate_up, FLOOR_GRAD) and not hasattr(layer.w_down, FLOOR_GRAD)
    _train_step(model, opt, tokens)
    assert state["exp_avg"].abs().sum() > 0  # real gradients again
