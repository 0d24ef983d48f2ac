"""`torch._grouped_mm`'s call on ragdot: `ragdot.grouped_mm(mat_a, mat_b, offs=offs)`.

Code written against PyTorch's grouped GEMM (torchtitan's experts, transformers' "grouped_mm" experts, plain
training loops) passes cumulative group ends `offs` instead of group sizes and picks the ragged dimension by
the operands' ranks. The four forms map onto ragdot's dimension numbers, so each is one ragdot call, with its
backends, gradients in both operands and torch.compile support:

    mat_a           mat_b           offs   result        ragged        ragdot mode
    [M, K]          [G, K, N]       [G]    [M, N]        rows of a     non-contracting (the experts' forward)
    [G, M, K]       [K, N]          [G]    [M, N]        columns of b  non-contracting, b's columns as rows
    [M, K]          [K, N]          [G]    [G, M, N]     K             contracting (the weight gradient)
    [G, M, K]       [G, K, N]       None   [G, M, N]     -             batch

`offs[g]` is the end of group g (int, non-decreasing, on the operands' device). Where `torch._grouped_mm`
leaves rows or columns past `offs[-1]` undefined (whatever memory held), ragdot writes exact zeros, and such
rows or columns reach no other element: ragdot's contract. `out_dtype` is ragdot's `preferred_element_type`
(float32 accumulation whatever the output dtype); operands of two floating dtypes are promoted as
`ragged_dot_general` promotes them, where torch refuses them.
"""

from __future__ import annotations

import torch

from ragdot.api import ragged_dot_general
from ragdot.dimension_numbers import RAGGED_DOT_DN, RaggedDotDimensionNumbers

__all__ = ["grouped_mm", "sizes_from_offsets"]

# (mat_a rank, mat_b rank) -> (dimension numbers, whether mat_b is ragdot's lhs)
_FORMS: dict[tuple[int, int], tuple[RaggedDotDimensionNumbers, bool]] = {
    (2, 3): (RAGGED_DOT_DN, False),
    (3, 2): (RaggedDotDimensionNumbers((((0,), (2,)), ((), ())), (1,), (0,)), True),  # b [K, N] by a [G, M, K]
    (2, 2): (RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), (1,), ()), False),
    (3, 3): (RaggedDotDimensionNumbers((((2,), (1,)), ((0,), (0,))), (0,), ()), False),
}


def sizes_from_offsets(offs: torch.Tensor) -> torch.Tensor:
    """Cumulative group ends int [G] -> group sizes int32 [G] (on offs's device, no host sync)."""
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"offs must be a 1-D integer tensor of cumulative group ends, got {type(offs).__name__}")
    if offs.dim() != 1 or offs.is_floating_point() or offs.is_complex() or offs.dtype == torch.bool:
        raise ValueError(f"offs must be a 1-D integer tensor of cumulative group ends, got {offs.dtype} of shape "
                         f"{tuple(offs.shape)}")
    sizes = offs.to(torch.int32, copy=True)  # two launches (copy, subtract); diff with a prepended zero takes three
    sizes[1:].sub_(offs[:-1])
    return sizes


def grouped_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """`torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)` computed by ragdot (see the module's
    table for the four forms). `backend` picks ragdot's backend (None: ragdot's own choice). `bias` is
    accepted as None only, as torch's CUDA kernel does."""
    for name, t in (("mat_a", mat_a), ("mat_b", mat_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    form = (mat_a.dim(), mat_b.dim())
    if form not in _FORMS:
        raise ValueError(f"mat_a and mat_b must be 2-D or 3-D, got shapes {tuple(mat_a.shape)} and "
                         f"{tuple(mat_b.shape)}")
    if bias is not None:
        raise NotImplementedError("grouped_mm: bias is not supported (pass None), as in torch._grouped_mm")
    dn, b_first = _FORMS[form]
    if form == (3, 3):
        if offs is not None:
            raise ValueError("offs must be None when mat_a and mat_b are both 3-D (one product per group)")
        if mat_a.shape[0] != mat_b.shape[0]:
            raise ValueError(f"mat_a and mat_b must have the same number of groups, got {mat_a.shape[0]} and "
                             f"{mat_b.shape[0]}")
        # one group holding every batch entry; a ragged batch dimension never reads its sizes, so they stay in
        # host memory (on the GPU a device tensor would cost an allocation and a fill launch per call)
        sizes = torch.full((1,), mat_a.shape[0], dtype=torch.int32)
    else:
        if offs is None:
            raise ValueError(f"offs is required when mat_a or mat_b is 2-D, got shapes {tuple(mat_a.shape)} and "
                             f"{tuple(mat_b.shape)}")
        groups = {(2, 3): mat_b.shape[0], (3, 2): mat_a.shape[0]}.get(form)
        if groups is not None and offs.dim() == 1 and offs.shape[0] != groups:
            raise ValueError(f"offs must hold one end per group ({groups}), got {offs.shape[0]}")
        sizes = sizes_from_offsets(offs)
    lhs, rhs = (mat_b, mat_a) if b_first else (mat_a, mat_b)
    out = ragged_dot_general(lhs, rhs, sizes, dn, preferred_element_type=out_dtype, backend=backend)
    return out.transpose(0, 1) if b_first else out
