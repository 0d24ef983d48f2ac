"""The Gluon kernels' compiled code, checked without a GPU: every candidate config compiled for sm_90 with the
ptxas bundled with Triton (wgmma, warp specialization, register reallocation, the epilogue's store path, spills)."""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import triton

from helpers import bundled_ptxas, compiled_in_a_subprocess
from ragdot.kernels.gluon import GluonConfig
from ragdot.kernels.gluon.common import consumer_regs
from ragdot.kernels.gluon.config import SHARED_BYTES

# ---- compiled code, checked without a GPU (Triton's bundled ptxas, sm_90 target) -----------------------------

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import json, re, torch
    from ragdot.kernels.configs import compile_only, resource_usage, run_kernel
    from ragdot.kernels.gluon.config import GluonConfig, gluon_m_tuning_configs, gluon_tuning_configs
    from ragdot.kernels.gluon.ragged_k import Prepared
    from ragdot.kernels.gluon.ragged_m import Prepared as MPrepared
    from ragdot.kernels.gluon import matmul as mm
    from ragdot.kernels.gluon.common import descriptor, maxnreg_for, mma_layout
    bf = torch.bfloat16
    out = {}

    def info(h):
        ptx = h.asm["ptx"]
        incs = sorted({int(v) for v in re.findall(r"setmaxnreg\\.inc\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)})
        return dict(resource_usage(h), ws="setmaxnreg" in ptx, tma_store="bulk_group" in ptx,
                    vector_store="st.global.v4" in ptx, trans_a=", 1, 1, 1, 1;" in ptx, incs=incs,
                    cp_async="cp.async.mbarrier.arrive.noinc" in ptx and "cp.async.cg.shared.global" in ptx)

    with compile_only(90):
        for m, r, n, g in ((2048, 3840, 1408, 64), (2880, 10240, 2880, 16), (512, 5120, 512, 256)):
            a, b = torch.empty(1, r, m, dtype=bf), torch.empty(1, r, n, dtype=bf)
            for out_dtype in (bf, torch.float32):
                for cfg in gluon_tuning_configs(m, n, out_dtype.itemsize):
                    p = Prepared(a, b, g, out_dtype, cfg)
                    h = p(a, b, None, sched=torch.zeros(3, g, dtype=torch.int32))[1]
                    out[f"ragged_k {m}x{r}x{n}x{g} {out_dtype} {cfg.short()}"] = info(h)
        from ragdot.kernels.gluon.ragged_k_gather import Prepared as GPrepared
        for m, r, n, g in ((2880, 32768, 5760, 128), (2048, 3840, 1408, 64)):  # x's rows copied in by cp.async
            x, b = torch.empty(1, 8192, m, dtype=bf), torch.empty(1, r, n, dtype=bf)
            idx = torch.empty(r, dtype=torch.int32)
            for cfg in gluon_tuning_configs(m, n):
                p = GPrepared(x, b, g, bf, cfg, from_sizes=True)
                h = p(x, b, torch.zeros(g, dtype=torch.int32), None, torch.zeros(4, g, dtype=torch.int32), idx)[1]
                out[f"ragged_k_gather {m}x{r}x{n}x{g} {bf} {cfg.short()}"] = info(h)
            p = GPrepared(x, b, g, bf, GluonConfig(128, 128, 64, 4, 4), from_sizes=True, gather_warps=8)
            h = p(x, b, torch.zeros(g, dtype=torch.int32), None, torch.zeros(4, g, dtype=torch.int32), idx)[1]
            out[f"ragged_k_gather {m}x{r}x{n}x{g} gw8 {p.cfg.short()}"] = info(h)
        from ragdot.kernels.gluon import ragged_k as rk
        rk.EPILOGUE = "tma2"  # two epilogue buffers where they fit
        a, b = torch.empty(1, 10240, 2880, dtype=bf), torch.empty(1, 10240, 2880, dtype=bf)
        for cfg in (GluonConfig(128, 256, 32, 4, 8), GluonConfig(128, 128, 64, 4, 4)):
            h = Prepared(a, b, 16, bf, cfg)(a, b, None, sched=torch.zeros(3, 16, dtype=torch.int32))[1]
            out[f"ragged_k 2880x10240x2880x16 tma2 {cfg.short()}"] = info(h)
        rk.EPILOGUE = None
        for m, k, n, g in ((3840, 2048, 1408, 64), (5120, 512, 512, 256)):
            a = torch.empty(1, m, k, dtype=bf)
            for name, b in (("fwd", torch.empty(1, g, k, n, dtype=bf)),
                            ("dgrad", torch.empty(1, g, n, k, dtype=bf).transpose(-1, -2))):
                for cfg in gluon_m_tuning_configs(k, n):
                    h = MPrepared(a, b, bf, cfg)(a, b, torch.zeros(g, dtype=torch.int32))[1]
                    out[f"ragged_m {name} {m}x{k}x{n}x{g} {cfg.short()}"] = info(h)
        import ragdot.kernels.gluon.ragged_m as rm
        rm.HALF_TAIL_TILES = True  # half tail tiles: a second accumulator layout in the same consumer
        a = torch.empty(1, 3840, 2048, dtype=bf)
        for name, b in (("fwd", torch.empty(1, 64, 2048, 1408, dtype=bf)),
                        ("dgrad", torch.empty(1, 64, 1408, 2048, dtype=bf).transpose(-1, -2))):
            for cfg in [c for c in gluon_m_tuning_configs(2048, 1408) if c.block_m >= 128][:3]:
                h = MPrepared(a, b, bf, cfg)(a, b, torch.zeros(64, dtype=torch.int32))[1]
                out[f"ragged_m half {name} 3840x2048x1408x64 {cfg.short()}"] = info(h)
        rm.HALF_TAIL_TILES = False
        x, y, z = torch.empty(1024, 512, dtype=bf), torch.empty(512, 1024, dtype=bf), torch.empty(1024, 1024, dtype=bf)
        for ws, bn, nw, st in ((False, 128, 4, 4), (True, 128, 4, 4), (True, 256, 8, 3)):
            d = (descriptor(x, [128, 64]), descriptor(y, [64, bn]), descriptor(z, [128, bn]))
            if ws:
                h = run_kernel(mm.matmul_ws_kernel, (8, 8), *d, 512, st, mma_layout(128, bn, nw), 24,
                               num_warps=nw, maxnreg=maxnreg_for(nw))
            else:
                h = run_kernel(mm.matmul_pipelined_kernel, (8, 8), *d, 512, st, mma_layout(128, bn, nw),
                               num_warps=nw)
            out[f"matmul ws={ws} {bn} w{nw}"] = info(h)
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not bundled_ptxas(), reason="needs the ptxas bundled with Triton's NVIDIA backend")
def test_sm90_gluon_code_is_warp_specialized_wgmma_without_spills():
    """Every candidate config compiles (for sm_90, on any machine) to wgmma (ragged_k: a transposed-A operand
    from shared memory), register reallocation between the partitions, a TMA store (ragged_k with short groups:
    16-byte pointer stores instead) and zero spills."""
    from ragdot.kernels.gluon.ragged_k import BLOCKED_MAX_ROWS
    from ragdot.kernels.ragged_k import pointer_stores

    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    stdout = compiled_in_a_subprocess(["-c", _COMPILE_SCRIPT])
    usage = json.loads(stdout.strip().splitlines()[-1])
    assert sum(k.startswith("ragged_k ") for k in usage) >= 12
    assert sum(k.startswith("ragged_k_gather") for k in usage) >= 6
    assert sum(k.startswith("ragged_m") for k in usage) >= 12
    assert sum(k.startswith("ragged_m half") for k in usage) >= 4
    assert {info["tma_store"] for k, info in usage.items() if k.startswith("ragged_k")} == {True, False}  # both paths
    picked = _shipped_gluon_picks()
    assert picked  # the shipped tune files pick Gluon somewhere
    spilled = []
    for name, info in usage.items():
        assert info["wgmma"] and info["shared"] <= SHARED_BYTES, (name, info)
        if info["spills"]:
            spilled.append(f"{name} ({info['spills']} B)")
            # any Triton: no config the shipped tune files run spills; Triton 3.6, the release the kernels were
            # written and measured with, spills none of them (3.8 spills 8 bytes in the single-consumer ragged-M
            # tiles, which the shipped files never pick)
            assert name.split()[-1] not in picked and not triton.__version__.startswith("3.6"), (name, info)
        if name.startswith("ragged_k"):  # "ragged_k MxRxNxG ...": the epilogue by the mean group's rows
            r, g = map(int, name.split()[1].split("x")[1::2])
            blocked = pointer_stores(r, g, BLOCKED_MAX_ROWS)
            assert info["tma_store"] != blocked and info["vector_store"] == blocked, name
        else:
            assert info["tma_store"], name
        assert info["ws"] == (" ws=False" not in name), (name, info)
        if name.startswith("ragged_k"):
            assert info["trans_a"], name
        assert info["cp_async"] == name.startswith("ragged_k_gather"), (name, info)
        if name.endswith("p2"):  # ping-pong: the three warpgroups' register requests fit the SM's 64 Ki
            if name.startswith("ragged_k_gather"):  # the second consumer beside a four-warp cp.async producer
                from ragdot.kernels.gluon.ragged_k_gather import GATHER_REGS

                regs, producer = consumer_regs(GluonConfig(consumers=2), GATHER_REGS), GATHER_REGS
            else:
                regs, producer = consumer_regs(GluonConfig(consumers=2)), 24
            assert regs in info["incs"] and max(info["incs"]) + regs + producer <= 512, (name, info)
    assert sum(k.endswith("p2") for k in usage) >= 4
    if spilled:
        warnings.warn(f"Triton {triton.__version__} spills registers in Gluon candidates: {', '.join(spilled)}",
                      stacklevel=1)


def _shipped_gluon_picks() -> set[str]:
    """The short names of the Gluon configs that a shipped tune file runs (its entries whose backend is gluon)."""
    from pathlib import Path

    from ragdot.tune import cache

    return {GluonConfig(**entry["configs"]["gluon"]).short()
            for path in Path(cache.__file__).parent.glob("*.json")
            for entry in cache.load_entries(path).values() if entry.get("backend") == "gluon"}
