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

from typing import Any

import torch
from triton import knobs

from ragdot.kernels import configs
from ragdot.kernels import record as _record
from ragdot.kernels.interpreter import interpreting

__all__ = ["BoundLaunch", "hooked", "tma_fill_args"]


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


def hooked() -> bool:
    """Whether a Triton launch hook is installed (a profiler listening there must see Triton's own launches)."""
    runtime = knobs.runtime
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


class _Layout:
    """What a bound descriptor slot compares a later call's descriptor with (no reference to its tensor)."""

    __slots__ = ("shape", "strides", "block_shape", "padding")

    def __init__(self, shape: Any, strides: Any, block_shape: Any, padding: Any):
        self.shape, self.strides, self.block_shape, self.padding = shape, strides, block_shape, padding


def tma_fill_args(desc: Any, meta: dict, host_dtype: dict) -> tuple:
    """The static arguments after the base address with which Triton 3.6's CUDA driver encodes a host TMA
    descriptor (`fill_tma_descriptor`): swizzle, element size, the driver's element type, block, shape (the
    last dimension doubled for fp4-padded data), strides (elements) and the out-of-bounds fill (1: NaN).
    One derivation for the bound launches here and the launch programs of `ragdot.native.plan`."""
    shape, strides = list(desc.shape), list(desc.strides)
    if meta["fp4_padded"]:
        shape[-1] *= 2
    return (meta["swizzle"], meta["elem_size"], host_dtype[meta["elem_type"]], meta["block_size"], shape, strides,
            1 if desc.padding == "nan" else 0)


class _Descriptors:
    """Host TMA descriptor arguments turned into what the C launcher takes, without Triton's per-call Python
    wrapper (which walks every argument and re-derives each descriptor's static part on every launch).

    Built from the wrapper's own state (`wrap_handle_tensordesc` in Triton's CUDA driver: the C function, the
    descriptor positions and their metadata) and the layout of the first call's descriptors (shape, strides,
    block, padding; never the descriptor itself, whose base tensor may carry an autograd graph that would then
    stay alive, AccumulateGrad nodes included); a later call whose descriptor layout differs (compared by
    identity first: owners pass the same lists) goes through the wrapper."""

    __slots__ = ("launch", "slots")

    def __init__(self, launch: Any, slots: list[tuple[int, Any, tuple, list]]):
        self.launch = launch  # the C launch function
        self.slots = slots  # per descriptor, last first: (position, first layout, fill args, tail values)

    @classmethod
    def bind(cls, wrapped: Any, args: tuple) -> _Descriptors | None:
        code = getattr(wrapped, "__code__", None)
        need = {"launcher", "tensordesc_indices", "tensordesc_meta"}
        if code is None or not need <= set(code.co_freevars):
            return None
        cells = {n: c.cell_contents for n, c in zip(code.co_freevars, wrapped.__closure__)}
        positions = sorted(cells["tensordesc_indices"])
        metas = cells["tensordesc_meta"] or [None] * len(positions)
        if len(metas) != len(positions) or any(p >= len(args) for p in positions):
            return None
        try:
            from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as host_dtype
            from triton.runtime import driver

            fill = driver.active.utils.fill_tma_descriptor
            return cls(cells["launcher"], cls._slots(args, positions, metas, fill, host_dtype))
        except (ImportError, AttributeError, KeyError, TypeError):  # another Triton's layout: its own wrapper
            return None

    @staticmethod
    def _slots(args: tuple, positions: list[int], metas: list, fill: Any, host_dtype: dict) -> list:
        slots = []
        for pos, meta in zip(positions, metas):
            d = args[pos]
            shape, strides = list(d.shape), list(d.strides)
            layout = _Layout(d.shape, d.strides, d.block_shape, d.padding)
            if meta is None:  # decomposed in the front end: base, shape, strides, padding, shape, strides
                slots.append((pos, layout, None, [*shape, *strides, d.padding == "nan", *shape, *strides]))
                continue
            fixed = tma_fill_args(d, meta, host_dtype)
            slots.append((pos, layout, (fill, fixed), [*fixed[4], *strides]))  # the shape as filled (fp4: doubled)
        return slots[::-1]

    def expand(self, args: tuple) -> list | None:
        """The launcher's arguments for `args`, or None when a descriptor is not the bound one's layout."""
        out = list(args)
        for pos, first, how, tail in self.slots:
            d = out[pos]
            if not (d.shape is first.shape or d.shape == first.shape) or not (
                    d.strides is first.strides or d.strides == first.strides) or not (
                    d.block_shape is first.block_shape or d.block_shape == first.block_shape) or (
                    d.padding != first.padding):
                return None
            if how is None:
                out[pos:pos + 1] = [d.base, *tail]
            else:
                fill, fixed = how
                out[pos:pos + 1] = [fill(d.base.data_ptr(), *fixed), *tail]
        return out


