"""Expert parallelism on CPU: W processes (spawn, gloo) against the single-process layer.

Each spawned rank builds the full layer from one seed and the expert-parallel layer holding its shard of the
same weights, then checks: outputs and input (and router) gradients equal the full layer on that rank's
tokens; the local expert gradients equal the full layer's over every rank's tokens (each rank regenerates
all ranks' tokens from their seeds). One spawn per world size runs every scenario, to keep the file fast.
"""

from __future__ import annotations

import datetime
import gc
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ragdot.moe import MoELayer

DIM, HIDDEN = 8, 6
JOIN_SECONDS = 90.0
DT = torch.float64


def _tokens(rank: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(shape, generator=gen, dtype=DT), torch.randn(shape, generator=gen, dtype=DT)


def _layers(group, num_experts: int, top_k: int, **kw) -> tuple[MoELayer, MoELayer]:
    torch.manual_seed(0)
    full = MoELayer(DIM, HIDDEN, num_experts, top_k, dtype=DT, **kw)
    ep = MoELayer(DIM, HIDDEN, num_experts, top_k, dtype=DT, ep_group=group, **kw)
    lo, n = ep.ep.first_expert, ep.ep.local_experts
    with torch.no_grad():
        ep.w_gate_up.copy_(full.w_gate_up[lo : lo + n])
        ep.w_down.copy_(full.w_down[lo : lo + n])
        for mine, theirs in zip(ep.router.parameters(), full.router.parameters()):
            mine.copy_(theirs)
        if full.shared_expert is not None:
            for mine, theirs in zip(ep.shared_expert.parameters(), full.shared_expert.parameters()):
                mine.copy_(theirs)
    return full, ep


def _check_against_full(group, shapes: list[tuple[int, ...]], num_experts: int, top_k: int, **kw) -> None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    full, ep = _layers(group, num_experts, top_k, **kw)
    x, dy = _tokens(rank, shapes[rank])
    x.requires_grad_(True)
    y = ep(x)
    (y * dy).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = full(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ep.aux_loss, full.aux_loss)
    torch.testing.assert_close(ep.expert_counts, full.expert_counts)
    full.zero_grad()
    if x.numel():  # a rank without tokens: the full layer's output is a constant
        (y_ref * dy).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ep.router.weight.grad, full.router.weight.grad, rtol=1e-10, atol=1e-10)
    else:
        assert x.grad is not None and x.grad.shape == x.shape
    full.zero_grad()
    for r in range(world):  # the full layer over every rank's tokens
        xr, dyr = _tokens(r, shapes[r])
        if xr.numel():
            (full(xr) * dyr).sum().backward()
    lo, n = ep.ep.first_expert, ep.ep.local_experts
    torch.testing.assert_close(ep.w_gate_up.grad, full.w_gate_up.grad[lo : lo + n], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ep.w_down.grad, full.w_down.grad[lo : lo + n], rtol=1e-10, atol=1e-10)


def _capacity_drops(group, num_experts: int, top_k: int) -> None:
    """The capacity mode equals dense_drop per rank, and the scenario does drop assignments."""
    world = dist.get_world_size(group)
    shapes = [(2, 6, DIM)] * world
    _check_against_full(group, shapes, num_experts, top_k, path="dense_drop", capacity_factor=0.5)
    x, _ = _tokens(dist.get_rank(group), shapes[0])
    torch.manual_seed(0)
    probe = MoELayer(DIM, HIDDEN, num_experts, top_k, dtype=DT, path="dense_drop", capacity_factor=0.5)
    experts = probe.router(x.reshape(-1, DIM)).experts.view(2, -1)
    per_seq = torch.stack([torch.bincount(e, minlength=num_experts) for e in experts])
    assert int(per_seq.max()) > probe.capacity(6), "the scenario should overflow an expert"


def _expect_error(match: str, build) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def _scenarios(group, world: int) -> None:
    zero_rank = [(5, DIM), (0, DIM), (7, DIM), (3, DIM)][:world]
    _check_against_full(group, zero_rank, 2 * world, 2, num_shared_experts=1)  # top-2 over several ranks
    _check_against_full(group, [(4, 3, DIM)] * world, world, 1)  # one expert per rank, 3-D x
    _capacity_drops(group, 2 * world, 2)
    if world == 2:
        _expect_error("multiple of the ep_group size", lambda: MoELayer(DIM, HIDDEN, 3, 1, ep_group=group))
        hidden = HIDDEN + dist.get_rank(group)
        _expect_error("different configs: hidden_dim", lambda: MoELayer(DIM, hidden, 4, 1, ep_group=group))
        _expect_error("different configs: num_experts",
                      lambda: MoELayer(DIM, HIDDEN, 4 + 2 * dist.get_rank(group), 1, ep_group=group))


