"""Token routing kernels for the sparse MoE path: counting-sort permute and the weighted top-k combine.

Assignment ``a = t * top_k + j`` is token ``t``'s ``j``-th expert choice. The permute is a stable counting
sort of the assignments by expert, done in three launches and without any host synchronisation:

1. ``_histogram_kernel``: each block of ``BLOCK_A`` assignments counts its experts -> ``counts [NB, E]``;
2. ``_scan_kernel``: per expert, an exclusive scan over the blocks -> ``base [NB, E]`` and ``sizes [E]``;
3. ``_dispatch_kernel``: each block ranks its assignments among equal experts of the same block, adds the
   expert's start and ``base`` to get the destination row (``slots [A]``) and copies the token rows there
   (the gather is fused into the scatter of the sort; no argsort, no index round trip).

The combine ``y[t] = sum_j w[t, j] * rows[slots[t*top_k + j]]`` gathers each token's ``top_k`` rows and sums
them in the fixed order ``j = 0 .. top_k-1`` in float32: no atomics, bitwise reproducible. Its backward
(``_combine_bwd_kernel``) scatters ``w * dy`` to the rows and reduces ``<dy, rows>`` for the weight gradient.
``routing_index`` turns a sort's ``order`` into the token of each permuted row and ``slots`` in one launch (the
fused block's gather and combine read them).

Every function has a torch fallback (``impl="torch"``, used where Triton is missing) with the same results:
bitwise for the metadata and copied rows, up to float32 rounding for the sums. Expert ids are clamped into
``[0, E)``, so no input can cause an out-of-bounds access. The row-copy kernels split the columns over a
second grid axis so that small token counts still fill the GPU. Loop bounds are compile-time constants
(``D``, ``COLS``): a runtime bound also breaks Triton 3.6's interpreter under numpy >= 2.4.

Host time: the launch geometry of a signature (assignments, width, experts) is computed once
(``functools.lru_cache``) and every launch goes through a cached ``ragdot.kernels.launch.BoundLaunch`` keyed by
the kernel, grid, constexprs and every integer argument (what Triton specializes on), so a repeated call skips
Triton's per-launch argument binding. The histogram and scan temporaries share one allocation.
"""

from __future__ import annotations

import functools

import torch

from ragdot._memo import remember

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is optional
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "sort_and_dispatch", "sort_order", "combine", "combine_backward", "inverse_permutation",
           "routing_index"]

_SORT_BLOCK = 128  # assignments per program of the sort kernels
_SCAN_TILE = 8192  # counts per program of the scan (NB_POW2 x BLOCK_E)
_TARGET_PROGRAMS = 1024  # row-copy kernels split the columns until their grid has about this many programs