def _specialization(positions: list[int]) -> Any:
    """args -> what Triton specializes a compiled kernel on beyond its owner's static key: each tensor
    argument's dtype and whether its address is 16-byte aligned (tensors at `positions`), as one flat tuple.
    The one- and two-tensor forms (most of ragdot's launches) skip a generator's cost per call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i].dtype, args[i].data_ptr() % 16 == 0)
    if len(positions) == 2:
        i, j = positions
        return lambda args: (args[i].dtype, args[i].data_ptr() % 16 == 0, args[j].dtype, args[j].data_ptr() % 16 == 0)
    return lambda args: tuple(x for i in positions for x in (args[i].dtype, args[i].data_ptr() % 16 == 0))


def _entry(compiled: Any, args: tuple) -> tuple:
    """(compiled, the C function to call, the arguments between the stream and the kernel's own, the bound
    descriptors or None) of a compiled kernel: its C launcher called directly where that is exactly what its
    launcher would do (`_raw_launcher`), else the launcher itself."""
    raw = _raw_launcher(compiled)
    if raw is None:
        return compiled, compiled.run, (compiled.function, compiled.packed_metadata, None, None, None), None
    head = (compiled.function, raw.launch_cooperative_grid, raw.launch_pdl, None, None, compiled.packed_metadata,
            None, None, None)
    return compiled, raw.launch, head, _Descriptors.bind(raw.launch, args)


class BoundLaunch:
    """One kernel on one grid with fixed constexprs and launch options; call it with the runtime arguments.

    kernel: a @triton.jit function whose runtime parameters all come before its constexpr parameters;
    grid: up to three ints; constexprs: values of the constexpr parameters (others take their defaults);
    options: launch options (num_warps, num_stages, maxnreg); device: the CUDA device it runs on (made the
    current device for the launch when another one is).
    """

    __slots__ = ("kernel", "grid", "constexprs", "options", "device", "_compiled", "_tail", "_direct", "_key_of")

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
        self._compiled: dict[tuple, tuple] = {}  # specialization key -> (compiled, launch, head, descriptors)
        self._tail: tuple[Any, ...] | None = None
        self._key_of: Any = None  # args -> the specialization key (`_specialization`), made at the first call
        self._direct = not interpreting()

    @classmethod
    def in_order(cls, kernel: Any, grid: tuple[int, ...], constexprs: tuple[Any, ...], options: dict[str, Any],
                 device: torch.device) -> BoundLaunch:
        """A BoundLaunch whose constexpr values are given in the kernel's parameter order."""
        names = [p.name for p in kernel.params if p.is_constexpr]
        if len(constexprs) != len(names):
            raise TypeError(f"{kernel.__name__}: {len(constexprs)} constexpr values for {len(names)} parameters")
        return cls(kernel, grid, dict(zip(names, constexprs)), options, device)

    def _constexpr_tail(self, n_runtime: int) -> tuple[Any, ...]:
        values = []
        for param in self.kernel.params[n_runtime:]:
            if not param.is_constexpr:
                raise TypeError(f"{self.kernel.__name__}: parameter {param.name} follows a constexpr parameter")
            values.append(self.constexprs.get(param.name, param.default))
        return tuple(values)

    def _first_launch(self, args: tuple) -> Any:
        """Triton's own launch, which compiles the kernel and checks it against the device. A pipeline that
        does not fit the device's shared memory (Triton's OutOfResources: a tile chosen for an H200's 227 KB
        on a GPU with about 100 KB, or an MI300's 64 KB of LDS) runs with one stage fewer at a time, down to
        one (the stages only prefetch: the results are the same); when one stage does not fit either,
        NotImplementedError, so that `auto` moves on to another backend."""
        from triton.runtime.errors import OutOfResources

        while True:
            try:
                return self.kernel[self.grid](*args, **self.constexprs, **self.options)
            except OutOfResources as exc:
                stages = self.options.get("num_stages", 1)  # kernels that pipeline by their own constexprs: 1
                if stages <= 1:
                    raise NotImplementedError(f"{self.kernel.__name__}: {exc}") from exc
                self.options = {**self.options, "num_stages": stages - 1}

    def __call__(self, *args: Any) -> Any:
        """Launch with the runtime arguments (tensors, descriptors, scalars) in parameter order."""
        if _record._ACTIVE is not None:  # ragdot.kernels.record: launch as usual, then note the launch
            rec = _record.active()
            if rec is not None:  # this thread's record (the only one: records are taken one at a time)
                _record._ACTIVE = None
                try:
                    compiled = self(*args)
                finally:
                    _record._ACTIVE = rec
                rec.steps.append(_record.Launch(compiled, self.grid, args, self.device))
                return compiled
        if not self._direct or configs._AOT_TARGET is not None:
            return configs.run_kernel(self.kernel, self.grid, *args, **self.constexprs, **self.options)
        # Triton launches on the current device: make it ours (the raw query: CUDA is initialised by now)
        if torch._C._cuda_getDevice() != self.device:
            with torch.cuda.device(self.device):
                return self(*args)
        key_of = self._key_of
        if key_of is None:
            key_of = self._key_of = _specialization([i for i, a in enumerate(args) if isinstance(a, torch.Tensor)])
        key = key_of(args)
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self._first_launch(args)
            self._compiled[key] = _entry(compiled, args)
            self._tail = self._constexpr_tail(len(args))
            return compiled
        compiled, launch, head, descs = entry
        if hooked():  # a profiler listens: Triton's path
            return self.kernel[self.grid](*args, **self.constexprs, **self.options)
        if descs is not None:
            expanded = descs.expand(args)
            if expanded is not None:
                launch, args = descs.launch, expanded
        g0, g1, g2 = self.grid
        launch(g0, g1, g2, torch._C._cuda_getCurrentRawStream(self.device), *head, *args, *self._tail)
        return compiled
