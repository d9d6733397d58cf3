"""Generation keyed by its own inputs: frozen views that are at once a generator's only argument
and its cache key, and the memo that holds what they made.

Istio's generator caches have shipped with a key missing an input (a proxy got another proxy's
config). Here a part of the config is made by a function of one *view*, a frozen dataclass that
holds everything the function reads; the view's equality and hash are those of all its fields,
so whatever a generator can read is in its key by construction. A field whose value cannot be
hashed (a protobuf message, a tuple of endpoints) enters a view as a `Ref`: the value, named by a
digest of its content that the view compares instead.

`GenerationMemo` keeps what views made for the config versions in use: entries not asked for
during the last two `advance`s (the current version and the one before, as `ResourceCache` keeps)
are dropped, so the memo holds about one fleet's worth of parts, however long the server runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Ref(Generic[T]):
    """A value compared by a digest of its content: equal digests are equal values, so a view
    holding a Ref is keyed on what the value is, not on which object holds it.

    Build it only where the digest is computed from the value it names (the snapshot's content
    digests of configs, the registry's endpoint digests): a digest of anything else would let two
    different values pass as one."""

    digest: object
    value: T = field(compare=False, hash=False, repr=False)


class GenerationMemo(Generic[K, V]):
    """`key -> value` for the views asked for since the last two `advance` calls; thread-safe
    (two threads asking for one new key may both make it; either result is the same)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[K, V] = {}
        self._previous: dict[K, V] = {}
        #: how many values were made (for /metrics and the benchmarks)
        self.made = 0

    def get(self, key: K, make: Callable[[K], V]) -> V:
        found = self._current.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._previous.get(key)
            if found is not None:
                self._current[key] = found
                return found
        value = make(key)
        with self._lock:
            self.made += 1
            self._current[key] = value
        return value

    def advance(self) -> None:
        """A new config version: what the one before last used and this one has not yet is dropped."""
        with self._lock:
            self._previous, self._current = self._current, {}

    def __len__(self) -> int:
        return len(self._current.keys() | self._previous.keys())
