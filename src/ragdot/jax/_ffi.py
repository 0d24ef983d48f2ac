"""ragdot.jax's XLA FFI custom call: the handler library, its launch slots and the Python resolver.

`ffi_launch.c` (which includes ragdot's launch-program interpreter, `ragdot/native/replay.c`) is built once
per machine against jaxlib's FFI header and the `cuda.h` that ships with Triton (`ragdot.native.build`: the
C compiler, ragdot's cache folder, a file name holding a hash of the sources and headers), loaded with ctypes and
registered as the custom call target "ragdot_launch" for CUDA and for the host. Each traced ragdot.jax
forward or backward gets a launch slot (its `Bridge`, which direction, its buffers' shapes and dtypes),
passed to the custom call as its `slot` attribute with this process's random token in the high 32 bits: a
program compiled in another process (jax's persistent compilation cache) has another token, so its cache
key differs and a stale slot can never run.

A call the handler has no plan for runs the resolver: torch tensors over XLA's buffers (no copy), the
bridge's prepared forward or backward on XLA's stream, and, on the first call on a CUDA device, a record of
what it launched (`ragdot.kernels.record`); where that was only ragdot's Triton kernels, the record becomes
the slot's plan for that device (`ragdot.native.plan`) and later calls never enter Python.

Where the library cannot be built (no compiler, no headers) ragdot.jax falls back to `buffer_callback`
(`reason()` says why; RAGDOT_JAX_BRIDGE=callback asks for that path).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ragdot import native
from ragdot._memo import remember
from ragdot.jax._bridge import Bridge
from ragdot.native import plan as _plan

if TYPE_CHECKING:
    from ragdot.kernels.record import Record

__all__ = ["TARGET", "MODES", "mode", "bridge_mode", "available", "reason", "slot", "clear_plans", "stats", "library"]

TARGET = "ragdot_launch"
SOURCE = Path(__file__).with_name("ffi_launch.c")
_RESOLVER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64,
                             ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_int64)
_TOKEN = secrets.randbits(31) + 1  # this process's; never 0
_lock = threading.Lock()
_state: dict[str, Any] = {}


def _headers() -> tuple[Path, Path]:
    import jax

    return Path(jax.ffi.include_dir()), native.cuda_include()


def build() -> Path:
    """The handler library's path, built if it is not in the cache yet (raises RuntimeError if it cannot be)."""
    xla_include, cuda_include = _headers()
    hashed = [SOURCE, native.REPLAY_SOURCE, xla_include / "xla" / "ffi" / "api" / "c_api.h", cuda_include / "cuda.h"]
    return native.build("ragdot_ffi", SOURCE, [xla_include, cuda_include], hashed, "ffi")


def library() -> ctypes.CDLL | None:
    """The loaded handler library with its targets registered (built at the first call), or None."""
    with _lock:
        if "lib" not in _state:
            try:
                _state["lib"] = _load()
            except Exception as e:  # noqa: BLE001 - any failure means: use the callback path
                _state["lib"], _state["reason"] = None, f"{type(e).__name__}: {e}"
        return _state["lib"]


def _load() -> ctypes.CDLL:
    import jax

    lib = native.declare_replay(ctypes.CDLL(str(build())))
    lib.ragdot_ffi_set_plan.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                        ctypes.c_int64]
    _state["resolver"] = resolver = _RESOLVER(_resolve)  # kept alive: the library calls it
    lib.ragdot_ffi_init(ctypes.c_uint32(_TOKEN), resolver)
    lib.ragdot_ffi_in_flight.restype = ctypes.c_int64
    atexit.register(_close, lib)  # after jax's own hooks were registered, so it runs before them
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.ragdot_ffi_host), platform="cpu")
    with contextlib.suppress(Exception):  # a jaxlib without CUDA: the host target alone
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.ragdot_ffi_cuda), platform="CUDA")
    return lib


def _close(lib: ctypes.CDLL, wait_s: float = 10.0) -> None:
    """At interpreter exit: no more calls into the resolver (a call still queued on another device, whose
    result nobody reads, fails instead of entering a finalizing interpreter, which would abort the process);
    wait for those already inside it."""
    lib.ragdot_ffi_close()
    deadline = time.monotonic() + wait_s
    while lib.ragdot_ffi_in_flight() > 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # releases the GIL the calls inside the resolver need


MODES = ("ffi", "callback", "general")


