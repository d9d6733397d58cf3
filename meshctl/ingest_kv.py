"""The config of a Consul KV prefix as snapshot inputs, wired as `FollowedFiles` wires a directory.

`meshctl serve --config-consul-kv PREFIX` follows the keys under PREFIX instead of a directory:
the KV watcher (`meshctl.kv.source`) keeps the store in step with them, and the file
registry follows the same store, so ServiceEntries and WorkloadEntries kept in KV become services
exactly as they would from files.
"""

from __future__ import annotations

from collections.abc import Callable

from meshctl.config.loader import LoadOptions
from meshctl.config.reload_report import ReloadResult
from meshctl.config.store import ConfigStore
from meshctl.kv.source import KvLocation, KvWatcher
from meshctl.registry.files import FileRegistry


class FollowedKV:
    """A KV prefix followed: `watcher` keeps `store` in step with it, and `registry` (the file
    registry) follows the store. The same surface as `FollowedFiles`, so the server takes either."""

    def __init__(self, location: KvLocation, load: LoadOptions | None = None) -> None:
        self.store = ConfigStore()
        self.watcher = KvWatcher(location, self.store, load)
        self.registry = FileRegistry()
        self._unfollow: Callable[[], None] | None = None

    def start(self) -> ReloadResult:
        """Read the prefix (waiting a little for Consul's first answer), build the registry from
        it, and follow both from now on; returns the errors standing after the first read."""
        first = self.watcher.start()
        self._unfollow = self.registry.follow(self.store)
        return first

    def stop(self) -> None:
        self.watcher.stop()
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
