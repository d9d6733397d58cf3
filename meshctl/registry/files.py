"""The registry of the config files: ServiceEntries, WorkloadEntries and WorkloadGroups as the
store holds them, turned into a service model (`serviceentry.build_file_model`) and kept in
step with the store.

A change of WorkloadEntries and ServiceEntries (a VM joining or leaving, an entry added to a
file of thousands) is applied to the last build (`serviceentry.update_file_model`), so it costs
what it touches; a change it cannot apply on its own (a WorkloadGroup, a hostname defined twice)
is built again from the store's whole content, reusing what the memo converted before.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from meshctl.config.model import Config, ConfigKey
from meshctl.registry.aggregate import model_change
from meshctl.registry.base import Listener
from meshctl.registry.health_checks import may_be_checked
from meshctl.registry.model import RegistryChange, RegistryStatus, ServiceModel
from meshctl.registry.serviceentry import KINDS, BuildMemo, build_file_model, update_file_model

if TYPE_CHECKING:
    from meshctl.config.store import ConfigChange, ConfigStore

logger = logging.getLogger("meshctl.registry.files")

#: The kinds whose changes are applied to the last build rather than built again.
_APPLIED_KINDS = frozenset({"WorkloadEntry", "ServiceEntry"})


class FileRegistry:
    """The Registry over ServiceEntry/WorkloadEntry/WorkloadGroup configs.

    It follows a config store (`follow`), or is handed the complete current set of configs
    (`replace`) or what changed (`apply`); it rebuilds the model from scratch, compares it with
    the last one and tells listeners what changed. Configs of other kinds are ignored, so it can
    be fed the whole store without rebuilding for a VirtualService edit.
    """

    def __init__(self, configs: Iterable[Config] = (), *, name: str = "files") -> None:
        self._name = name
        # Reentrant: a listener (called with it held) may read `configs()`.
        self._lock = threading.RLock()
        self._configs: dict[ConfigKey, Config] = {c.key: c for c in configs if c.kind in KINDS}
        #: Those of `_configs` that health checks read (`may_be_checked`), kept in step with them.
        self._checkable: dict[ConfigKey, Config] = {k: c for k, c in self._configs.items() if may_be_checked(c)}
        #: WorkloadEntries of VMs that registered themselves into a WorkloadGroup (`set_registered`).
        self._registered: dict[ConfigKey, Config] = {}
        self._memo = BuildMemo()
        self._model = build_file_model(self._configs.values(), self._memo)
        self._listeners: list[Listener] = []

    @property
    def name(self) -> str:
        return self._name

    def model(self) -> ServiceModel:
        return self._model

    def configs(self) -> tuple[Config, ...]:
        """The ServiceEntry, WorkloadEntry and WorkloadGroup configs the model is built from."""
        with self._lock:
            return tuple(self._configs.values())

    def checkable(self) -> tuple[Config, ...]:
        """The configs of `configs()` that health checks read (`health_checks.may_be_checked`):
        a handful in a mesh of thousands, so a change need not pass over the others for them."""
        with self._lock:
            return tuple(self._checkable.values())

    def status(self) -> RegistryStatus:
        model = self._model
        return RegistryStatus(
            name=self._name,
            healthy=True,
            message="; ".join(model.notes),
            services=len(model.services),
            endpoints=sum(len(e) for e in model.endpoints.values()),
        )

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def follow(self, store: ConfigStore) -> Callable[[], None]:
        """Keep in step with `store` from now on; returns a function that stops following.

        A store change that creates, updates or deletes WorkloadEntries and ServiceEntries only
        is applied as such (`update_file_model`: the entries changed and the endpoints of those
        selecting the workloads changed alone are redone); any other change
        to one of our kinds rebuilds from the store's whole current content, so a change
        delivered late or twice can never leave the model behind the store.
        """

        def on_change(change: ConfigChange) -> None:
            if not change.kinds & KINDS:
                return
            if change.kinds & KINDS <= _APPLIED_KINDS and self._apply_events(change):
                return
            self.replace(store.configs.values())

        unsubscribe = store.subscribe(on_change)
        self.replace(store.configs.values())
        return unsubscribe

    def _apply_events(self, change: ConfigChange) -> bool:
        """Apply a change of WorkloadEntries and ServiceEntries; False when it needs a whole build."""
        events = [e for e in change.events if e.key.kind in KINDS]
        after = {e.key: e.new for e in events}
        with self._lock:
            if any(self._configs.get(e.key) is not e.old for e in events):
                return False  # not the state these events start from (delivered late or twice)
            new = update_file_model(after, after.keys(), self._memo)
            if new is None:
                return False
            for key, config in after.items():
                self._checkable.pop(key, None)
                if config is None:
                    self._configs.pop(key, None)
                else:
                    self._configs[key] = config
                    if may_be_checked(config):
                        self._checkable[key] = config
            self._publish(new)
        return True

    def replace(self, configs: Iterable[Config]) -> RegistryChange | None:
        """Take `configs` as everything the files now hold; returns (and publishes) the change."""
        relevant = {c.key: c for c in configs if c.kind in KINDS}
        with self._lock:
            for key, config in self._registered.items():
                relevant.setdefault(key, config)  # a file's WorkloadEntry of the same name wins
            return self._rebuild(relevant)

    def set_registered(self, configs: Iterable[Config], files: Iterable[Config]) -> RegistryChange | None:
        """Take `configs` as the WorkloadEntries of every VM registered now (auto-registration),
        beside `files` (the store's configs); returns (and publishes) the change."""
        with self._lock:
            self._registered = {c.key: c for c in configs}
            return self.replace(files)

    def apply(self, updated: Iterable[Config] = (), deleted: Iterable[ConfigKey] = ()) -> RegistryChange | None:
        """Apply creates/updates and deletes to the configs held; returns (and publishes) the change."""
        with self._lock:
            configs = dict(self._configs)
            for config in updated:
                if config.kind in KINDS:
                    configs[config.key] = config
            for key in deleted:
                configs.pop(key, None)
            return self._rebuild(configs)

    def _rebuild(self, configs: dict[ConfigKey, Config]) -> RegistryChange | None:
        self._checkable = {k: c for k, c in configs.items() if may_be_checked(c)}
        if _same_configs(self._configs, configs):
            self._configs = configs  # newer Source positions, same content
            return None
        self._configs = configs
        return self._publish(build_file_model(configs.values(), self._memo))

    def _publish(self, new: ServiceModel) -> RegistryChange | None:
        """Take `new` as the model and tell listeners what changed; called with the lock held."""
        change = model_change(self._model, new)
        if change is not None:
            change = dataclasses.replace(change, settled=True)  # made from the (debounced) store
        self._model = new
        if change is not None:
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:
                    # One broken consumer must not keep the others from seeing the change.
                    logger.exception("a %s registry listener failed", self._name)
        return change


def _same_configs(a: Mapping[ConfigKey, Config], b: Mapping[ConfigKey, Config]) -> bool:
    return a.keys() == b.keys() and all(b[k] is a[k] or b[k].same_content(a[k]) for k in a)
