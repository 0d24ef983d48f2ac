"""Helpers shared by the suites: dtypes per backend and device, tolerances, inputs, the benchmark scripts."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ragdot
from ragdot.kernels.gluon import unavailable_reason
from ragdot.routing import balanced, empty, skewed

# Normalised error ||out - ref|| / ||ref|| allowed per input dtype.
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def dtypes_for(backend: str, device: torch.device) -> list[torch.dtype]:
    if device.type == "cpu":
        # The Triton interpreter computes bf16 dots wrongly: fp16/fp32 only there.
        return [torch.float32, torch.float16] if backend == "triton" else [torch.float32, torch.bfloat16]
    return [torch.bfloat16, torch.float32] if backend != "triton" else [torch.bfloat16, torch.float16, torch.float32]


# The backends the shared suites parametrize over. `gluon` (sm_90 GPUs) serves a subset by design: 16-bit
# operands, K a multiple of its block, 16-byte rows; asked for by name it raises NotImplementedError elsewhere,
# which `auto` turns into its next candidate. Its own suite (test_gluon.py) and `auto` cover it.
GENERAL_BACKENDS = [b for b in ragdot.backends() if b != "gluon"]


def cpu_backends() -> list[str]:
    """The usable backends that take CPU tensors: on a GPU machine (Triton's interpreter off) not the GPU
    kernels' ones, which refuse CPU tensors with a NotImplementedError (tests with CPU operands parametrize over
    these)."""
    from ragdot.kernels.interpreter import interpreting

    return [b for b in ragdot.backends() if b not in ("triton", "gluon") or interpreting()]


def backend_dtype_params(device: torch.device) -> list[tuple[str, torch.dtype]]:
    return [(b, dt) for b in GENERAL_BACKENDS for dt in dtypes_for(b, device)]


def rand(shape, dtype, device, gen, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def nerr(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """||out - ref|| / ||scale|| (scale: ref itself by default). Pass the same product of the operands' absolute
    values as `scale` where a few random terms may cancel: a rounding error is relative to the sum of the terms'
    magnitudes, not to what is left after they cancel."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    denom = (ref if scale is None else scale.detach().to("cpu", torch.float64)).norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def bundled_ptxas() -> bool:
    """Whether Triton's NVIDIA backend ships its ptxas (sm_90 code can then be compiled on any machine)."""
    try:
        import triton
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


