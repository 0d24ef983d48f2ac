"""The MoE layer: its three paths agree where they must, every backend, torch.compile, the bench CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import ragdot
from helpers import deterministic_algorithms, nerr
from ragdot.moe import MoELayer, SwiGLU
from ragdot.moe import routing_kernels as rk
from ragdot.moe.router import load_balancing_loss, router_z_loss

TARGETS = Path(__file__).resolve().parents[1] / "benchmarks" / "targets-h200.json"

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROUTING_IMPLS = ["torch"] + (["triton"] if rk.HAS_TRITON else [])


def _layer(dim=16, hidden=12, experts=6, top_k=2, dtype=torch.float64, **kw) -> MoELayer:
    torch.manual_seed(0)
    return MoELayer(dim, hidden, experts, top_k, dtype=dtype, device=DEV, **kw)


def _input(shape, dtype, seed=1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(DEV, dtype)


def _run(layer: MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and the gradients of x and every parameter for a loss that also uses the router losses."""
    layer.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(True)
    y = layer(xg)
    (y.square().sum() + layer.aux_loss + layer.z_loss).backward()
    grads = {"x": xg.grad} | {n: p.grad for n, p in layer.named_parameters()}
    return y.detach(), grads


@pytest.mark.parametrize(
    "dtype,impl,tol",
    [(torch.float64, "torch", 1e-12)] + [(torch.float32, i, 1e-5) for i in ROUTING_IMPLS],
)
def test_sparse_equals_dense_dropless(dtype, impl, tol):
    layer = _layer(dtype=dtype, backend="reference", routing_impl=impl, num_shared_experts=1)
    x = _input((3, 11, 16), dtype)
    y_sparse, g_sparse = _run(layer, x)
    aux = layer.aux_loss.item()
    layer.path = "dense_dropless"
    y_dense, g_dense = _run(layer, x)
    assert nerr(y_sparse, y_dense) <= tol
    assert set(g_sparse) == set(g_dense) and all(g is not None for g in g_sparse.values())
    for name in g_sparse:
        assert nerr(g_sparse[name], g_dense[name]) <= tol, name
    assert layer.aux_loss.item() == pytest.approx(aux)