def mode() -> str:
    """$RAGDOT_JAX_BRIDGE: "ffi" (the default), "callback" (buffer_callback, prepared bridge) or "general"
    (buffer_callback, the general path of every call)."""
    value = os.environ.get("RAGDOT_JAX_BRIDGE", "").strip() or "ffi"
    if value not in MODES:
        raise ValueError(f"RAGDOT_JAX_BRIDGE must be one of {', '.join(MODES)}, got {value!r}")
    return value


@contextlib.contextmanager
def bridge_mode(value: str) -> Iterator[None]:
    """RAGDOT_JAX_BRIDGE set to `value` inside the block (calls traced there take that bridge), then as it was."""
    if value not in MODES:
        raise ValueError(f"bridge_mode: expected one of {', '.join(MODES)}, got {value!r}")
    before = os.environ.get("RAGDOT_JAX_BRIDGE")
    os.environ["RAGDOT_JAX_BRIDGE"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAGDOT_JAX_BRIDGE", None)
        else:
            os.environ["RAGDOT_JAX_BRIDGE"] = before


def available() -> bool:
    """Whether ragdot.jax calls go through the FFI custom call (mode "ffi" and the library built)."""
    return mode() == "ffi" and library() is not None


def reason() -> str | None:
    """Why the FFI path is not used (None when it is)."""
    if mode() != "ffi":
        return f"RAGDOT_JAX_BRIDGE={mode()}"
    library()
    return _state.get("reason")


# ---- slots ----------------------------------------------------------------------------------------------
@dataclass
class _Slot:
    """One traced direction of one signature: what its buffers are and who computes them."""

    bridge: Bridge
    backward: bool
    specs: tuple[tuple[tuple[int, ...], torch.dtype], ...]  # per buffer: operands, then results
    index: int = -1  # in _SLOTS, and in the library's slot table
    tried: dict[int, int] = field(default_factory=dict)  # per device, calls recorded without a plan coming of it
    planned: set[int] = field(default_factory=set)  # devices with a plan installed
    resolved: int = 0  # calls that ran in Python
    why: dict[int, str] = field(default_factory=dict)  # per device, why no plan
    views: dict[tuple, list[torch.Tensor]] = field(default_factory=dict)  # (device, *addresses) -> views,
    # of every buffer but the workspace (only a plan uses it)
    kept: dict[int, list[Any]] = field(default_factory=dict)  # per device, the compiled kernels of its plan
    nbytes: tuple[int, ...] = field(init=False)  # per buffer, from specs

    def __post_init__(self) -> None:
        self.nbytes = tuple(math.prod(shape) * dtype.itemsize for shape, dtype in self.specs)

    def run(self, tensors: list[torch.Tensor], buffers: list[tuple[int, int]], device: int, stream: int) -> None:
        """The call in Python on torch views of its buffers but the workspace (`buffers`: every buffer's address
        and bytes; device -1: the host; -2: the current CUDA device, where XLA did not say which); the first
        calls on a CUDA device recorded, and a plan installed where one comes of them."""
        bridge = self.bridge
        where = torch.device("cuda", device) if device >= 0 else torch.device("cpu")
        p = bridge.prepared_at(where, stream if device >= 0 else None)
        wanted = device >= 0 and self.tried.get(device, 0) < _RECORDS and bridge.replayable
        record = _record_module() if wanted else None
        take = record is not None
        previous = p.stream.enter()
        try:
            with record.recording(self.nbytes[-1]) if take else contextlib.nullcontext() as rec:
                if self.backward:
                    lhs, rhs, sizes, dout, dlhs, drhs = tensors
                    direct = bridge.backward_tensors(p, (dlhs, drhs), lhs, rhs, sizes, dout)
                else:
                    lhs, rhs, sizes, out = tensors
                    direct = bridge.forward_tensors(p, out, lhs, rhs, sizes)
        finally:
            p.stream.exit(previous)
        self.resolved += 1
        if take and not self._plan(rec, direct, buffers, device):
            self.tried[device] = self.tried.get(device, 0) + 1

    def _plan(self, rec: Record, direct: bool, buffers: list[tuple[int, int]], device: int) -> bool:
        """Install the plan of a recorded call; whether it was."""
        if not direct:
            self.why[device] = "the backend's call is not ragdot's Triton kernels alone"
            return False
        try:
            words = _plan.program(rec, buffers, len(buffers) - 1)
        except _plan.Unplannable as e:
            self.why[device] = str(e)
            return False
        lib = library()
        array = (ctypes.c_int64 * len(words))(*words)
        if lib is None or lib.ragdot_ffi_set_plan(self.index, device, array, len(words)) != 0:
            self.why[device] = "the library refused the plan"
            return False
        self.planned.add(device)
        self.why.pop(device, None)
        # the plan holds raw CUfunction handles: keep their compiled kernels alive with it
        launch = _record_module().Launch  # a record exists: so does the module
        self.kept[device] = [step.compiled for step in rec.steps if isinstance(step, launch)]
        return True


def _record_module() -> Any:
    """`ragdot.kernels.record`, or None without Triton (ragdot.jax runs without it; then nothing is recorded:
    no ragdot kernel runs). Imported here, not with this module, for that reason."""
    try:
        from ragdot.kernels import record
    except ImportError:
        return None
    return record


# Calls per slot and device recorded before giving up on a plan: a call can take another path on its first
# run than on later ones (the backward binds its gradient products on its first call and copies that once).
_RECORDS = 3
_SLOTS: list[_Slot] = []
_INDEX: dict[tuple, int] = {}


def slot(bridge: Bridge, backward: bool, specs: tuple) -> int:
    """The `slot` attribute for one traced direction of `bridge` (made once per signature and direction)."""
    key = (bridge.sig, backward, specs)
    with _lock:
        index = _INDEX.get(key)
        if index is None:
            index = _INDEX[key] = len(_SLOTS)
            _SLOTS.append(_Slot(bridge, backward, specs, index=index))
    return (_TOKEN << 32) | index


def clear_plans() -> None:
    """Forget every installed plan: each slot's next call on a device runs in Python and is recorded again
    (for after a change that would change a backend's choice: the tuning cache, TF32)."""
    lib = library()
    if lib is not None:
        lib.ragdot_ffi_clear()
    with _lock:
        for s in _SLOTS:
            s.tried.clear()
            s.planned.clear()
            s.why.clear()


def stats() -> list[dict[str, Any]]:
    """Per slot: its signature, direction, the calls that ran in Python, the devices with a plan, and why
    the others have none."""
    return [{"signature": s.bridge.sig, "backward": s.backward, "resolved": s.resolved,
             "planned": sorted(s.planned), "why": dict(s.why)} for s in _SLOTS]


# ---- the resolver (called from the handler, with the GIL) -----------------------------------------------
class _CudaArray:
    """`__cuda_array_interface__` over XLA's device buffer (bytes), for a torch view without a copy."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False), "version": 2}


def _tensor(address: int, size: int, shape: tuple[int, ...], dtype: torch.dtype, device: int) -> torch.Tensor:
    """A torch view of `size` bytes at `address` (host memory for device -1, else that CUDA device's)."""
    if size == 0 or address == 0:
        return torch.empty(shape, dtype=dtype, device="cpu" if device < 0 else f"cuda:{device}")
    if device < 0:
        return torch.frombuffer((ctypes.c_char * size).from_address(address), dtype=dtype).view(shape)
    raw = torch.as_tensor(_CudaArray(address, size), device=f"cuda:{device}")
    return raw.view(dtype).view(shape)


def _resolve(index: int, device: int, stream: int, n: int, ptrs: Any, message: int, size: int) -> int:
    try:
        s = _SLOTS[index]
        if device == -2:
            device = torch.cuda.current_device()
            s.tried[device] = _RECORDS  # XLA did not name the device: no plan
        if n != len(s.specs):
            raise RuntimeError(f"ragdot.jax: the call has {n} buffers, its slot {len(s.specs)}")
        addresses = ptrs[:n]
        buffers = list(zip(addresses, s.nbytes))
        key = (device, *addresses)
        tensors = s.views.get(key)
        if tensors is None:  # XLA often hands a program's calls the same buffers: their views are kept
            tensors = [_tensor(a, b, shape, dtype, device) for (a, b), (shape, dtype) in zip(buffers, s.specs[:-1])]
            remember(s.views, key, tensors, 8)
        s.run(tensors, buffers, device, stream)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to XLA, which raises it in the caller
        text = f"{type(e).__name__}: {e}".encode()[: max(size - 1, 0)]
        ctypes.memmove(message, text + b"\0", len(text) + 1)
        return 1
