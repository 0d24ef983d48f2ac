"""Triton's interpreter (``TRITON_INTERPRET=1``), which runs ragdot's Triton kernels on the CPU, and what it
cannot compute.

Triton 3.6's interpreter multiplies bfloat16 blocks wrongly in ``tl.dot`` (a 16x16x16 product of normal numbers
comes out near 1e10; float16 and float32 are right, and so are bfloat16 loads and stores). A kernel whose
product is wrong must not run, or `auto` would hand back garbage on a CPU with the interpreter on: the
backends ask `dot_refusal` first and refuse such operands with its reason (`auto` then moves on to a backend
that computes them). Whether the interpreter is wrong is probed once per process and dtype with one tiny
product, never while torch.compile traces (the kernels' entry points ask when they run), so a Triton
release that fixes it is used as soon as it is installed.
"""

from __future__ import annotations

import os

import torch

__all__ = ["interpreting", "dot_refusal", "refuse_wrong_dots"]

# False lets the interpreter run every dtype anyway: for tools that read no value a kernel computes, only the
# sizes of what is saved and allocated (benchmarks/saved_bytes.py with bfloat16 on a CPU)
refuse_wrong_dots = True


def interpreting() -> bool:
    """Whether Triton kernels run in its interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_EXACT: dict[torch.dtype, bool] = {}  # dtype -> whether the interpreter's tl.dot of it is right (probed)


def _dot_exact(dtype: torch.dtype) -> bool:
    """Whether the interpreter's ``tl.dot`` of `dtype` blocks is right (probed on first use, eagerly)."""
    if dtype not in _EXACT:
        _EXACT[dtype] = _probe(dtype)
    return _EXACT[dtype]


def _probe(dtype: torch.dtype) -> bool:
    """One 16x16x16 ``tl.dot`` of `dtype` blocks in the interpreter against torch's float32 product."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return True  # nothing to run: no kernel of ragdot's runs either

    @triton.jit
    def _dot_kernel(a, b, c, n: tl.constexpr):  # a, b, c: [n, n] row-major, c float32
        i = tl.arange(0, n)
        tile = i[:, None] * n + i[None, :]
        tl.store(c + tile, tl.dot(tl.load(a + tile), tl.load(b + tile)))

    # probed wherever it is first asked, possibly inside an autocast region or with grad on: neither applies
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(16, 16, generator=gen).to(dtype) for _ in range(2))
        c = torch.empty(16, 16)
        _dot_kernel[(1,)](a, b, c, 16)
        return bool(torch.allclose(c, a.float() @ b.float(), rtol=1e-2, atol=1e-2))


def dot_refusal(*dtypes: torch.dtype) -> str | None:
    """Why a Triton kernel multiplying operands of these dtypes must not run here (None: it may): only under
    the interpreter, for a dtype whose ``tl.dot`` it computes wrong."""
    if torch.compiler.is_compiling() or not interpreting() or not refuse_wrong_dots:
        return None  # traced code: the kernels' entry points ask when they run (no guard on the environment)
    for dtype in dict.fromkeys(dtypes):
        if dtype in (torch.float16, torch.bfloat16) and not _dot_exact(dtype):
            import triton

            return (f"Triton {triton.__version__}'s interpreter (TRITON_INTERPRET=1) computes {dtype} dots wrong; "
                    "run on a GPU or use float16/float32 operands")
    return None
