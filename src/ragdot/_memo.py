"""One rule for ragdot's per-signature caches (prepared calls, bound launches, plans): a plain dict looked up on the
hot path, and on a miss `remember`, which empties a full cache before adding the new entry: many distinct
signatures (e.g. a serving process seeing every token count) start over rather than grow without bound.

Not while a CUDA graph is being captured on the current stream: the entries a capture's warm-up calls made
would then be dropped halfway through the capture, and every launch after the drop would be prepared anew
inside it (first launches, possibly compiles), where the calls a global-mode capture forbids invalidate it.
A full cache grows past its limit during a capture and starts over at its next miss outside one."""

from __future__ import annotations

from typing import TypeVar

import torch

__all__ = ["remember"]

V = TypeVar("V")


def _capturing() -> bool:
    """Whether a CUDA graph capture is underway on the current stream (False without CUDA)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):  # a build without CUDA
        return False


def remember(cache: dict, key: object, value: V, limit: int) -> V:
    """cache[key] = value, the cache emptied first when it holds `limit` entries already (unless a CUDA graph
    capture is underway); returns value."""
    if len(cache) >= limit and not _capturing():
        cache.clear()
    cache[key] = value
    return value
