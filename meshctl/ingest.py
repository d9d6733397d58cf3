"""The config files as snapshot inputs, wired once: for a command that reads them once, and for
one that follows them.

Every consumer of the files needs the same steps in the same order, and each used to wire them
by hand: load (or watch) the tree, merge the files' resources with duplicates reported, and turn
ServiceEntries and WorkloadEntries into the file registry's services. `load_files` is the
one-shot form (`meshctl dump`, `diff`, `services`); `FollowedFiles` the following one (`meshctl
serve`, `meshctl services --watch`): a store fed by the directory watcher, and the file registry
following the store, so that both see the same revision of the files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshctl.config import loader, tree
from meshctl.config.findings import Finding, Severity, sort_findings
from meshctl.config.loader import LoadOptions
from meshctl.config.model import Config, ConfigKey
from meshctl.config.parse_cache import ParseCache
from meshctl.config.reload_report import ReloadResult
from meshctl.config.store import ConfigStore
from meshctl.config.watcher import DirectoryWatcher, WatchOptions
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import ServiceModel
from meshctl.registry.serviceentry import build_file_model


@dataclass(frozen=True, slots=True)
class LoadedFiles:
    """A tree read once: its resources (the first definition of each, in path order) and every
    finding about it, duplicates included, in the order people read them."""

    configs: dict[ConfigKey, Config]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    def services(self) -> ServiceModel:
        """The services and endpoints the files define, as the server's file registry has them."""
        return build_file_model(self.configs.values())


def load_files(paths: Sequence[Path], options: LoadOptions | None = None) -> LoadedFiles:
    """Load `paths` as the server would, once."""
    result = tree.load_paths(list(paths), options or LoadOptions())
    configs, duplicates = loader.merge_files(result.files.values())
    return LoadedFiles(configs, tuple(sort_findings([*result.all_findings(), *duplicates])))


class FollowedFiles:
    """The files followed: the watcher keeps `store` in step with the directories, and `registry`
    (the file registry) follows the store. `start` reads the tree once and starts both; `stop`
    ends both. Used from one thread at a time."""

    def __init__(
        self, paths: Sequence[Path], options: WatchOptions | None = None, parse_cache: ParseCache | None = None
    ) -> None:
        self.store = ConfigStore()
        self.watcher = DirectoryWatcher(list(paths), self.store, options, parse_cache)
        self.registry = FileRegistry()
        self._unfollow: Callable[[], None] | None = None

    def start(self) -> ReloadResult:
        """Read the tree into the store, build the registry from it, and follow both from now
        on; returns the first reload (its errors are the tree's)."""
        first = self.watcher.start()
        self._unfollow = self.registry.follow(self.store)
        return first

    def stop(self) -> None:
        self.watcher.stop()
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
