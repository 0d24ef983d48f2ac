"""`torch`: the vendor grouped GEMM behind `torch._grouped_mm` (CUTLASS on CUDA sm90+, CK/hipBLASLt on ROCm).

ragdot's rules are enforced on top of it: rows past the last group, which it leaves uninitialised, are
zeroed; operands whose strides or alignment it rejects are first copied into a layout it accepts (that copy
is part of this backend's cost). Cases it cannot compute raise NotImplementedError.

Its output dtype is always its input dtype, so the call runs in the input dtype only when the output dtype is
the same (the GPU kernels accumulate 16-bit inputs in float32); any other output dtype runs it on float32
copies of the operands and casts only the result, so f16 inputs with a bf16 output never overflow in f16.
It has no float64 kernel (torch 2.13 on the CPU takes float16, bfloat16 and float32 and raises a RuntimeError
for float64): a float64 operand or output raises NotImplementedError, in all three problems, so `auto`
moves on.
"""

from __future__ import annotations

import array
import itertools

import torch

from ragdot.backends.base import BackendBase
from ragdot.groups import group_ends_from_sizes

__all__ = ["BACKEND"]

_ALIGN_BYTES = 16
_GMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what torch._grouped_mm accepts


def _run_dtype(in_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    """The dtype the products run in: the input dtype when the output has it, else float32 (the widest of
    float32, input and output once float64 is excluded). NotImplementedError for dtypes with no kernel."""
    for what, dtype in (("operand", in_dtype), ("output", out_dtype)):
        if dtype not in _GMM_DTYPES:
            raise NotImplementedError(f"torch._grouped_mm has no {dtype} kernel ({what} dtype)")
    return in_dtype if in_dtype == out_dtype else torch.float32


def _aligned_stride(t: torch.Tensor, dim: int) -> bool:
    return t.stride(dim) % (_ALIGN_BYTES // t.element_size()) == 0


def _layout_ok(t: torch.Tensor, major: str) -> bool:
    """Whether _grouped_mm takes `t` as is: 16-byte aligned base, batch and leading strides, and the
    requested major order ("row": last dim contiguous, "col": second-to-last contiguous, "any": either)."""
    return t.data_ptr() % _ALIGN_BYTES == 0 and _strides_ok(t, major)


def _strides_ok(t: torch.Tensor, major: str) -> bool:
    """The stride part of `_layout_ok` (what a static signature fixes)."""
    if t.ndim == 3 and t.shape[0] > 1 and not _aligned_stride(t, 0):
        return False
    rows, cols = t.shape[-2], t.shape[-1]
    row_major = t.stride(-1) == 1 and t.stride(-2) >= max(1, cols) and _aligned_stride(t, -2)
    col_major = t.stride(-2) == 1 and t.stride(-1) >= max(1, rows) and _aligned_stride(t, -1)
    return {"row": row_major, "col": col_major, "any": row_major or col_major}[major]


def _prepared(t: torch.Tensor, major: str) -> torch.Tensor:
    """`t` itself if its layout is accepted, else a copy in that major order with a 16-byte aligned leading
    stride. The ragged (runtime-sized) dimension must never be the contiguous one: the kernel then needs every
    group offset to be a multiple of 16 bytes and asserts on the device otherwise."""
    if _layout_ok(t, major):
        return t
    align = _ALIGN_BYTES // t.element_size()
    if major == "col":
        return _prepared(t.transpose(-1, -2), "row").transpose(-1, -2)
    cols = t.shape[-1]
    buf = t.new_empty((*t.shape[:-1], -(-cols // align) * align))
    buf[..., :cols].copy_(t)
    return buf[..., :cols]


def _zero_rows_from_(c: torch.Tensor, end: int) -> None:
    """Zero rows >= end of the CPU tensor c [..., M, N] (none when end >= M)."""
    if end < c.shape[-2]:
        c[..., end:, :] = 0


def _zero_tail_rows_(c: torch.Tensor, group_ends: torch.Tensor) -> None:
    """Zero rows >= group_ends[-1] of c [Bt, M, N] or [M, N] without a host synchronisation."""
    if c.is_cuda:
        try:
            from ragdot.kernels.tail import zero_tail_rows_
        except ImportError:
            pass
        else:
            zero_tail_rows_(c if c.dim() == 3 else c.unsqueeze(0), group_ends)
            return
    if c.device.type == "cpu":  # reading a CPU tensor is no synchronisation: zero just the tail, if any
        n = group_ends.numel()  # a short list reads faster than one element (0.4 against 1.8 µs)
        _zero_rows_from_(c, max(group_ends.tolist()[-1] if 0 < n <= 64 else int(group_ends[-1]), 0))
        return
    rows = torch.arange(c.shape[-2], device=c.device)
    c.masked_fill_((rows >= group_ends[-1])[:, None], 0)  # [..., M, N]


def _bound_launches(problem: str, a: torch.Tensor, b: torch.Tensor, groups: int, scale: int):
    """(sizes -> clamped int32 ends, (c, ends) -> zero the tail rows of c or None) for one static signature:
    ragdot's one-launch kernels on CUDA with Triton, torch ops elsewhere."""
    extent = a.shape[1]
    tail_shape = (1, extent, b.shape[-1])
    if a.is_cuda and groups > 0:
        try:
            from ragdot.kernels.ends import MAX_GROUPS, GroupEnds
            from ragdot.kernels.tail import ZeroTail
        except ImportError:
            pass
        else:
            if groups <= MAX_GROUPS:
                tail = ZeroTail(tail_shape, groups, a.device) if problem == "ragged_m" else None
                return GroupEnds(groups, extent, scale, a.device), tail
    tail = _zero_tail_rows_ if problem == "ragged_m" else None
    if a.device.type == "cpu" and 0 < groups <= _HOST_ENDS_MAX_GROUPS:
        ends = _HostEnds(extent, scale)
        return ends, (ends.zero_tail if tail is not None else None)
    return (lambda sizes: group_ends_from_sizes(sizes, extent, scale)), tail


# up to here a loop over the sizes beats three torch ops on a CPU (G=4: 5 vs 7 µs; G=32: 25 vs 11 µs)
_HOST_ENDS_MAX_GROUPS = 8


class _HostEnds:
    """`group_ends_from_sizes` for a few groups on the CPU, where the sizes are host memory (reading them is no
    synchronisation): one pass in Python and one tensor over an int32 buffer (`torch.frombuffer`: 0.8 µs
    against torch.tensor's 2.5), cheaper than clamp, cumsum and clamp there. It keeps the last end it formed,
    so zeroing the rows past it (`zero_tail`) reads no tensor element when given those very ends."""

    __slots__ = ("extent", "scale", "rows", "last")

    def __init__(self, extent: int, scale: int):
        self.extent, self.scale, self.rows = extent, scale, extent // scale
        self.last: tuple[torch.Tensor, int] | None = None

    def __call__(self, sizes: torch.Tensor) -> torch.Tensor:
        rows, scale, extent = self.rows, self.scale, self.extent
        listed = sizes.tolist()
        running = list(itertools.accumulate(listed))
        if min(listed) >= 0 and running[-1] <= rows:  # no size to clamp (the usual case): the running sums
            ends = array.array("i", running if scale == 1 else [e * scale for e in running])
        else:
            total, ends = 0, array.array("i")
            for size in listed:
                total += min(max(size, 0), rows)
                ends.append(min(total * scale, extent))
        out = torch.frombuffer(ends, dtype=torch.int32)  # holds a reference to the buffer
        self.last = (out, ends[-1])
        return out

    def zero_tail(self, c: torch.Tensor, group_ends: torch.Tensor) -> None:
        """`_zero_tail_rows_` for the CPU; the end comes from the last call when `group_ends` is its result."""
        last = self.last
        if last is not None and last[0] is group_ends:
            _zero_rows_from_(c, last[1])
        else:
            _zero_tail_rows_(c, group_ends)


class _PreparedGMM:
    """One `_grouped_mm` problem of a static signature with Bt == 1: the run dtype and which operands must be
    copied into an accepted layout are decided once; a call checks only the operands' base alignment."""

    __slots__ = ("problem", "run", "out_dtype", "a_ok", "b_ok", "majors", "ends", "tail", "ends_key", "views")

    def __init__(self, problem: str, a: torch.Tensor, b: torch.Tensor, groups: int, out_dtype: torch.dtype,
                 scale: int):
        self.problem = problem
        self.ends, self.tail = _bound_launches(problem, a, b, groups, scale)
        self.ends_key = (a.shape[1], groups, scale, a.device)  # products with equal keys take the same offsets
        self.run = _run_dtype(a.dtype, out_dtype)
        self.out_dtype = out_dtype
        cast = self.run != a.dtype  # a cast makes contiguous copies: their layout is checked per call
        if problem == "ragged_m":
            self.majors = ("row", "any")
            mat_a, mat_b = a[0], b[0]
        else:
            self.majors = ("col", "row")
            mat_a, mat_b = a[0].transpose(0, 1), b[0]
        self.a_ok = not cast and _strides_ok(mat_a, self.majors[0])
        self.b_ok = not cast and _strides_ok(mat_b, self.majors[1])
        self.views = ((mat_a.shape, mat_a.stride()), (mat_b.shape, mat_b.stride()))  # what _grouped_mm is given

    # `direct` takes any tensors that start where the canonical operands start (the [M, K] / [R, M] and
    # [G, K, N] / [R, N] matrices themselves, or other views of that memory, e.g. a data gradient's [E, N, K]
    # weight): one as_strided view each where the layout differs, instead of the canonical views and back.
    direct_kind = "address"

    def __call__(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        out = self.direct(a[0], b[0], sizes, None)
        return out.unsqueeze(0) if self.problem == "ragged_m" else out.unsqueeze(1)

    def direct(self, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor, out_shape: tuple[int, ...] | None,
               ends: torch.Tensor | None = None) -> torch.Tensor:
        """a, b: tensors that start where the canonical [M, K] (ragged_m) or [R, M] (ragged_k) and [G, K, N] or
        [R, N] operands start -> [M, N] or [G, M, N], viewed as `out_shape` (the caller's layout of the same
        memory order) when given; `ends`: the offsets of these sizes if the caller formed them already
        (`self.ends(sizes)`, for this `ends_key`)."""
        if ends is None:
            ends = self.ends(sizes)  # the offsets _grouped_mm takes
        (shape_a, stride_a), (shape_b, stride_b) = self.views
        mat_a = a if a.shape == shape_a and a.stride() == stride_a else a.as_strided(shape_a, stride_a)
        mat_b = b if b.shape == shape_b and b.stride() == stride_b else b.as_strided(shape_b, stride_b)
        if not (self.a_ok and mat_a.data_ptr() % _ALIGN_BYTES == 0):
            mat_a = _prepared(mat_a.to(self.run), self.majors[0])
        if not (self.b_ok and mat_b.data_ptr() % _ALIGN_BYTES == 0):
            mat_b = _prepared(mat_b.to(self.run), self.majors[1])
        try:
            out = torch._grouped_mm(mat_a, mat_b, offs=ends)
        except RuntimeError as exc:
            raise NotImplementedError(str(exc)) from exc
        if out.dtype != self.out_dtype:
            out = out.to(self.out_dtype)
        if self.problem == "ragged_m":
            if not out.is_contiguous():  # CUDA pads the row stride to 16 bytes when N is not a multiple
                out = out.contiguous()
            self.tail(out, ends)  # reads only the address: [M, N] is the [1, M, N] it was bound for
        return out if out_shape is None or out.shape == out_shape else out.view(out_shape)


class TorchGroupedMMBackend(BackendBase):
    name = "torch"

    def prepare(self, problem, a, b, num_groups, out_dtype, config=None, scale=1):
        if problem != "batch" and a.shape[0] == 1:
            return _PreparedGMM(problem, a, b, num_groups, out_dtype, scale)
        _run_dtype(a.dtype, out_dtype)  # NotImplementedError now for dtypes it has no kernel for
        return super().prepare(problem, a, b, num_groups, out_dtype, config, scale)

    def is_available(self) -> bool:
        return hasattr(torch, "_grouped_mm")

    def _gmm(self, mat_a, mat_b, offs, run_dtype, out_dtype, majors):
        mat_a = _prepared(mat_a.to(run_dtype), majors[0])
        mat_b = _prepared(mat_b.to(run_dtype), majors[1])
        try:
            out = torch._grouped_mm(mat_a, mat_b, offs=offs)
        except RuntimeError as exc:
            raise NotImplementedError(str(exc)) from exc
        return out.to(out_dtype)

    def ragged_m(self, a, b, group_ends, out_dtype):
        run = _run_dtype(a.dtype, out_dtype)
        # mat_a [M, K] row-major (M, the ragged dim, strided), mat_b [G, K, N] either order.
        outs = [self._gmm(a[i], b[i], group_ends, run, out_dtype, ("row", "any")) for i in range(a.shape[0])]
        out = outs[0].unsqueeze(0) if len(outs) == 1 else torch.stack(outs)
        if not out.is_contiguous():  # CUDA pads the row stride to 16 bytes when N is not a multiple
            out = out.contiguous()
        _zero_tail_rows_(out, group_ends)
        return out

    def ragged_k(self, a, b, group_ends, out_dtype):
        run = _run_dtype(a.dtype, out_dtype)
        # 2D x 2D -> 3D: mat_a [M, R] column-major and mat_b [R, N] row-major, so that R (ragged) is strided
        # in both; empty groups come back zero.
        outs = [
            self._gmm(a[i].transpose(0, 1), b[i], group_ends, run, out_dtype, ("col", "row"))
            for i in range(a.shape[0])
        ]
        return outs[0].unsqueeze(1) if len(outs) == 1 else torch.stack(outs, dim=1)

    def batch(self, a, b, out_dtype):
        run = _run_dtype(a.dtype, out_dtype)  # bmm could run float64, but the backend keeps one dtype rule
        return torch.bmm(a.to(run), b.to(run)).to(out_dtype)


BACKEND = TorchGroupedMMBackend()
