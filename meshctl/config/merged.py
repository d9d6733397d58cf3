"""The resources of a config tree merged, kept up to date one file at a time.

The watcher's rule for a resource defined in several files is `loader.merge_files`': the first
file in path order (and within it the first document) wins, every other definition is an error
on its own file. A reload of the whole tree merges every file again; a reload of the few files
that file events named must not, or an edit would cost as much as the tree is big. So the merge
is kept: the winner of each key, the other files that define keys defined more than once (rare,
and each of them an error), and the duplicate findings of each file. An edit then costs the keys
its files define, before and after, plus the files that share one of those keys.

Changes are planned first (`plan`) and adopted (`adopt`) only once the store has them, as the
watcher does with everything a reload computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from meshctl.config.findings import Finding
from meshctl.config.loader import _duplicate
from meshctl.config.model import Config, ConfigKey
from meshctl.config.scan import Position


@dataclass(slots=True)
class MergePlan:
    """What a change of some files does to the merge: the new winner of each key they touch
    (None: no file defines it any more), the other files defining each touched key, and the
    duplicate findings of every file whose findings may have changed (empty: none)."""

    configs: dict[ConfigKey, Config | None] = field(default_factory=dict)
    extra: dict[ConfigKey, tuple[str, ...]] = field(default_factory=dict)
    duplicates: dict[str, list[Finding]] = field(default_factory=dict)


class MergedFiles:
    """The merge of a tree's files: `configs` (the winner of each key) and `duplicates` (the
    errors of each file that defines a key an earlier one does)."""

    def __init__(self, configs: dict[ConfigKey, Config], duplicates: Iterable[Finding]) -> None:
        """From a merge of the whole tree (`merge_files`' result, which this object then owns)."""
        self.configs = configs
        self.duplicates: dict[str, list[Finding]] = {}
        #: Keys defined more than once -> the files other than the winner's that define them.
        self._extra: dict[ConfigKey, tuple[str, ...]] = {}
        for finding in duplicates:
            path = finding.file or ""
            self.duplicates.setdefault(path, []).append(finding)
            if finding.resource is not None:
                others = self._extra.get(finding.resource, ())
                if path not in others:
                    self._extra[finding.resource] = (*others, path)

    def plan(
        self,
        before: Mapping[str, Sequence[Config]],
        after: Mapping[str, Sequence[Config]],
        configs_of: Callable[[str], Sequence[Config]],
        position_of: Callable[[str], Position],
    ) -> MergePlan:
        """The merge once the files of `before` (what each gave until now) give what `after`
        says instead; a file missing from `after` gives nothing any more. `configs_of` and
        `position_of` tell the same about the other files, which keep what they give.

        Only the keys of resources that came, went or are new objects are planned: a resource
        a file gives again as the very same object (the loader keeps the object of a document
        that neither changed nor moved) keeps its place in the merge, so an edit of one entry
        of a file of thousands plans one key."""
        changed = before.keys() | after.keys()
        keys: set[ConfigKey] = set()
        for path in changed:
            old, new = before.get(path, ()), after.get(path, ())
            same = set(old).intersection(new)  # configs compare by identity
            keys.update(c.key for c in old if c not in same)
            keys.update(c.key for c in new if c not in same)
        defining: dict[ConfigKey, list[tuple[Position, int, str, Config]]] = {key: [] for key in keys}
        for path, configs in after.items():
            position = position_of(path)
            for config in configs:
                if config.key in keys:
                    defining[config.key].append((position, config.source.document, path, config))
        plan = MergePlan()
        touched: set[str] = set(changed)
        for key, definitions in defining.items():
            winner = self.configs.get(key)
            others = self._extra.get(key, ())
            touched.update(others)
            if winner is not None:
                touched.add(winner.source.file)
                where = winner.source
                if where.file not in changed and where.file not in others:
                    definitions.append((position_of(where.file), where.document, where.file, winner))
            for path in others:
                if path not in changed:
                    position = position_of(path)
                    definitions.extend((position, c.source.document, path, c) for c in configs_of(path) if c.key == key)
            definitions.sort(key=lambda d: (d[0], d[1]))
            plan.configs[key] = definitions[0][3] if definitions else None
            plan.extra[key] = tuple(dict.fromkeys(d[2] for d in definitions[1:]))
            touched.update(d[2] for d in definitions)
        for path in touched:
            configs = after.get(path, ()) if path in changed else configs_of(path)
            plan.duplicates[path] = self._duplicates(path, configs, plan.configs)
        return plan

    def _duplicates(
        self, path: str, configs: Sequence[Config], planned: Mapping[ConfigKey, Config | None]
    ) -> list[Finding]:
        """The duplicate errors of the file at `path` once it gives `configs`: found again for
        the keys planned, kept for the others (their winner did not change). A file's own
        configs never share a key (the loader keeps the first)."""
        kept = {f.resource: f for f in self.duplicates.get(path, ())}
        found: list[Finding] = []
        for config in configs:
            key = config.key
            if key in planned:
                first = planned[key]
                if first is not None and first is not config:
                    found.append(_duplicate(config, first.source))
            elif kept and key in kept:
                found.append(kept[key])
        return found

    def adopt(self, plan: MergePlan) -> None:
        for key, config in plan.configs.items():
            if config is None:
                self.configs.pop(key, None)
            else:
                self.configs[key] = config
        for key, others in plan.extra.items():
            if others:
                self._extra[key] = others
            else:
                self._extra.pop(key, None)
        for path, found in plan.duplicates.items():
            if found:
                self.duplicates[path] = found
            else:
                self.duplicates.pop(path, None)
