"""The on-disk cache of measured choices: JSON, atomic replace, corrupt files ignored with a warning.

Two sources are consulted, the user's cache first:
- the user cache, `$RAGDOT_CACHE_DIR/tune.json` (default: `$XDG_CACHE_HOME/ragdot` or `~/.cache/ragdot`);
- results shipped inside the package for known GPUs (`ragdot/tune/<gpu-slug>.json`).

Writers merge their entries into what is on disk at the time of writing and replace the file atomically, so
concurrent writers never leave a torn file (the last writer's value wins for a key both measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

__all__ = ["Cache", "host_key", "cache_dir", "user_cache_path", "shipped_path", "load_entries", "write_entries"]

FORMAT = 1


def cache_dir() -> Path:
    override = os.environ.get("RAGDOT_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ragdot"


def user_cache_path() -> Path:
    return cache_dir() / "tune.json"


def host_key(device: str) -> str:
    """The cache key of a device's host-time table (what one eager call of each backend costs the host)."""
    return f"{device}|host"


def slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def shipped_path(device: str) -> Path:
    return Path(__file__).with_name(f"{slug(device)}.json")


def load_entries(path: Path) -> dict[str, dict[str, Any]]:
    """The entries of one cache file; {} when it is missing, and a warning when it is unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"ragdot: cannot read tuning cache {path}: {exc}; ignoring it", stacklevel=3)
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not a ragdot tuning cache of format {FORMAT}")
        return data["entries"]
    except ValueError as exc:
        warnings.warn(f"ragdot: tuning cache {path} is corrupt ({exc}); ignoring it", stacklevel=3)
        return {}


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive advisory lock beside `path` (POSIX), so read-merge-write cycles do not interleave. The lock file
    is hidden (`.<name>.lock`) and stays: removing it would let a waiting writer lock a file no longer there."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: atomic replace alone still prevents torn files
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_entries(path: Path, entries: dict[str, dict[str, Any]], merge: bool = True) -> None:
    """Merge `entries` into the file at `path` (`merge=False`: replace what it holds, unread: for a file just
    created empty) and replace it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        _write_merged(path, entries, merge)


def _write_merged(path: Path, entries: dict[str, dict[str, Any]], merge: bool = True) -> None:
    merged = {**load_entries(path), **entries} if merge else dict(entries)
    fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": merged}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Cache:
    """In-memory view of the user cache over the shipped results, loaded once per process per device."""

    def __init__(self) -> None:
        self._user: dict[str, dict[str, Any]] | None = None
        self._shipped: dict[str, dict[str, dict[str, Any]]] = {}
        self.generation = 0  # bumped whenever what `get` answers may change (prepared calls key on it)

    def clear(self) -> None:
        self._user = None
        self._shipped.clear()
        self.generation += 1

    def has_shipped(self, device: str) -> bool:
        return shipped_path(device).exists()

    def get(self, key_text: str, device: str) -> dict[str, Any] | None:
        if self._user is None:
            self._user = load_entries(user_cache_path())
        if key_text in self._user:
            return self._user[key_text]
        if device not in self._shipped:
            self._shipped[device] = load_entries(shipped_path(device))
        return self._shipped[device].get(key_text)

    def put(self, entries: dict[str, dict[str, Any]], path: Path | None = None) -> None:
        write_entries(path or user_cache_path(), entries)
        self.clear()

    def host_ms(self, device: str) -> dict[str, dict[str, float]]:
        """Measured host time per eager call, {backend: {problem: ms}}, for `device` ({} when unmeasured)."""
        entry = self.get(host_key(device), device)
        return entry.get("host_ms", {}) if entry else {}


CACHE = Cache()
