"""The Triton kernels' compiled code, checked on any machine without a GPU: the heuristic's tiles (and the
row-index weight gradient's) built for an sm_90 target with Triton's bundled ptxas (wgmma, no register spills),
and for an AMD MI300 (gfx942) target (pointer loads, no TMA). Each build runs in a subprocess without
TRITON_INTERPRET (the interpreter compiles nothing).
"""

from __future__ import annotations

import os
import textwrap

import pytest

from helpers import bundled_ptxas, compiled_in_a_subprocess

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from ragdot.kernels import compile_only, pick_config, resource_usage
    from ragdot.kernels import ragged_m as rm, ragged_k as rk
    from ragdot.kernels.configs import gather_config
    bf = torch.bfloat16
    out = {}
    with compile_only(90):
        for m, k, n, g in ((3840, 2048, 1408, 64), (15360, 6144, 20480, 32), (5120, 512, 512, 256),
                           (20480, 4096, 1536, 128), (10240, 2048, 768, 128), (64, 7168, 4096, 64)):
            cfg = pick_config("ragged_m", m, k, n, g, bf, "cpu")  # the sm_90 target's tiles
            a = torch.empty(1, m, k, dtype=bf)
            for name, b in (("fwd", torch.empty(1, g, k, n, dtype=bf)),
                            ("dgrad", torch.empty(1, g, n, k, dtype=bf).transpose(-1, -2))):
                h = rm.launch(a, b, torch.zeros(g, dtype=torch.int32), config=cfg)[1]
                out[f"ragged_m {name} {m}x{k}x{n}x{g} {cfg.short()}"] = resource_usage(h)
            for device in (None, "cpu"):  # the pointer-load tile, and the sm_90 target's TMA-load tile
                cfg = pick_config("ragged_k", k, m, n, g, bf, device)
                h = rk.launch(a, torch.empty(1, m, n, dtype=bf), torch.zeros(g, dtype=torch.int32), config=cfg,
                              sched=torch.zeros(3, g, dtype=torch.int32))[1]
                out[f"ragged_k {m}x{k}x{n}x{g} {cfg.short()}"] = resource_usage(h)
            rows = torch.zeros(m, dtype=torch.int32)  # a read through a row index, b through its ragged view
            cfg = gather_config(m, k, n, g, bf, "cpu")
            h = rk.launch(a[:, :1], torch.empty(1, m, n, dtype=bf), torch.zeros(g, dtype=torch.int32), config=cfg,
                          sched=torch.zeros(3, g, dtype=torch.int32), a_rows=rows)[1]
            out[f"ragged_k a_rows {m}x{k}x{n}x{g} {cfg.short()}"] = resource_usage(h)
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_sm90_code_uses_wgmma_without_spills() -> None:
    """The heuristic's configs compile (for sm_90, on any machine) to wgmma with zero register spills."""
    import json

    stdout = compiled_in_a_subprocess(["-c", _COMPILE_SCRIPT])
    usage = json.loads(stdout.strip().splitlines()[-1])
    assert len(usage) == 30 and sum(" flat" in name and name.startswith("ragged_k") for name in usage) == 12
    assert any(" 16x128x128" in name for name in usage)  # the decode tile (rows <= 16 a group) on sm_90
    for name, info in usage.items():
        if " 32x" not in name and " 16x" not in name:  # tiles under 64 rows run mma.sync (memory bound)
            assert info["wgmma"], name
        assert info["spills"] == 0, (name, info)


_ROCM_SCRIPT = textwrap.dedent(
    """
    import torch
    from ragdot.kernels import batch as bm, compile_only, pick_config, ragged_k as rk, ragged_m as rm
    bf = torch.bfloat16
    built = []
    with compile_only("gfx942", backend="hip", warp_size=64, multiprocessors=304):
        for m, k, n, g in ((3840, 2048, 1408, 64), (20480, 4096, 1536, 128), (15360, 6144, 20480, 32),
                           (64, 7168, 4096, 64)):
            a = torch.empty(1, m, k, dtype=bf)
            cfg = pick_config("ragged_m", m, k, n, g, bf)
            for b in (torch.empty(1, g, k, n, dtype=bf), torch.empty(1, g, n, k, dtype=bf).transpose(-1, -2)):
                h = rm.launch(a, b, torch.zeros(g, dtype=torch.int32), config=cfg)[1]
                built.append("hsaco" in h.asm and "tensormap" not in h.asm["llir"])
                if m // g <= 16:  # the decode tile fits the MI300's 64 KB of LDS
                    built.append(h.metadata.shared <= 64 * 1024)
            cfg = pick_config("ragged_k", k, m, n, g, bf)
            h = rk.launch(a, torch.empty(1, m, n, dtype=bf), torch.zeros(g, dtype=torch.int32), config=cfg,
                          sched=torch.zeros(3, g, dtype=torch.int32))[1]
            built.append("hsaco" in h.asm)
            h = rk.launch(a[:, :1], torch.empty(1, m, n, dtype=bf), torch.zeros(g, dtype=torch.int32),
                          sched=torch.zeros(3, g, dtype=torch.int32), a_rows=torch.zeros(m, dtype=torch.int32))[1]
            built.append("hsaco" in h.asm)  # the row-index weight gradient (pointer loads; gather_config's tile)
        h = bm.launch(torch.empty(2, 256, 512, dtype=bf), torch.empty(2, 512, 256, dtype=bf))[1]
        built.append("hsaco" in h.asm)
    print(sum(built), len(built))
    """
)


def _amd_backend() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "amd"))


@pytest.mark.skipif(not _amd_backend(), reason="needs Triton's AMD backend")
def test_rocm_code_builds_for_mi300() -> None:
    """The heuristic's kernels (pointer loads and stores, no TMA) build for an AMD MI300 (gfx942) target."""
    stdout = compiled_in_a_subprocess(["-c", _ROCM_SCRIPT])
    assert stdout.split()[-2:] == ["19", "19"], stdout[-500:]


