"""Bound kernel launches: the static part of a Triton launch resolved once, the launch itself a direct call.

`kernel[grid](*args, **constexprs)` re-derives on every call what a repeated call of one static signature
already knows: the specialization of every argument, the cache key of the compiled kernel, the grid and the
launch metadata (~10 µs of host time per launch on an H200 host with Triton 3.6). A `BoundLaunch` goes through
that path on its first call, keeps the compiled kernel, and afterwards calls the compiled kernel's launcher
directly with the runtime arguments and the constexpr values in parameter order.

Safety: what Triton specializes on must not change between calls of one `BoundLaunch`. Integer arguments
(sizes, strides) are fixed by its owner's static key; tensor arguments' dtypes and 16-byte alignment are
checked per call (a change goes through the JIT path once, keeping one compiled kernel per pattern). Inside
`compile_only`, under Triton's interpreter, and while launch hooks are installed with no compiled kernel
yet, every call takes the ordinary path.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from triton import knobs

from ragdot.kernels import configs

__all__ = ["BoundLaunch"]


def _raw_launcher(compiled: Any) -> Any:
    """The C launch function behind a compiled kernel's launcher, where calling it directly is exactly
    what the launcher would do (Triton 3.x's CUDA launcher without scratch buffers); else None."""
    launcher = compiled.run
    names = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl")
    if not all(hasattr(launcher, n) for n in names):
        return None
    if launcher.global_scratch_size or launcher.profile_scratch_size or getattr(launcher, "num_ctas", 1) != 1:
        return None
    return launcher


class BoundLaunch:
    """One kernel on one grid with fixed constexprs and launch options; call it with the runtime arguments.

    kernel: a @triton.jit function whose runtime parameters all come before its constexpr parameters;
    grid: up to three ints; constexprs: values of the constexpr parameters (others take their defaults);
    options: launch options (num_warps, num_stages, maxnreg); device: the CUDA device it runs on (made the
    current device for the launch when another one is).
    """

    __slots__ = ("kernel", "grid", "constexprs", "options", "device", "_compiled", "_tail", "_direct", "_tensors")

    def __init__(
        self, kernel: Any, grid: tuple[int, ...], constexprs: dict[str, Any], options: dict[str, Any],
        device: torch.device,
    ):
        self.kernel = kernel
        self.device = device.index if device.index is not None else (
            torch.cuda.current_device() if device.type == "cuda" else 0)
        self.grid = (*grid, 1, 1)[:3]
        self.constexprs = constexprs
        self.options = options
        self._compiled: dict[tuple, Any] = {}
        self._tail: tuple[Any, ...] | None = None
        self._tensors: tuple[int, ...] | None = None  # positions of the tensor arguments
        self._direct = os.environ.get("TRITON_INTERPRET", "0") != "1"

    def _constexpr_tail(self, n_runtime: int) -> tuple[Any, ...]:
        values = []
        for param in self.kernel.params[n_runtime:]:
            if not param.is_constexpr:
                raise TypeError(f"{self.kernel.__name__}: parameter {param.name} follows a constexpr parameter")
            values.append(self.constexprs.get(param.name, param.default))
        return tuple(values)

    def __call__(self, *args: Any) -> Any:
        """Launch with the runtime arguments (tensors, descriptors, scalars) in parameter order."""
        if not self._direct or configs._AOT_TARGET is not None:
            return configs.run_kernel(self.kernel, self.grid, *args, **self.constexprs, **self.options)
        if torch.cuda.current_device() != self.device:  # Triton launches on the current device: make it ours
            with torch.cuda.device(self.device):
                return self(*args)
        if self._tensors is None:
            self._tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        align = tuple((args[i].dtype, args[i].data_ptr() % 16 == 0) for i in self._tensors)
        entry = self._compiled.get(align)
        if entry is None:
            compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
            self._compiled[align] = (compiled, _raw_launcher(compiled))
            self._tail = self._constexpr_tail(len(args))
            return compiled
        compiled, raw = entry
        runtime = knobs.runtime
        if runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls:  # a profiler listens: Triton's path
            return self.kernel[self.grid](*args, **self.constexprs, **self.options)
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        g0, g1, g2 = self.grid
        if raw is not None:
            raw.launch(g0, g1, g2, stream, compiled.function, raw.launch_cooperative_grid, raw.launch_pdl, None, None,
                       compiled.packed_metadata, None, None, None, *args, *self._tail)
        else:
            compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args, *self._tail)
        return compiled