def _dense_drop_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Per sequence, each expert keeps its first C assignments in (token, choice) order; loops, no tricks."""
    b, s, d = x.shape
    r = layer.router(x.reshape(-1, d))
    experts, weights = r.experts.view(b, s, -1), r.weights.view(b, s, -1)
    cap = layer.capacity(s)
    y = torch.zeros_like(x)
    for bi in range(b):
        used = [0] * layer.num_experts
        for t in range(s):
            for j in range(layer.top_k):
                e = int(experts[bi, t, j])
                used[e] += 1
                if used[e] <= cap:
                    h = x[bi, t] @ layer.w_gate_up[e]
                    gate, up = h.chunk(2)
                    y[bi, t] += weights[bi, t, j] * ((torch.nn.functional.silu(gate) * up) @ layer.w_down[e])
    return y


def test_dense_drop_with_ample_capacity_equals_sparse_and_drops_overflow_otherwise():
    layer = _layer(backend="reference")
    x = _input((2, 12, 16), torch.float64)
    y_sparse, g_sparse = _run(layer, x)
    layer.path, layer.capacity_factor = (
        "dense_drop",
        layer.num_experts / layer.top_k,
    )  # C = S: nothing dropped
    y_drop, g_drop = _run(layer, x)
    assert nerr(y_drop, y_sparse) <= 1e-12
    for name in g_sparse:
        assert nerr(g_drop[name], g_sparse[name]) <= 1e-12, name
    layer.capacity_factor = 0.5  # C = ceil(12 * 2 / 6 * 0.5) = 2 of the 4 an expert gets on average
    assert layer.capacity(12) == 2
    with torch.no_grad():
        y_small = layer(x)
        ref = _dense_drop_reference(layer, x)
    assert nerr(y_small, y_sparse) > 0.1  # dropped assignments change the output
    assert nerr(y_small, ref) <= 1e-12


@pytest.mark.parametrize("path", ["sparse", "dense_dropless", "dense_drop"])
def test_one_expert_top1_is_a_dense_swiglu_ffn(path):
    layer = _layer(experts=1, top_k=1, path=path, backend="reference")
    ffn = SwiGLU(16, 12, dtype=torch.float64, device=DEV)
    with torch.no_grad():
        ffn.w_gate_up.copy_(layer.w_gate_up[0])
        ffn.w_down.copy_(layer.w_down[0])
    x = _input((4, 9, 16), torch.float64)
    with torch.no_grad():
        assert nerr(layer(x), ffn(x)) <= 1e-12


@pytest.mark.parametrize("backend", ragdot.backends())
def test_every_backend_gives_the_same_layer_output(backend):
    # gluon's weight-gradient kernel takes 16-bit operands only: its layer runs in bfloat16 (both sides)
    dtype, tol = (torch.bfloat16, 2e-2) if backend == "gluon" else (torch.float32, 1e-5)
    layer = _layer(dim=32, hidden=16, experts=5, top_k=2, dtype=dtype, backend="reference")
    x = _input((2, 10, 32), dtype)
    y_ref, g_ref = _run(layer, x)
    layer.backend = backend
    y, g = _run(layer, x)
    assert nerr(y, y_ref) <= tol
    for name in ("x", "w_gate_up", "w_down", "router.weight"):
        assert nerr(g[name], g_ref[name]) <= tol, name


def test_torch_compile_fullgraph_matches_eager():
    layer = _layer(dtype=torch.float32, backend="reference", num_shared_experts=1)
    x = _input((2, 8, 16), torch.float32)
    y_eager, g_eager = _run(layer, x)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    layer.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    y = compiled(xg)
    (y.square().sum() + layer.aux_loss + layer.z_loss).backward()
    assert nerr(y, y_eager) <= 1e-6 and nerr(xg.grad, g_eager["x"]) <= 1e-6
    assert nerr(layer.w_gate_up.grad, g_eager["w_gate_up"]) <= 1e-6


def test_state_dict_is_the_same_for_every_path():
    a = _layer(path="sparse", num_shared_experts=2)
    b = _layer(path="dense_drop", num_shared_experts=2)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    assert a.w_gate_up.shape == (6, 16, 24) and a.w_down.shape == (6, 12, 16)
    assert a.shared_expert.w_gate_up.shape == (16, 48)  # two shared experts -> width 2 * hidden
    b.load_state_dict(a.state_dict())
    b.path, b.capacity_factor = "sparse", 1.25
    x = _input((5, 16), torch.float64)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_router_losses():
    probs = torch.full((10, 4), 0.25)
    assert load_balancing_loss(probs, torch.tensor([5, 5, 5, 5])).item() == pytest.approx(1.0)
    skew = torch.tensor([[1.0, 0, 0, 0]]).repeat(10, 1)
    assert load_balancing_loss(skew, torch.tensor([20, 0, 0, 0])).item() == pytest.approx(4.0)
    assert router_z_loss(torch.zeros(3, 8)).item() == pytest.approx(math.log(8) ** 2)
    layer = _layer(aux_loss_coef=0.5, z_loss_coef=0.0)
    layer(_input((7, 16), torch.float64))
    assert layer.z_loss.item() == 0.0 and layer.aux_loss.item() >= 0.5 * 0.99  # the balance loss is >= 1
    assert int(layer.expert_counts.sum()) == 7 * 2


def test_weights_not_renormalised_when_asked():
    layer = _layer(normalize_weights=False)
    r = layer.router(_input((9, 16), torch.float64))
    assert (r.weights.sum(-1) < 1).all()
    assert torch.equal(r.weights, r.probs.gather(1, r.experts))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(8, 8, 2, 3)
    with pytest.raises(ValueError, match="path="):
        MoELayer(8, 8, 4, 2, path="dense")
    with pytest.raises(ValueError, match="capacity_factor"):
        MoELayer(8, 8, 4, 2, capacity_factor=0)
    with pytest.raises(ValueError, match="dim"):
        MoELayer(0, 8, 4, 2)
    layer = _layer()
    with pytest.raises(ValueError, match="path="):
        layer.path = "sparse_drop"
    with pytest.raises(ValueError, match=r"\[..., dim=16\]"):
        layer(_input((3, 8), torch.float64))
    with pytest.raises(TypeError, match="dtype"):
        layer(_input((3, 16), torch.float32))
    with pytest.raises(ValueError, match="routing_impl"):
        layer.routing_impl = "cuda"
    with pytest.raises(ValueError, match="backend="):
        layer.backend = "cutlass"


def test_empty_input_gives_empty_output():
    layer = _layer()
    y = layer(torch.empty(0, 16, dtype=torch.float64, device=DEV))
    assert y.shape == (0, 16) and layer.aux_loss.item() == 0.0


def test_decoder_train_step_reaches_every_parameter():
    from ragdot.moe.model import MoEDecoder, get_config

    cfg = get_config("tiny")
    torch.manual_seed(0)
    model = MoEDecoder(cfg, device=DEV, backend="reference")
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), device=DEV)
    for path in ("sparse", "dense_drop"):
        model.set_moe(path=path)
        model.zero_grad(set_to_none=True)
        loss = model.loss(tokens)
        loss.backward()
        assert math.isfinite(loss.item())
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing


def test_moe_bench_quick_writes_results(tmp_path):
    from ragdot.cli import main

    rc = main(["moe-bench", "--quick", "--variants", "sparse-torch", "sparse-padded", "dense_drop",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    (results,) = tmp_path.glob("moe-bench-*.json")  # a new file per run, named by GPU and date
    data = json.loads(results.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"sparse-torch", "sparse-padded", "dense_drop"}
    assert all(r["status"] == "ok" and r["step_s"] > 0 for r in rows.values())
    assert rows["sparse-torch"]["routing_ms"] > 0 and rows["sparse-torch"]["gemm_ms"] > 0
    assert results.with_suffix(".csv").exists()
    assert (tmp_path / f"{results.stem}-step_time.png").exists()
    assert main(["moe-bench", "--quick", "--routing-only", "--out", str(tmp_path)]) == 0
    (routing_file,) = tmp_path.glob("moe-routing-*.json")
    routing = json.loads(routing_file.read_text())["rows"]
    assert {r["impl"] for r in routing} >= {"argsort", "torch"} and all(r["fwd_bwd_ms"] > 0 for r in routing)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bf16_layer_on_gpu(backend):
    if backend not in ragdot.backends():
        pytest.skip(f"backend {backend} unavailable")
    layer = _layer(dim=512, hidden=256, experts=32, top_k=4, dtype=torch.bfloat16, backend=backend)
    x = _input((4, 256, 512), torch.bfloat16)
    y_sparse, g_sparse = _run(layer, x)
    layer.path = "dense_dropless"
    y_dense, g_dense = _run(layer, x)
    assert nerr(y_sparse, y_dense) <= 2e-2
    for name in ("x", "w_gate_up", "w_down", "router.weight"):
        assert nerr(g_sparse[name], g_dense[name]) <= 3e-2, name


def test_moe_bench_variant_after_a_failed_one_starts_from_clean_optimizer_state(monkeypatch):
    """An out-of-memory step can stop AdamW half-way through making its state; the next variant must run."""
    import argparse

    from ragdot.bench import moe_train as moe_bench
    from ragdot.moe.model import MoEDecoder, get_config

    cfg = get_config("tiny")
    model = MoEDecoder(cfg, device=DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), device=DEV)
    args = argparse.Namespace(steps=2, measure_from=1, max_seconds=5.0, no_profile=True, routing_impl="torch",
                              eager=True)
    real = moe_bench._time_steps

    def out_of_memory_midway(model, opt, tokens, args, device):
        opt.state[next(model.parameters())] = {"step": torch.tensor(1.0)}  # exp_avg* never made
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(moe_bench, "_time_steps", out_of_memory_midway)
    row = moe_bench._run_variant(model, opt, tokens, cfg, "sparse-torch", args, torch.device(DEV), torch.float32)
    assert row["status"] == "OOM"
    monkeypatch.setattr(moe_bench, "_time_steps", real)
    row = moe_bench._run_variant(model, opt, tokens, cfg, "dense_drop", args, torch.device(DEV), torch.float32)
    assert row["status"] == "ok", row


def test_moe_bench_config_in_its_own_process():
    """On GPUs each config runs in a spawned process; the rows come back the same way (CPU here)."""
    import argparse
    from pathlib import Path

    from ragdot.bench import moe as moe_cli
    from ragdot.bench import moe_train as moe_bench
    from ragdot.moe.model import get_config

    args = argparse.Namespace(steps=2, measure_from=1, max_seconds=5.0, no_profile=True, routing_impl="torch",
                              eager=True, variants=["sparse-torch", "dense_drop"], out=Path("."),
                              _module=moe_cli)  # the CLI's own entries (a module) stay behind
    rows = moe_bench.run_config_in_subprocess(get_config("tiny"), args, torch.device("cpu"), torch.float32)
    assert [r["variant"] for r in rows] == ["sparse-torch", "dense_drop"]
    assert all(r["status"] == "ok" and r["step_s"] > 0 for r in rows), rows


def test_moe_bench_target_checks():
    """The targets file's goals from result rows: best sparse backend vs dense_drop and padded, routing, memory."""
    from ragdot.bench.moe_report import check_targets
    from ragdot.measure.targets import load_targets, section

    goals = section(load_targets(TARGETS), "moe-bench", "NVIDIA H200")

    def row(cfg, variant, step, experts=128, share=None, temp=None):
        return {"config": cfg, "variant": variant, "status": "ok", "step_s": step, "experts": experts,
                "routing_share": share, "temp_gb": temp}

    rows = [
        row("qwen3-235b-a22b", "sparse-torch", 0.050, share=0.05, temp=10.0),
        row("qwen3-235b-a22b", "sparse-triton", 0.040, share=0.20, temp=10.0),  # the best: its numbers count
        row("qwen3-235b-a22b", "sparse-padded", 1.000, temp=50.0),
        row("qwen3-235b-a22b", "dense_drop", 0.050, temp=9.0),
        row("llama4-17b-16e", "sparse-torch", 0.058, experts=16, share=0.01),
        row("llama4-17b-16e", "sparse-padded", 0.195, experts=16),
        row("llama4-17b-16e", "dense_drop", 0.059, experts=16),
        {"config": "mixtral-8x7b", "variant": "sparse-torch", "status": "OOM"},
    ]
    got = {text: (ok, value) for text, ok, value in check_targets(rows, goals)}
    assert got["qwen3-235b-a22b (sparse-triton): >= 1.2x faster than dense_drop"] == (True, "1.25x")
    assert got["qwen3-235b-a22b (sparse-triton): >= 4x faster than sparse-padded"] == (True, "25.00x")
    assert got["qwen3-235b-a22b (sparse-triton): routing <= 15% of MoE layer time"] == (False, "20.0%")
    assert got["qwen3-235b-a22b (sparse-triton): temp memory <= 100% of dense_drop"][0] is False
    assert got["qwen3-235b-a22b (sparse-triton): temp memory <= 30% of sparse-padded"] == (True, "20%")
    assert got["llama4-17b-16e (sparse-torch): >= 1.2x faster than dense_drop"][0] is False
    assert not any("llama4" in t and "padded" in t for t in got)  # the padded target is for 64+ experts only
    assert not any("mixtral" in t for t in got)  # nothing measured, nothing claimed


