"""WorkloadEntries by where they run, for binding a proxy to its workload by address: kept
apart from the snapshot index, which carries the table from one snapshot to the next and
updates it for the entries a change touched."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshctl.config.model import Config, ConfigKey


class EntriesByAddress:
    """WorkloadEntries by (namespace, address), the first by name of each (how a proxy without a
    name is bound), updatable for a few changed entries without reading the others' specs again
    (they are kept packed: each read parses)."""

    __slots__ = ("first", "groups", "where")

    def __init__(
        self,
        groups: dict[tuple[str, str], list[Config]],
        where: dict[ConfigKey, tuple[str, str]],
    ) -> None:
        #: (namespace, address) -> entries, by key; key -> (namespace, address)
        self.groups, self.where = groups, where
        self.first: dict[tuple[str, str], Config] = {at: group[0] for at, group in groups.items()}

    @classmethod
    def of(cls, entries: Iterable[Config]) -> EntriesByAddress:
        groups: dict[tuple[str, str], list[Config]] = {}
        where: dict[ConfigKey, tuple[str, str]] = {}
        for entry in entries:  # in key order: each group is sorted
            at = (entry.namespace, _address(entry))
            groups.setdefault(at, []).append(entry)
            where[entry.key] = at
        return cls(groups, where)

    def updated(self, keys: Iterable[ConfigKey], now: Mapping[ConfigKey, Config]) -> EntriesByAddress:
        """A copy with the entries of `keys` as `now` has them (absent: deleted)."""
        groups, where = dict(self.groups), dict(self.where)
        touched: set[tuple[str, str]] = set()
        for key in keys:
            at = where.pop(key, None)
            if at is not None:
                groups[at] = [c for c in groups[at] if c.key != key]
                touched.add(at)
            entry = now.get(key)
            if entry is not None:
                at = (entry.namespace, _address(entry))
                groups[at] = sorted([*groups.get(at, ()), entry], key=lambda c: c.key)
                where[key] = at
                touched.add(at)
        out = EntriesByAddress.__new__(EntriesByAddress)
        out.groups, out.where = groups, where
        out.first = dict(self.first)
        for at in touched:
            if groups.get(at):
                out.first[at] = groups[at][0]
            else:
                groups.pop(at, None)
                out.first.pop(at, None)
        return out


def _address(entry: Config) -> str:
    spec: Any = entry.spec  # a WorkloadEntry
    return str(spec.address)
