"""One rule for ragdot's per-signature caches (prepared calls, bound launches, plans): a plain dict looked up on the
hot path, and on a miss `remember`, which empties a full cache before adding the new entry: many distinct
signatures (e.g. a serving process seeing every token count) start over rather than grow without bound."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["remember"]

V = TypeVar("V")


def remember(cache: dict, key: object, value: V, limit: int) -> V:
    """cache[key] = value, the cache emptied first when it holds `limit` entries already; returns value."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value