def test_a_forward_drops_the_previous_steps_losses_before_routing(monkeypatch):
    """The last step's aux/z losses hold its autograd graph (and the AccumulateGrad nodes recorded on its
    stream); the next forward must release them before it builds a new graph."""
    import weakref

    layer = MoELayer(16, 8, 4, 2)
    x = torch.randn(10, 16, requires_grad=True)
    layer(x).sum().backward()
    old = weakref.ref(layer.aux_loss)
    seen: list[bool] = []
    route = layer.router.forward
    monkeypatch.setattr(layer.router, "forward", lambda t: (seen.append(old() is None), route(t))[1])
    layer(x)
    assert seen == [True] and layer.aux_loss is not None and layer.z_loss is not None


@pytest.mark.gpu
def test_eager_steps_then_a_cuda_graph_capture_on_a_side_stream():
    """Eager steps on the default stream, then capture_graph (its own stream): the pattern of every benchmark
    that times both clocks; it failed while the layer kept the last step's graph alive."""
    from ragdot.measure.timing import capture_graph, warm_off_stream

    dev = torch.device("cuda")
    torch.manual_seed(0)
    layer = MoELayer(256, 128, 16, 4, dtype=torch.bfloat16, device=dev)
    x = torch.randn(512, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    cot = torch.randn_like(x)
    params = (x, layer.router.weight, layer.w_gate_up, layer.w_down)

    def step():
        y = layer(x)
        return (y.detach(), *torch.autograd.grad(y, params, cot))

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    warm_off_stream(step, dev)
    replay = capture_graph(step)
    replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("path", ["sparse", "dense_dropless", "dense_drop"])
def test_every_path_trains_under_torch_s_deterministic_algorithms(path):
    """torch.use_deterministic_algorithms(True): a training step of each path (router, routing, experts, losses;
    on CUDA with bfloat16 the sparse path's default, the fused block) raises no error, and a repeat from the same
    parameters gives bitwise-equal outputs and gradients."""
    dtype = torch.bfloat16 if DEV.type == "cuda" else torch.float32
    torch.manual_seed(11)
    layer = MoELayer(64, 32, 8, 2, path=path, dtype=dtype, device=DEV)
    x = _input((4, 16, 64), dtype, 12)
    runs = []
    with deterministic_algorithms():
        for _ in range(2):
            layer.zero_grad(set_to_none=True)
            y = layer(x)
            (y.float().square().mean() + layer.aux_loss + layer.z_loss).backward()
            runs.append([y.detach()] + [p.grad for p in layer.parameters()])
    for first, again in zip(*runs):
        assert torch.equal(first, again)


def test_a_layer_that_ran_a_training_step_deep_copies_and_pickles():
    """copy.deepcopy / torch.save of a layer after a step (EMA copies, checkpoints of whole modules): the last
    step's losses, which hold its autograd graph, are not part of the copy; parameters and settings are, and the
    copy computes what the layer does."""
    import copy
    import io

    layer = _layer(dtype=torch.float32, path="sparse", capacity_factor=2.0)
    x = _input((3, 5, 16), torch.float32)
    (layer(x).sum() + layer.aux_loss + layer.z_loss).backward()
    assert layer.aux_loss.grad_fn is not None  # a non-leaf: what made the copy fail
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(layer), torch.load(buf, weights_only=False)):
        assert twin.aux_loss is None and twin.z_loss is None and layer.aux_loss is not None
        assert twin.path == "sparse" and twin.capacity_factor == 2.0
        with torch.no_grad():
            assert torch.equal(twin(x), layer(x))


