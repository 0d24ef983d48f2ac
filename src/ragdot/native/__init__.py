"""ragdot's C: the launch-program interpreter (`replay.c`) and how it is built and loaded.

The C sources are built once per machine with the C compiler ($CC, else cc or gcc) into ragdot's cache
folder ($RAGDOT_CACHE_DIR, else ~/.cache/ragdot; the temporary folder where that is not writable), under a
file name that holds a hash of the sources and headers, and loaded with ctypes. `library()` is the replay
library of ragdot's eager calls (`ragdot.kernels.replay`): it needs only the `cuda.h` that ships with
Triton; ragdot.jax builds its XLA FFI handler, which includes `replay.c`, the same way (`build`).
`plan` writes the programs from recorded calls.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPLAY_SOURCE", "build", "cuda_include", "declare_replay", "library", "reason"]

REPLAY_SOURCE = Path(__file__).with_name("replay.c")
_lock = threading.Lock()
_state: dict[str, object] = {}


def cuda_include() -> Path:
    """The folder of the `cuda.h` that ships with Triton (RuntimeError without Triton)."""
    try:
        import triton
    except ImportError as exc:
        raise RuntimeError(f"Triton is not installed ({exc})") from None
    return Path(triton.__file__).parent / "backends" / "nvidia" / "include"


def _cache_dir(folder: str) -> Path:
    root = os.environ.get("RAGDOT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ragdot")
    return Path(root) / folder


def build(stem: str, source: Path, includes: Sequence[Path], hashed: Sequence[Path], folder: str) -> Path:
    """The shared library `source` builds into (`<stem>_<hash>.so` in the cache's `folder`, or in
    `ragdot-<folder>` of the temporary folder), built now if it is not there yet; `hashed`: every file whose
    content the library depends on (sources and headers). RuntimeError when it cannot be built."""
    for header in hashed:
        if not header.is_file():
            raise RuntimeError(f"{header} not found")
    digest = hashlib.sha256()
    for part in hashed:
        digest.update(part.read_bytes())
    name = f"{stem}_{digest.hexdigest()[:16]}.so"
    cache, temporary = _cache_dir(folder), Path(tempfile.gettempdir()) / f"ragdot-{folder}"
    for place in (cache, temporary):
        if (place / name).is_file():
            return place / name
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if not os.access(cache, os.W_OK):
            raise PermissionError(cache)
        target = cache / name
    except OSError:  # a read-only cache folder: the temporary folder instead
        temporary.mkdir(parents=True, exist_ok=True)
        target = temporary / name
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        scratch = Path(tmp) / target.name
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=gnu11", *(f"-I{d}" for d in includes), str(source),
                   "-o", str(scratch), "-ldl", "-lpthread"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"{compiler} failed: {e}") from None
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-400:]}")
        os.replace(scratch, target)  # atomic: another process may build the same file
    return target


def declare_replay(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` with the signatures of `replay.c`'s entry points set (this library, and ragdot.jax's handler
    library, which includes `replay.c`)."""
    words, ptrs = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_uint64)
    lib.ragdot_replay.restype = ctypes.c_char_p
    lib.ragdot_replay.argtypes = [words, ctypes.c_int64, ptrs, ctypes.c_int64, ctypes.c_uint64, words,
                                  ctypes.c_int64, words, ctypes.c_char_p, ctypes.c_int64]
    lib.ragdot_replay_run.restype = ctypes.c_char_p
    lib.ragdot_replay_run.argtypes = [words, ctypes.c_int64, ptrs, ctypes.c_int64, ctypes.c_uint64]
    return lib


def _load() -> ctypes.CDLL:
    include = cuda_include()
    hashed = [REPLAY_SOURCE, include / "cuda.h"]
    return declare_replay(ctypes.CDLL(str(build("ragdot_replay", REPLAY_SOURCE, [include], hashed, "native"))))


def library() -> ctypes.CDLL | None:
    """The loaded replay library (built at the first call), or None where it cannot be (`reason()`)."""
    with _lock:
        if "lib" not in _state:
            try:
                _state["lib"] = _load()
            except Exception as e:  # noqa: BLE001 - any failure means: calls keep their Python launch path
                _state["lib"], _state["reason"] = None, f"{type(e).__name__}: {e}"
        return _state["lib"]  # type: ignore[return-value]


def reason() -> str | None:
    """Why the replay library is not there (None when it is)."""
    library()
    return _state.get("reason")  # type: ignore[return-value]
