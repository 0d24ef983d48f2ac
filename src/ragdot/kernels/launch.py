"""Bound kernel launches: the static part of a Triton launch resolved once, the launch itself a direct call.

`kernel[grid](*args, **constexprs)` re-derives on every call what a repeated call of one static signature
already knows: the specialization of every argument, the cache key of the compiled kernel, the grid and the
launch metadata (~10 µs of host time per launch on an H200 host with Triton 3.6). A `BoundLaunch` goes through
that path on its first call, keeps the compiled kernel, and afterwards calls the compiled kernel's launcher
directly with the runtime arguments and the constexpr values in parameter order.

Safety: what Triton specializes on must not change between calls of one `BoundLaunch`. Integer arguments
(sizes, strides) are fixed by its owner's static key; tensor arguments' 16-byte alignment is checked per call
(a change recompiles through the JIT path, keeping one compiled kernel per alignment pattern). Inside
`compile_only`, under Triton's interpreter, and while launch hooks are installed with no compiled kernel
yet, every call takes the ordinary path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from triton import knobs

from ragdot.kernels import configs

__all__ = ["BoundLaunch"]


def _alignment(args: Sequence[Any]) -> tuple[bool, ...]:
    return tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))


class BoundLaunch:
    """One kernel on one grid with fixed constexprs and launch options; call it with the runtime arguments.

    kernel: a @triton.jit function whose runtime parameters all come before its constexpr parameters;
    grid: up to three ints; constexprs: values of the constexpr parameters (others take their defaults);
    options: launch options (num_warps, num_stages, maxnreg); device: the CUDA device it runs on, which
    must be the current device when it is called (the caller's device guard sees to that).
    """

    __slots__ = ("kernel", "grid", "constexprs", "options", "device", "_compiled", "_tail", "_direct")

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
        self._compiled: dict[tuple[bool, ...], Any] = {}
        self._tail: tuple[Any, ...] | None = None
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
        align = _alignment(args)
        compiled = self._compiled.get(align)
        if compiled is None:
            compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
            self._compiled[align] = compiled
            self._tail = self._constexpr_tail(len(args))
            return compiled
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if enter.calls or leave.calls:  # a profiler is listening: let Triton build the launch metadata
            return self.kernel[self.grid](*args, **self.constexprs, **self.options)
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        g0, g1, g2 = self.grid
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *self._tail)
        return compiled