@pytest.mark.parametrize("path", ["sparse", "dense_drop"])
def test_non_reentrant_activation_checkpointing_gives_the_unchecked_gradients(path):
    """torch.utils.checkpoint(layer, x, use_reentrant=False), the form the layer's docstring names: the output and
    every gradient (the router's through aux_loss and z_loss included) equal the unchecked step's bitwise."""
    from torch.utils.checkpoint import checkpoint

    layer = _layer(path=path)
    x = _input((3, 5, 16), torch.float64).requires_grad_()
    grads = []
    for checked in (False, True):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y = checkpoint(layer, x, use_reentrant=False) if checked else layer(x)
        (y.square().sum() + layer.aux_loss + layer.z_loss).backward()
        grads.append([y.detach(), x.grad] + [p.grad for p in layer.parameters()])
    for plain, checked in zip(*grads):
        assert torch.equal(plain, checked)


def test_a_layer_built_on_the_meta_device_initialises_with_reset_parameters():
    """The meta-device convention (build without memory, `to_empty`, then each module's `reset_parameters`):
    every parameter of the layer, its router and shared expert drawn as the constructor draws them (the same
    values under the same seed, module by module), and the layer runs."""
    with torch.device("meta"):
        layer = MoELayer(16, 12, 6, 2, num_shared_experts=1, dtype=torch.float32)
    assert layer.w_gate_up.is_meta
    layer.to_empty(device=DEV)
    torch.manual_seed(3)
    for module in layer.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    eager = MoELayer(16, 12, 6, 2, num_shared_experts=1, dtype=torch.float32, device=DEV)
    torch.manual_seed(3)
    for module in eager.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    for (name, p), q in zip(layer.named_parameters(), eager.parameters()):
        assert torch.equal(p, q), name
    fan_in = {"w_gate_up": 16, "w_down": 12, "router.weight": 16}
    for name, std in fan_in.items():
        p = layer.get_parameter(name)
        assert abs(p.std().item() - std ** -0.5) < 0.2 * std ** -0.5, name
    assert torch.isfinite(layer(_input((2, 4, 16), torch.float32))).all()


def test_printing_a_layer_names_its_settings_and_its_parts_sizes():
    text = repr(MoELayer(16, 8, 4, 2, num_shared_experts=1, dtype=torch.float32))
    assert "dim=16, hidden_dim=8, num_experts=4, top_k=2, path='sparse'" in text
    assert "Router(dim=16, num_experts=4, top_k=2, normalize=True)" in text
    assert "SwiGLU(dim=16, hidden_dim=8)" in text