# Shape errors that jax.lax.ragged_dot_general raises as TypeErrors, with the phrase of jax's message that
# ragdot's message begins with: (lhs shape, rhs shape, group_sizes shape, dimension numbers, phrase as a regex).
JAX_SHAPE_ERRORS = [
    ((11, 5), (3, 5, 7), (3,), ((((1,), (1,)), ((), ())), (0, 1), (0,)),
     "ragged_dot_general expects exactly one lhs ragged dimension"),
    ((11, 5), (3, 5, 7), (3,), ((((1,), (1,)), ((), ())), (2,), (0,)),
     "requires lhs ragged dimension numbers to be nonnegative and less than the number of axes of the lhs"),
    ((11, 5), (3, 5, 7), (2, 3), ((((1,), (1,)), ((), ())), (0,), (0,)),
     r"expected group_sizes to have shape \(3,\), got \(2, 3\)"),
    ((19, 17, 11, 5), (3, 19, 5, 7), (19, 11, 3), ((((3,), (2,)), ((0,), (1,))), (2,), (0,)),
     r"expected group_sizes to have shape \(19, 17, 3\), got \(19, 11, 3\)"),
    ((19, 11, 17, 5), (19, 17, 5, 7), (19, 11, 3), ((((2, 3), (1, 2)), ((0,), (0,))), (3,), ()),
     r"expected group_sizes to have shape \(19, 17, 3\), got \(19, 11, 3\)"),
    ((17, 19, 11, 5), (17, 19, 5, 7), (19, 3), ((((3,), (2,)), ((0, 1), (0, 1))), (1,), ()),
     r"expected group_sizes to have shape \(17, 3\), got \(19, 3\)"),
    ((19, 11, 5), (19, 5, 7), (19, 3), ((((2,), (1,)), ((0,), (0,))), (1,), (0,)),
     "requires rhs group dimension numbers to be distinct from contracting and batch dimensions"),
    ((11, 3), (3, 3, 7), (3,), ((((1,), (1,)), ((), ())), (0,), (1,)),
     "requires rhs group dimension numbers to be distinct from contracting and batch dimensions"),
    ((11, 5), (3, 5, 7), (2,), ((((1,), (1,)), ((), ())), (0,), (0,)),
     "expected rhs group dimension size to be 2, got 3"),
    ((2, 11, 5), (3, 2, 5, 7), (3,), ((((2,), (2,)), ((0,), (1,))), (0,), (0,)),
     "requires zero group dimensions in the rhs when lhs ragged dimension is contracting or batch"),
    ((11, 5), (3, 5, 7), (3,), ((((1,), (1,)), ((), ())), (1,), (0,)),
     "requires zero group dimensions in the rhs when lhs ragged dimension is contracting or batch"),
    ((11, 5), (5, 7), (3,), ((((1,), (0,)), ((), ())), (0,), ()),
     "requires exactly one rhs group dimension when lhs ragged dimension is noncontracting"),
]


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_script(name: str):
    """benchmarks/<name>.py executed afresh as module `name`: registered in sys.modules (its dataclasses look
    their module up there) with benchmarks/ on sys.path (scripts that import their neighbours)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compiled_in_a_subprocess(argv: list[str]) -> str:
    """stdout of `python <argv>` run with this checkout's src/ first on PYTHONPATH and without TRITON_INTERPRET
    (the interpreter compiles nothing): for builds of GPU code on any machine (`compile_only`). Fails the test,
    with the end of stderr, when the process fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCHMARKS.parent / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) inside the block (with the cuBLAS workspace setting its matmuls
    need on CUDA), the previous setting restored after."""
    previous = torch.are_deterministic_algorithms_enabled()
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


def needs_fused_block(cpu: bool = True) -> None:
    """Skip unless ragdot's fused MoE block can run here: Triton, and for operands on the CPU its interpreter
    (which conftest turns on only where there is no CUDA device: on a GPU machine a CPU model's experts take the
    ragged_dot path, so a test of the fused block on the CPU has nothing to test there)."""
    import pytest

    from ragdot.kernels.interpreter import interpreting
    from ragdot.moe import routing_kernels

    if not routing_kernels.HAS_TRITON:
        pytest.skip("the fused experts need triton (its interpreter on the CPU)")
    if cpu and not interpreting():
        pytest.skip("the fused block on the CPU needs Triton's interpreter (TRITON_INTERPRET=1, set only where "
                    "there is no CUDA device)")


# ---- the Gluon kernels' GPU tests (test_gluon.py, test_gluon_ragged_m.py, test_gluon_gather.py) -------------
ON_HOPPER = torch.cuda.is_available() and unavailable_reason() is None
hopper = pytest.mark.skipif(not ON_HOPPER, reason=f"needs an sm_90 GPU with Gluon: {unavailable_reason()}")


SIZES_BY_ROUTING = {  # the group sizes the Gluon kernels' GPU tests run, per routing
    "balanced": lambda r, e: balanced(r, e).tolist(),
    "skewed": lambda r, e: skewed(r, e).tolist(),
    "empty": lambda r, e: empty(r, e).tolist(),
}


def ragged_k_reference(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """float64 c [G, Bt, M, N] of a ragged_k (weight-gradient) problem: each group contracts its own rows only
    (empty -> zeros)."""
    bt, _, m = a.shape
    out = torch.zeros(len(sizes), bt, m, b.shape[2], dtype=torch.float64, device=a.device)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        out[g] = a[:, rows].double().transpose(1, 2) @ b[:, rows].double()
        start += size
    return out


def misaligned_nan_tailed(rows: int, cols: int, nan_from: int, gen: torch.Generator, device) -> torch.Tensor:
    """float16 [1, rows, cols] starting 2 bytes past a 16-byte boundary (TMA refuses it), NaN from row `nan_from`
    on: the operand of the Gluon kernels' fallback tests."""
    buf = torch.randn(rows * cols + 8, generator=gen).to(device, torch.float16)
    a = buf[1 : 1 + rows * cols].view(1, rows, cols)
    a[:, nan_from:] = float("nan")
    return a
