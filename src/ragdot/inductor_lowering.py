"""Inductor lowers ragdot's canonical custom ops to calls of their `.out` overloads on buffers it plans.

A functional custom op reaches inductor as an opaque kernel that allocates its own output; inductor's
peak-memory ordering then counts that output through a zero-size child node, and its depth-first order, which
visits small nodes first, pulls every such op (and all it depends on) as early as it can run. In a compiled
train step this put each layer's expert weight gradients where its backward ran, instead of at the end of the
backward as for `torch._grouped_mm` (an op inductor knows), so all of them were alive at the attention
backward's peak (gpt-oss-like, 2 layers: +3.4 GiB). Lowered to `ExternKernelOut`, the output is a buffer of
known size that inductor allocates (and may reuse), and the weight gradients can move to the end.

torch releases after 2.11 do this themselves for any custom op with a `.out` overload, but (2.13) not for
dynamic shapes: their layout takes the example output's symbolic sizes as they are and fails an assertion,
so a `torch.compile(..., dynamic=True)` of a ragdot call stopped compiling. `install` registers ragdot's own
lowering of its three ops through inductor's internal API (the example output is a fake tensor, its sizes
converted to inductor's expressions), and `maybe_install` does so by default on every torch; measured on an
H200's torch 2.11: the compiled 4-layer gpt-oss-like train step's peak 61.7 -> 55.1 GiB, under
`torch._grouped_mm`'s 57.1. `RAGDOT_INDUCTOR_OUT=0` in the environment leaves the ops to inductor (2.11: an
opaque kernel; later releases: their own lowering). An inductor whose internal API does not fit leaves the
ops on its default lowering (results are the same either way).

The C++ wrapper (AOTInductor: `torch.export` then `torch._inductor.aoti_compile_and_package`) keeps ragdot's ops as
fallback kernels, which it calls through its proxy executor (the dispatcher, then ragdot's Python implementation
in the process that loads the package): torch 2.13's own `.out` lowering would make it call a C shim that a Python
op does not have, and the generated C++ would not compile (`_without_out_variants`). On a torch older than
2.13 it refuses instead (`check_aot_torch`): torch 2.11 crashes loading any AOTInductor package that calls a
Python custom op.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["direct_out_name", "install", "maybe_install", "check_aot_torch", "torch_release", "AOT_MIN_TORCH"]

_OPS = ("ragged_m", "ragged_k", "batch")
_state: dict[str, Any] = {"done": False, "lowered": 0}  # lowered: ops lowered here (a count, for tests)


def direct_out_name(name: str) -> str:
    """The attribute of `torch.ops.ragdot` holding the Python implementation of op `name`'s `.out` overload
    (set by `ragdot.ops`), which the generated code calls in place of the overload: the same arguments and
    result, without a dispatcher round trip into Python on every call."""
    return f"_{name}_out_direct"


def maybe_install() -> None:
    """Called while a ragdot op is traced: installs the lowerings once, when inductor is loaded (so tracing
    for another backend never imports it), unless RAGDOT_INDUCTOR_OUT=0."""
    if not _state["done"] and "torch._inductor.lowering" in sys.modules:
        _state["done"] = True
        if os.environ.get("RAGDOT_INDUCTOR_OUT", "") != "0":
            install()


def install() -> bool:
    """Registers the `.out` lowering of ragdot's canonical ops with inductor; False where its API differs.
    Each op first gets inductor's own implicit fallback (the default layout constraint on its inputs and
    realized inputs, as inductor gives any custom op), whose lowering is then replaced."""
    try:
        from torch._inductor import ir
        from torch._inductor.lowering import (
            fallback_handler,
            make_fallback,
            register_lowering,
            tag_to_layout_constraint,
        )
        from torch._library.utils import get_layout_constraint_tag

        for name in _OPS:
            packet = getattr(torch.ops.ragdot, name)
            constraint = tag_to_layout_constraint(get_layout_constraint_tag(packet.default, with_default=True))
            make_fallback(packet.default, layout_constraint=constraint, warn=False)
            register_lowering(packet.default, type_promotion_kind=None)(_lowering(ir, packet, fallback_handler))
    except (ImportError, AttributeError, TypeError, AssertionError):
        return False
    return True


@contextlib.contextmanager
def _without_out_variants() -> Iterator[None]:
    """torch 2.13's `FallbackKernel.create` lowers a custom op that has a `.out` overload to an `ExternKernelOut`,
    whose C++ wrapper code (AOTInductor) calls a C shim named after the op, which a Python op does not have: the
    generated C++ failed to compile. Inside this block torch finds no out variant for ragdot's ops, so they stay
    `FallbackKernel`s, which the C++ wrapper calls through its proxy executor (the dispatcher, then ragdot's
    Python implementation, in the process that loads the compiled model)."""
    try:
        from torch._library import _out_variant as found
    except ImportError:  # a torch without that lowering: nothing to turn off
        yield
        return
    names = [n for n in ("to_out_variant", "lookup_manual_out_variant") if hasattr(found, n)]
    saved = {n: getattr(found, n) for n in names}

    def skipping_ragdot(lookup: Any) -> Any:
        def lookup_out(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(kernel, "namespace", None) == "ragdot":
                return None
            return lookup(kernel, *args, **kwargs)
        return lookup_out

    for name, lookup in saved.items():
        setattr(found, name, skipping_ragdot(lookup))
    try:
        yield
    finally:
        for name, lookup in saved.items():
            setattr(found, name, lookup)


AOT_MIN_TORCH = (2, 13)  # the first torch whose AOTInductor packages with ragdot's ops loaded and ran here


def torch_release() -> tuple[int, int]:
    """(major, minor) of this torch (pre-releases of a version count as that version)."""
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return int(major), int(minor)


def check_aot_torch() -> None:
    """NotImplementedError, while AOTInductor compiles a model that calls ragdot, on a torch older than
    AOT_MIN_TORCH: loading such a package crashed the process (a segmentation fault in `aoti_load_package`)
    with torch 2.11, for any Python custom op, ragdot's and a one-line one alike (an H100 machine, 2026-12-05),
    so it fails here, at compile time, with a reason, instead."""
    if torch_release() < AOT_MIN_TORCH:
        raise NotImplementedError(
            f"AOTInductor with ragdot's ops needs torch >= {'.'.join(map(str, AOT_MIN_TORCH))} (this is "
            f"{torch.__version__}): loading an AOTInductor package that calls a Python custom op crashes torch "
            "2.11; torch.compile and torch.export (without AOTInductor) work with ragdot here"
        )


def _processed(result: Any) -> tuple[Any, list[Any], list[Any]]:
    """(example output, tensor arguments, other arguments) of `process_kernel`'s result: a tuple up to torch 2.13,
    a `ProcessKernelResult` with named fields from 2.14 (where indexing it raised, and every ragdot op fell back
    to inductor's default lowering)."""
    if hasattr(result, "example_output"):
        return result.example_output, list(result.tensor_args), list(result.non_tensor_args)
    example, tensor_args, constant_args = result[:3]
    return example, list(tensor_args), list(constant_args)


def _lowering(ir: Any, packet: Any, fallback_handler: Any):
    from torch._inductor.utils import convert_shape_to_inductor

    kernel, out_op = packet.default, packet.out
    default = fallback_handler(kernel, add_to_fallback_set=False)
    # the generated code calls the overload's Python implementation directly (`direct_out_name`; `ragdot.ops`,
    # which defines the overloads lowered here, sets it beside them)
    kernel_name = f"torch.ops.ragdot.{direct_out_name(packet.__name__)}"

    def lower(*args: Any, **kwargs: Any) -> Any:
        from torch._inductor.virtualized import V

        if getattr(V.graph, "cpp_wrapper", False):
            if getattr(V.graph, "aot_mode", False):
                check_aot_torch()
            with _without_out_variants():
                return default(*args, **kwargs)
        try:
            with V.graph.fake_mode:  # the example output is a fake tensor (nothing runs, sizes may be symbolic)
                example, tensor_args, constant_args = _processed(ir.FallbackKernel.process_kernel(kernel, *args,
                                                                                                  **kwargs))
            # symbolic sizes (dynamic shapes) as inductor's sympy expressions
            layout = ir.FixedLayout(device=example.device, dtype=example.dtype,
                                    size=convert_shape_to_inductor(example.shape),
                                    stride=convert_shape_to_inductor(example.stride()))
            node = ir.ExternKernelOut(layout=layout, inputs=list(tensor_args), constant_args=list(constant_args),
                                      kwargs=kwargs, python_kernel_name=kernel_name, op_overload=out_op)
        except Exception:  # noqa: BLE001 - an inductor whose IR differs: its default lowering
            return default(*args, **kwargs)
        _state["lowered"] += 1
        return ir.TensorBox.create(node)

    return lower
