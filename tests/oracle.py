"""An oracle for ragged_dot_general written independently of ragdot's canonicalization.

It builds an einsum from the dimension numbers and applies the group structure by slicing and selecting,
in float64 on the CPU.
"""

from __future__ import annotations

import string

import torch


def _letters(lhs_nd, rhs_nd, dn, drop_rhs=()):
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    pool = iter(string.ascii_letters)
    lhs = [next(pool) for _ in range(lhs_nd)]
    rhs = [None] * rhs_nd
    for a, b in zip(lc, rc):
        rhs[b] = lhs[a]
    for a, b in zip(lb, rb):
        rhs[b] = lhs[a]
    for i in range(rhs_nd):
        if rhs[i] is None:
            rhs[i] = next(pool)
    lhs_free = [lhs[i] for i in range(lhs_nd) if i not in lc and i not in lb]
    rhs_free = [rhs[i] for i in range(rhs_nd) if i not in rc and i not in rb and i not in drop_rhs]
    out = [lhs[i] for i in lb] + lhs_free + rhs_free
    return lhs, rhs, out


def ragged_dot_general_oracle(lhs, rhs, group_sizes, dn):
    lhs = lhs.to("cpu", torch.float64)
    rhs = rhs.to("cpu", torch.float64)
    sizes = [max(int(s), 0) for s in group_sizes.tolist()]
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    (r,) = dn.lhs_ragged_dimensions
    extent = lhs.shape[r]
    starts, ends, total = [], [], 0
    for s in sizes:
        starts.append(min(total, extent))
        total += s
        ends.append(min(total, extent))
    idx = torch.arange(extent)

    def along(t, dim, mask):
        shape = [1] * t.ndim
        shape[dim] = -1
        return mask.view(shape)

    if r in lb:
        li, ri, oi = _letters(lhs.ndim, rhs.ndim, dn)
        return torch.einsum(f"{''.join(li)},{''.join(ri)}->{''.join(oi)}", lhs, rhs)
    if r in lc:
        li, ri, oi = _letters(lhs.ndim, rhs.ndim, dn)
        rr = rc[lc.index(r)]
        outs = []
        for s, e in zip(starts, ends):
            m = (idx >= s) & (idx < e)
            lm = torch.where(along(lhs, r, m), lhs, 0.0)
            rm = torch.where(along(rhs, rr, m), rhs, 0.0)
            outs.append(torch.einsum(f"{''.join(li)},{''.join(ri)}->{''.join(oi)}", lm, rm))
        if not outs:
            li2, ri2, oi2 = _letters(lhs.ndim, rhs.ndim, dn)
            probe = torch.einsum(f"{''.join(li2)},{''.join(ri2)}->{''.join(oi2)}", lhs, rhs)
            return probe.new_zeros((0, *probe.shape))
        return torch.stack(outs)
    (g,) = dn.rhs_group_dimensions
    li, ri, oi = _letters(lhs.ndim, rhs.ndim, dn, drop_rhs=(g,))
    ri_g = [c for i, c in enumerate(ri) if i != g]
    out = None
    lhs_free = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    out_r = len(lb) + lhs_free.index(r)
    for gi, (s, e) in enumerate(zip(starts, ends)):
        part = torch.einsum(f"{''.join(li)},{''.join(ri_g)}->{''.join(oi)}", lhs, rhs.select(g, gi))
        m = (idx >= s) & (idx < e)
        part = torch.where(along(part, out_r, m), part, 0.0)
        out = part if out is None else out + part
    if out is None:
        probe_rhs = rhs.narrow(g, 0, 0).sum(g) if rhs.shape[g] == 0 else rhs.select(g, 0)
        out = torch.einsum(f"{''.join(li)},{''.join(ri_g)}->{''.join(oi)}", torch.zeros_like(lhs), probe_rhs)
    return out