def _worker(rank: int, world: int, store_path: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        _scenarios(dist.group.WORLD, world)
        dist.barrier()
    finally:
        gc.collect()  # nothing may hold the group when it goes
        dist.destroy_process_group()


def _fsdp_worker(rank: int, world: int, store_path: str) -> None:
    """torch's FSDP2 (`fully_shard`) over the layer, data parallel: each rank's step on its own tokens, the
    sharded gradients against the plain layer's gradients averaged over every rank's tokens."""
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for path in ("sparse", "dense_drop"):
            torch.manual_seed(0)
            plain = MoELayer(DIM, HIDDEN, 4, 2, path=path, dtype=DT, num_shared_experts=1)
            sharded = MoELayer(DIM, HIDDEN, 4, 2, path=path, dtype=DT, num_shared_experts=1)
            sharded.load_state_dict(plain.state_dict())
            fully_shard(sharded)
            want: dict[str, torch.Tensor] = {}
            for r in range(world):  # the plain layer on every rank's tokens: FSDP averages the ranks' gradients
                plain.zero_grad(set_to_none=True)
                x, dy = _tokens(r, (3, 5, DIM))
                y = plain(x)
                ((y * dy).sum() + plain.aux_loss + plain.z_loss).backward()
                for name, p in plain.named_parameters():
                    want[name] = want.get(name, 0) + p.grad / world
                if r == rank:
                    y_rank = y.detach()
            x, dy = _tokens(rank, (3, 5, DIM))
            y = sharded(x)
            ((y * dy).sum() + sharded.aux_loss + sharded.z_loss).backward()
            assert torch.allclose(y.detach(), y_rank, rtol=1e-12, atol=1e-12), path
            for name, p in sharded.named_parameters():
                assert torch.allclose(p.grad.full_tensor(), want[name], rtol=1e-10, atol=1e-12), (path, name)
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()


def _spawn(world: int, tmp_path, worker=_worker) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.spawn(worker, args=(world, str(tmp_path / "store")), nprocs=world, join=False)
    deadline = time.monotonic() + JOIN_SECONDS
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} ranks did not finish within {JOIN_SECONDS} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(5)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_matches_single_process(world, tmp_path):
    _spawn(world, tmp_path)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_fsdp2_data_parallel_gradients_match_the_plain_layer(tmp_path):
    """`torch.distributed.fsdp.fully_shard` over an MoELayer (its parameters sharded over 2 ranks, the aux and z
    losses added outside the layer): outputs equal and sharded gradients equal the plain layer's, averaged."""
    pytest.importorskip("torch.distributed.fsdp", reason="needs FSDP2")
    _spawn(2, tmp_path, _fsdp_worker)


def test_ep_group_none_is_the_plain_layer():
    layer = MoELayer(DIM, HIDDEN, 4, 2)
    assert layer.ep is None and layer.w_gate_up.shape == (4, DIM, 2 * HIDDEN)


def test_ep_group_needs_a_process_group():
    with pytest.raises((ValueError, TypeError), match="ep_group"):
        MoELayer(DIM, HIDDEN, 4, 2, ep_group="not a group")


def test_ep_bench_runs_as_one_process(tmp_path):
    import argparse
    import csv

    from ragdot.bench import ep as ep_bench

    parser = argparse.ArgumentParser()
    ep_bench.add_arguments(parser)
    args = parser.parse_args(["--device", "cpu", "--tokens-per-rank", "16", "--steps", "1", "--warmup", "0",
                              "--out", str(tmp_path), "--quiet", "--commit", "test"])  # fmt: skip
    assert ep_bench.run(args) == 0
    assert not dist.is_initialized()
    (path,) = tmp_path.glob("ragdot-ep-*-w1-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0])[:7] == ["gpu", "world_size", "config", "tokens_per_rank", "phase", "ms", "gbs"]
    by_phase = {r["phase"]: r for r in rows}
    assert list(by_phase) == list(ep_bench.DEFAULT_PHASES)
    assert all(float(r["ms"]) > 0 and r["world_size"] == "1" for r in rows)
    assert by_phase["dispatch"]["gbs"] and by_phase["capacity_fwd"]["gbs"] and not by_phase["layer_fwdbwd"]["gbs"]


def test_ep_bench_rejects_a_bad_phase(tmp_path, capsys):
    import argparse

    from ragdot.bench import ep as ep_bench

    parser = argparse.ArgumentParser()
    ep_bench.add_arguments(parser)
    for phases in (["nope"], ["capacity_fwd_graph"]):  # unknown; CUDA only
        args = parser.parse_args(["--device", "cpu", "--phases", *phases, "--out", str(tmp_path)])
        assert ep_bench.run(args) == 2
        assert "--phases" in capsys.readouterr().err and not dist.is_initialized()