if HAS_TRITON:

    @triton.jit
    def _histogram_kernel(
        experts_ptr,  # int32|int64 [A]: expert of assignment a
        counts_ptr,  # int32 [NB, E]: out, experts counted per block of BLOCK_A assignments
        A,
        E,
        BLOCK_A: tl.constexpr,
        E_POW2: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK_A + tl.arange(0, BLOCK_A)
        valid = offs < A
        e = tl.load(experts_ptr + offs, mask=valid, other=0).to(tl.int32)
        e = tl.minimum(tl.maximum(e, 0), E - 1)
        hist = tl.histogram(e, E_POW2, mask=valid)
        bins = tl.arange(0, E_POW2)
        tl.store(counts_ptr + pid * E + bins, hist, mask=bins < E)

    @triton.jit
    def _scan_kernel(
        counts_ptr,  # int32 [NB, E]: per-block histogram
        base_ptr,  # int32 [NB, E]: out, assignments of expert e in blocks before b
        sizes_ptr,  # int32 [E]: out, assignments of expert e in total (the group sizes)
        NB,
        E,
        NB_POW2: tl.constexpr,
        BLOCK_E: tl.constexpr,
    ):
        cols = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
        rows = tl.arange(0, NB_POW2)
        m = (rows < NB)[:, None] & (cols < E)[None, :]
        ptrs = rows[:, None] * E + cols[None, :]
        c = tl.load(counts_ptr + ptrs, mask=m, other=0)
        tl.store(base_ptr + ptrs, tl.cumsum(c, axis=0) - c, mask=m)
        tl.store(sizes_ptr + cols, tl.sum(c, axis=0), mask=cols < E)

    @triton.jit
    def _dispatch_kernel(
        x_ptr,  # [T, D]: token rows (row stride stride_x, unit column stride)
        experts_ptr,  # int32|int64 [A]: expert of assignment a = t * TOP_K + j
        base_ptr,  # int32 [NB, E]: from _scan_kernel
        sizes_ptr,  # int32 [E]: from _scan_kernel
        slots_ptr,  # int32 [A]: out, row of assignment a in the permuted layout
        out_ptr,  # [A, D]: out, x[t(a)] at row slots[a] (written only if COPY_ROWS)
        order_ptr,  # int32 [A]: out, the assignment at each permuted row (written only if WRITE_ORDER)
        A,
        E,
        stride_x,
        stride_out,
        D: tl.constexpr,
        TOP_K: tl.constexpr,
        BLOCK_A: tl.constexpr,
        BLOCK_D: tl.constexpr,
        COLS: tl.constexpr,
        E_POW2: tl.constexpr,
        COPY_ROWS: tl.constexpr = True,
        WRITE_ORDER: tl.constexpr = False,
    ):
        # grid (NB, cdiv(D, COLS)): each column slice re-derives its block's slots (cheap), copies COLS cols
        pid = tl.program_id(0)
        idx = tl.arange(0, BLOCK_A)
        offs = pid * BLOCK_A + idx
        valid = offs < A
        e = tl.load(experts_ptr + offs, mask=valid, other=0).to(tl.int32)
        e = tl.minimum(tl.maximum(e, 0), E - 1)
        # first row of each expert: exclusive scan of the group sizes, picked per assignment by a one-hot
        bins = tl.arange(0, E_POW2)
        sizes = tl.load(sizes_ptr + bins, mask=bins < E, other=0)
        starts = tl.cumsum(sizes, axis=0) - sizes
        start = tl.sum(tl.where(e[:, None] == bins[None, :], starts[None, :], 0), axis=1)
        # stable rank among the same expert inside this block (masked tail entries sort after every valid one)
        earlier = (e[:, None] == e[None, :]) & (idx[None, :] < idx[:, None])
        rank = tl.sum(earlier.to(tl.int32), axis=1)
        before = tl.load(base_ptr + pid * E + e, mask=valid, other=0)
        slot = start + before + rank
        if tl.program_id(1) == 0:
            tl.store(slots_ptr + offs, slot, mask=valid)
            if WRITE_ORDER:
                tl.store(order_ptr + slot, offs, mask=valid)
        if COPY_ROWS:
            src = (offs // TOP_K).to(tl.int64) * stride_x
            dst = slot.to(tl.int64) * stride_out
            for i in range(COLS // BLOCK_D):
                cols = tl.program_id(1) * COLS + i * BLOCK_D + tl.arange(0, BLOCK_D)
                m = valid[:, None] & (cols < D)[None, :]
                rows = tl.load(x_ptr + src[:, None] + cols[None, :], mask=m)
                tl.store(out_ptr + dst[:, None] + cols[None, :], rows, mask=m)

    @triton.jit
    def _routing_index_kernel(
        order_ptr,  # int32 [A]: the assignment at each permuted row (sort_order's order)
        tokens_ptr,  # int32 [A]: out, the token of each permuted row, order // TOP_K
        slots_ptr,  # int32 [A]: out, the permuted row of each assignment, slots[order[r]] = r
        A,
        TOP_K: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        valid = r < A
        o = tl.load(order_ptr + r, mask=valid, other=0)
        o = tl.minimum(tl.maximum(o, 0), A - 1)  # an order that is no permutation writes no row out of bounds
        tl.store(tokens_ptr + r, o // TOP_K, mask=valid)
        tl.store(slots_ptr + o, r, mask=valid)

    @triton.jit
    def _combine_kernel(
        rows_ptr,  # [A, D]: permuted rows (row stride stride_r, unit column stride)
        slots_ptr,  # int32 [A]: row of assignment a = t * TOP_K + j
        weights_ptr,  # float [T, TOP_K] contiguous: combine weights (read only if HAS_WEIGHTS)
        out_ptr,  # [T, D]: out, sum_j w[t, j] * rows[slots[t*TOP_K + j]] in float32, j ascending
        T,
        D,
        stride_r,
        stride_out,
        TOP_K: tl.constexpr,
        HAS_WEIGHTS: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        tok_ok = toks < T
        m = tok_ok[:, None] & (cols < D)[None, :]
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            slot = tl.load(slots_ptr + toks * TOP_K + j, mask=tok_ok, other=0).to(tl.int64)
            slot = tl.minimum(tl.maximum(slot, 0), T * TOP_K - 1)  # slots that are no permutation: in bounds
            r = tl.load(rows_ptr + slot[:, None] * stride_r + cols[None, :], mask=m, other=0.0).to(tl.float32)
            if HAS_WEIGHTS:
                w = tl.load(weights_ptr + toks * TOP_K + j, mask=tok_ok, other=0.0).to(tl.float32)
                r = r * w[:, None]
            acc += r
        out = out_ptr + toks.to(tl.int64)[:, None] * stride_out + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _combine_bwd_kernel(
        grad_ptr,  # [T, D]: dL/dy (row stride stride_g, unit column stride)
        rows_ptr,  # [A, D]: forward's permuted rows (read only if NEED_GRAD_W)
        slots_ptr,  # int32 [A]: row of assignment a
        weights_ptr,  # float [A]: combine weights, flattened (read only if HAS_WEIGHTS)
        grad_rows_ptr,  # [A, D] contiguous: out, w[a] * dy[t(a)] at row slots[a]
        grad_w_ptr,  # float32 [SPLIT, A]: out, <dy[t(a)], rows[slots[a]]> over slice s (if NEED_GRAD_W)
        A,
        stride_g,
        stride_r,
        D: tl.constexpr,
        TOP_K: tl.constexpr,
        HAS_WEIGHTS: tl.constexpr,
        NEED_GRAD_W: tl.constexpr,
        BLOCK_A: tl.constexpr,
        BLOCK_D: tl.constexpr,
        COLS: tl.constexpr,
    ):
        # grid (cdiv(A, BLOCK_A), SPLIT = cdiv(D, COLS)); the weight gradient is summed over slices afterwards
        offs = tl.program_id(0) * BLOCK_A + tl.arange(0, BLOCK_A)
        valid = offs < A
        slot = tl.load(slots_ptr + offs, mask=valid, other=0).to(tl.int64)
        src = (offs // TOP_K).to(tl.int64) * stride_g
        if HAS_WEIGHTS:
            w = tl.load(weights_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        dot = tl.zeros([BLOCK_A], dtype=tl.float32)
        for i in range(COLS // BLOCK_D):
            cols = tl.program_id(1) * COLS + i * BLOCK_D + tl.arange(0, BLOCK_D)
            m = valid[:, None] & (cols < D)[None, :]
            g = tl.load(grad_ptr + src[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
            scaled = g
            if HAS_WEIGHTS:
                scaled = g * w[:, None]
            dst = grad_rows_ptr + slot[:, None] * D + cols[None, :]
            tl.store(dst, scaled.to(grad_rows_ptr.dtype.element_ty), mask=m)
            if NEED_GRAD_W:
                r = tl.load(rows_ptr + slot[:, None] * stride_r + cols[None, :], mask=m, other=0.0)
                dot += tl.sum(g * r.to(tl.float32), axis=1)
        if NEED_GRAD_W:
            tl.store(grad_w_ptr + tl.program_id(1) * A + offs, dot, mask=valid)


_LAUNCHES: dict[tuple, object] = {}
_MAX_LAUNCHES = 4096


def _launch(kernel, grid: tuple[int, ...], consts: dict, num_warps: int, *args) -> None:
    """kernel[grid](*args, **consts, num_warps=num_warps) through a cached bound launch (same kernel, same bits).

    The key holds every non-tensor argument: Triton specializes on integer values (1, multiples of 16), so a
    bound launch must only see the integers it was compiled for; tensors' dtypes and alignment are checked by
    the bound launch on every call."""
    from ragdot.kernels.launch import BoundLaunch

    device = args[0].device
    scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
    key = (kernel, grid, tuple(consts.items()), num_warps, device, scalars)
    bound = _LAUNCHES.get(key)
    if bound is None:
        bound = remember(_LAUNCHES, key, BoundLaunch(kernel, grid, consts, {"num_warps": num_warps}, device),
                         _MAX_LAUNCHES)
    bound(*args)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_d(d: int) -> int:
    return min(128, _pow2(max(d, 16)))


def _column_split(row_programs: int, d: int, block_d: int) -> tuple[int, int]:
    """(programs along the columns, columns per program): enough programs to keep the SMs' loads in flight."""
    chunks = _cdiv(d, block_d)
    split = min(chunks, max(1, _cdiv(_TARGET_PROGRAMS, row_programs)))
    cols = _cdiv(chunks, split) * block_d
    return _cdiv(d, cols), cols


def _unit_columns(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# ---------------------------------------------------------------------------------------------- permute
def _sort_torch(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counting sort as a stable sort: (group_sizes int32 [E], slots int32 [A], order int64 [A]).

    ``order[r]``: the assignment at permuted row r (a stable argsort of the clamped expert ids, so equal
    experts keep assignment order: the counting sort's layout); ``slots`` is its inverse. About ten launches
    and O(A log A) work, where a dense one-hot prefix sum takes [E, A] memory."""
    flat = experts.reshape(-1).long().clamp(0, num_experts - 1)
    order = torch.argsort(flat, stable=True)
    sizes = torch.zeros((num_experts,), dtype=torch.int32, device=flat.device)
    sizes.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return sizes, inverse_permutation(order, torch.int32), order


def inverse_permutation(perm: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """inv [N] with inv[perm[i]] = i, in `dtype` (perm's by default): e.g. slots from order."""
    positions = torch.arange(perm.numel(), dtype=dtype or perm.dtype, device=perm.device)
    return torch.empty_like(positions).scatter_(0, perm.long(), positions)


_INDEX_BLOCK = 1024  # permuted rows per program of the routing-index kernel


def routing_index(order: torch.Tensor, top_k: int, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """order int32 [A] (``sort_order``'s) -> (tokens int32 [A], slots int32 [A]): the token of each permuted row
    (``order // top_k``, the rows a gather reads) and the permuted row of each assignment (``slots[order[r]] =
    r``, what ``combine`` reads). One launch with Triton (a division, an arange and a scatter as torch ops)."""
    a = order.numel()
    if impl == "torch" or a == 0:
        return _tokens_torch(order, top_k), inverse_permutation(order)
    out = torch.empty((2, a), dtype=torch.int32, device=order.device)
    consts = {"TOP_K": top_k, "BLOCK": _INDEX_BLOCK}
    _launch(_routing_index_kernel, (_cdiv(a, _INDEX_BLOCK),), consts, 4, order, out[0], out[1], a)
    return out[0], out[1]


def _tokens_torch(order: torch.Tensor, top_k: int) -> torch.Tensor:
    """The token of each permuted row: order // top_k."""
    return torch.div(order, top_k, rounding_mode="floor")


def _dispatch_torch(x: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """rows [A, D]: row r is x[token of order[r]] (a gather; the same bits as scattering x's rows by slots)."""
    return x.index_select(0, _tokens_torch(order, top_k))


@functools.lru_cache(maxsize=1024)
def _sort_geometry(a: int, num_experts: int) -> tuple[int, int, tuple[int, ...], int, int]:
    """(NB, E_POW2, scan grid, NB_POW2, BLOCK_E) of the counting sort of `a` assignments over `num_experts`."""
    nb, e_pow2 = _cdiv(a, _SORT_BLOCK), _pow2(num_experts)
    nb_pow2 = _pow2(nb)
    block_e = min(max(_SCAN_TILE // nb_pow2, 1), e_pow2)
    return nb, e_pow2, (_cdiv(num_experts, block_e),), nb_pow2, block_e


@functools.lru_cache(maxsize=1024)
def _dispatch_geometry(nb: int, d: int) -> tuple[int, int, int]:
    """(BLOCK_D, column programs, columns per program) of the dispatch kernel's row copy."""
    block_d = _block_d(d)
    return (block_d, *_column_split(nb, d, block_d))


def _count(flat: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Histogram and scan launches: (base int32 [NB, E], sizes int32 [E]) for the dispatch kernel."""
    a = flat.numel()
    nb, e_pow2, grid_scan, nb_pow2, block_e = _sort_geometry(a, num_experts)
    counts, base = torch.empty((2, nb, num_experts), dtype=torch.int32, device=flat.device).unbind(0)
    sizes = torch.empty((num_experts,), dtype=torch.int32, device=flat.device)
    _launch(_histogram_kernel, (nb,), {"BLOCK_A": _SORT_BLOCK, "E_POW2": e_pow2}, 4, flat, counts, a, num_experts)
    consts = {"NB_POW2": nb_pow2, "BLOCK_E": block_e}
    _launch(_scan_kernel, grid_scan, consts, 4, counts, base, sizes, nb, num_experts)
    return base, sizes


def sort_and_dispatch(
    x: torch.Tensor, experts: torch.Tensor, num_experts: int, impl: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D], experts int [T, k] -> (rows [T*k, D], group_sizes int32 [E], slots int32 [T*k]).

    ``rows`` holds the assignments grouped by expert, stable in assignment order."""
    tokens, top_k = experts.shape
    a = tokens * top_k
    d = x.shape[1]
    if impl == "torch" or a == 0:
        sizes, slots, order = _sort_torch(experts, num_experts)
        return _dispatch_torch(x, order, top_k), sizes, slots
    flat = experts.reshape(-1)
    x = _unit_columns(x)
    nb, e_pow2 = _sort_geometry(a, num_experts)[:2]
    base, sizes = _count(flat, num_experts)
    slots = torch.empty((a,), dtype=torch.int32, device=x.device)
    rows = torch.empty((a, d), dtype=x.dtype, device=x.device)
    block_d, split, cols = _dispatch_geometry(nb, d)
    consts = {"D": d, "TOP_K": top_k, "BLOCK_A": _SORT_BLOCK, "BLOCK_D": block_d, "COLS": cols, "E_POW2": e_pow2}
    _launch(
        _dispatch_kernel, (nb, split), consts, 8,
        x, flat, base, sizes, slots, rows, slots, a, num_experts, x.stride(0), rows.stride(0),
    )  # fmt: skip
    return rows, sizes, slots


def sort_order(experts: torch.Tensor, num_experts: int, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """experts int [T, k] -> (group_sizes int32 [E], order int32 [T*k]): the counting sort without the row copy.

    ``order[r]`` is the assignment ``t*k + j`` at permuted row ``r`` (the inverse of ``slots``)."""
    tokens, top_k = experts.shape
    a = tokens * top_k
    if impl == "torch" or a == 0:
        sizes, _, order = _sort_torch(experts, num_experts)
        return sizes, order.to(torch.int32)
    flat = experts.reshape(-1)
    nb, e_pow2 = _sort_geometry(a, num_experts)[:2]
    base, sizes = _count(flat, num_experts)
    slots = torch.empty((a,), dtype=torch.int32, device=experts.device)
    order = torch.empty_like(slots)
    consts = {"D": 16, "TOP_K": top_k, "BLOCK_A": _SORT_BLOCK, "BLOCK_D": 16, "COLS": 16, "E_POW2": e_pow2,
              "COPY_ROWS": False, "WRITE_ORDER": True}  # fmt: skip
    _launch(
        _dispatch_kernel, (nb, 1), consts, 4, slots, flat, base, sizes, slots, slots, order, a, num_experts, 0, 0
    )
    return sizes, order


# ---------------------------------------------------------------------------------------------- combine
def combine(
    rows: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor | None, top_k: int, impl: str
) -> torch.Tensor:
    """rows [A, D], slots int32 [A], weights [T, k] or None -> y [T, D] in rows.dtype (float32 sums;
    float64 inputs take the torch path and sum in float64)."""
    a, d = rows.shape
    tokens = a // top_k
    if impl == "torch" or a == 0 or rows.dtype == torch.float64:
        acc_dtype = torch.promote_types(rows.dtype, torch.float32)
        picked = rows.index_select(0, slots.long()).view(tokens, top_k, d)
        acc = torch.zeros((tokens, d), dtype=acc_dtype, device=rows.device)
        for j in range(top_k):
            term = picked[:, j].to(acc_dtype)
            acc += term * weights[:, j : j + 1].to(acc_dtype) if weights is not None else term
        return acc.to(rows.dtype)
    rows = _unit_columns(rows)
    out = torch.empty((tokens, d), dtype=rows.dtype, device=rows.device)
    w = weights.contiguous() if weights is not None else rows
    block_t, block_d = 16, _block_d(d)
    grid = (_cdiv(tokens, block_t), _cdiv(d, block_d))
    consts = {"TOP_K": top_k, "HAS_WEIGHTS": weights is not None, "BLOCK_T": block_t, "BLOCK_D": block_d}
    _launch(_combine_kernel, grid, consts, 4, rows, slots, w, out, tokens, d, rows.stride(0), out.stride(0))
    return out


def combine_backward(
    grad: torch.Tensor,
    rows: torch.Tensor | None,
    slots: torch.Tensor,
    weights: torch.Tensor | None,
    top_k: int,
    need_grad_w: bool,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """grad [T, D] -> (grad_rows [A, D] in grad.dtype, grad_w [T, k] or None).

    grad_w is float32 (float64 for float64 grad)."""
    tokens, d = grad.shape
    a = tokens * top_k
    need_grad_w = need_grad_w and weights is not None and rows is not None
    if impl == "torch" or a == 0 or grad.dtype == torch.float64:
        acc_dtype = torch.promote_types(grad.dtype, torch.float32)
        src = grad[:, None, :].expand(tokens, top_k, d).to(acc_dtype)
        if weights is not None:
            src = src * weights.to(acc_dtype)[:, :, None]
        grad_rows = grad.new_empty((a, d)).index_copy_(0, slots.long(), src.reshape(a, d).to(grad.dtype))
        grad_w = None
        if need_grad_w:
            picked = rows.index_select(0, slots.long()).view(tokens, top_k, d).to(acc_dtype)
            grad_w = (picked * grad.to(acc_dtype)[:, None, :]).sum(-1)
        return grad_rows, grad_w
    grad = _unit_columns(grad)
    block_a = 32
    block_d, split, cols = _dispatch_geometry(_cdiv(a, block_a), d)
    grad_rows = torch.empty((a, d), dtype=grad.dtype, device=grad.device)
    partial = torch.empty((split, a), dtype=torch.float32, device=grad.device) if need_grad_w else None
    r = _unit_columns(rows) if need_grad_w else grad
    w = weights.contiguous() if weights is not None else grad
    consts = {"D": d, "TOP_K": top_k, "HAS_WEIGHTS": weights is not None, "NEED_GRAD_W": need_grad_w,
              "BLOCK_A": block_a, "BLOCK_D": block_d, "COLS": cols}  # fmt: skip
    _launch(
        _combine_bwd_kernel, (_cdiv(a, block_a), split), consts, 4,
        grad, r, slots, w, grad_rows, grad if partial is None else partial, a, grad.stride(0), r.stride(0),
    )  # fmt: skip
    if partial is None:
        return grad_rows, None
    grad_w = partial[0] if split == 1 else partial.sum(0)  # fixed-order reduction: deterministic
    return grad_rows, grad_w.view(tokens, top_k)