_TMA_STORE_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from ragdot.kernels import compile_only, resource_usage, ragged_m as rm
    from ragdot.kernels.configs import TileConfig
    bf = torch.bfloat16
    out = {}
    m, k, n, g = 20480, 4096, 1536, 128  # qwen3-235b-a22b's data gradient: b read K-major
    a = torch.empty(1, m, k, dtype=bf)
    b = torch.empty(1, g, n, k, dtype=bf).transpose(-1, -2)
    tiles = [TileConfig(64, 256, 64, 8, 4, 4, True, 1, True, 0, True),
             TileConfig(128, 256, 64, 8, 8, 3, True, 1, True, 0, True),
             TileConfig(128, 128, 64, 8, 4, 3, True, 2, True, 0, True)]
    with compile_only(90):
        for split in (1, 2):
            rm.TMA_STORE, rm.STORE_SPLIT = True, split
            for cfg in tiles:
                p = rm.Prepared(a, b, bf, cfg)
                usage = resource_usage(p(a, b, torch.zeros(g, dtype=torch.int32))[1])
                out[f"{cfg.short()} split {split}"] = {**usage, "view": p.c_view is not None,
                                                       "programs": cfg.programs_per_sm}
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_sm90_tma_store_builds_and_two_slices_keep_two_programs_an_sm() -> None:
    """ragged_m's TMA-store switch compiles for sm_90 with wgmma and no spills; stored as two column slices (the
    default with the switch on), two 128x128x64 three-stage programs still fit an SM's 228 KB of shared memory."""
    import json

    stdout = compiled_in_a_subprocess(["-c", _TMA_STORE_SCRIPT])
    usage = json.loads(stdout.strip().splitlines()[-1])
    assert len(usage) == 6
    for name, info in usage.items():
        assert info["view"] and info["wgmma"] and info["spills"] == 0, (name, info)
        if name.endswith("split 2"):
            assert info["programs"] * (info["shared"] + 1024) <= 228 * 1024, (name, info)


_POINTER_STORE_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from ragdot.kernels import compile_only, resource_usage, ragged_k as rk
    from ragdot.kernels.configs import TileConfig
    bf = torch.bfloat16
    out = {}
    tiles = [TileConfig(128, 128, 32, 8, 4, 4, True, 2, True, 0, True),
             TileConfig(128, 256, 64, 8, 8, 3, True, 1, True, 0, True)]
    r, m, g = 2600, 1000, 40  # 65 token rows a group: short, so the default writes by pointer stores
    with compile_only(90):
        for n in (752, 744):
            a, b = torch.empty(1, r, m, dtype=bf), torch.empty(1, r, n, dtype=bf)
            out[f"default {n}"] = rk.Prepared(a, b, g, bf, tiles[0]).tma
            rk.TMA_STORE = False
            for cfg in tiles:
                p = rk.Prepared(a, b, g, bf, cfg)
                h = p(a, b, torch.zeros(g, dtype=torch.int32), sched=torch.zeros(3, g, dtype=torch.int32))[1]
                out[f"pointer {n} {cfg.short()}"] = resource_usage(h)
            rk.TMA_STORE = None
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_sm90_pointer_stores_run_only_where_they_vectorize() -> None:
    """The weight gradient's pointer stores (its default for short groups) build for sm_90 without spills where
    the output's rows take vector stores (N a multiple of 16: 752, not a tile multiple); at N = 744 Triton 3.6
    stores element by element and spills 336-792 bytes a thread, so there the default writes through TMA
    (`ragged_view.vector_rows`)."""
    import json

    stdout = compiled_in_a_subprocess(["-c", _POINTER_STORE_SCRIPT])
    usage = json.loads(stdout.strip().splitlines()[-1])
    assert usage["default 752"] is False and usage["default 744"] is True
    for name, info in usage.items():
        if name.startswith("pointer 752"):
            assert info["wgmma"] and info["spills"] == 0, (name, info)


_RAGGED_M_STORE_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from ragdot.kernels import compile_only, resource_usage, ragged_m as rm
    from ragdot.kernels.configs import TileConfig
    bf = torch.bfloat16
    out = {}
    tiles = [TileConfig(128, 256, 64, 8, 8, 3, True, 1, True, 0, True),
             TileConfig(128, 128, 64, 8, 4, 3, True, 2, True, 0, True)]
    m, k, g = 8192, 2048, 64
    with compile_only(90):
        for n in (752, 744):
            a, b = torch.empty(1, m, k, dtype=bf), torch.empty(1, g, k, n, dtype=bf)
            for cfg in tiles:
                p = rm.Prepared(a, b, bf, cfg)
                usage = resource_usage(p(a, b, torch.zeros(g, dtype=torch.int32))[1])
                out[f"{n} {cfg.short()}"] = {**usage, "view": p.c_view is not None}
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_sm90_ragged_m_stores_through_tma_where_rows_do_not_vectorize() -> None:
    """The flat ragged-M kernel's default stores (`ragged_m.TMA_STORE` None): pointer stores at N = 752 and the
    ragged TMA view at N = 744, where pointer stores go out one element at a time (968-992 bytes of spills for
    these tiles, tail rows' zero tiles included); built for sm_90, neither spills."""
    import json

    stdout = compiled_in_a_subprocess(["-c", _RAGGED_M_STORE_SCRIPT])
    usage = json.loads(stdout.strip().splitlines()[-1])
    assert len(usage) == 4
    for name, info in usage.items():
        assert info["view"] is name.startswith("744") and info["wgmma"] and info["spills"] == 0, (name, info)

