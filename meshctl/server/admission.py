"""Whether a proxy connecting now is served: the server's admission and readiness.

A proxy is better off keeping its last config than getting half of one, so new ADS (and HDS)
streams are admitted only once the server can serve a complete mesh: the first snapshot built,
every registry synced once (or `registry_sync_timeout` past, said in the log), and the mesh not
empty unless an empty one is meant. `/ready` says the same thing (`Server.ready`). Open streams
are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from meshctl.ingest import FollowedFiles
from meshctl.ingest_kv import FollowedKV
from meshctl.registry.consul import ConsulRegistry
from meshctl.server.settings import ServeSettings
from meshctl.snapshot.model import Snapshot

logger = logging.getLogger("meshctl.server")

#: What a proxy is told while the server cannot serve a complete mesh yet (istiod's words).
NOT_READY = "server is not ready to serve discovery information"

#: A file (or KV key) of this name in the config source says that a mesh with no config and no
#: services is meant (`Admission.empty_mesh_refused`); being YAML, it is read like any file and
#: adds nothing.
EMPTY_MESH_MARKER: Final = "empty-mesh.yaml"


class Admission:
    """Decides, from the current snapshot and the registries' sync, whether new streams wait."""

    def __init__(
        self,
        settings: ServeSettings,
        followed: FollowedFiles | FollowedKV,
        consul: ConsulRegistry | None,
        snapshot: Callable[[], Snapshot | None],
    ) -> None:
        self._settings = settings
        self._followed = followed
        self._consul = consul
        self._snapshot = snapshot
        self._sync_deadline = time.monotonic() + settings.registry_sync_timeout
        self._sync_timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server is about to open its port: the registry sync timeout counts from now, and
        Consul still unsynced once it passes is said in the log."""
        self._sync_deadline = time.monotonic() + self._settings.registry_sync_timeout
        if self._consul is not None and not self._consul.wait_synced(0):
            self._sync_timer = loop.call_later(self._settings.registry_sync_timeout, self._sync_overdue)

    def stop(self) -> None:
        if self._sync_timer is not None:
            self._sync_timer.cancel()

    def admission(self) -> str | None:
        """None when a proxy connecting now gets a complete mesh, else why it must wait.

        Until the first snapshot is built and every registry has synced once, new ADS streams are
        refused with UNAVAILABLE (Envoy retries) in Istio's words (istio#25495): a proxy that
        reconnects after a restart while Consul is down keeps its last config rather than being
        sent a mesh without Consul's services. After `registry_sync_timeout` the server serves
        what it has, and has said so in the log (`_sync_overdue`). Open streams are not affected.
        """
        if self._snapshot() is None:
            return NOT_READY
        # A KV config source counts as a registry here: a mesh served before it was read is empty.
        kv_synced = not isinstance(self._followed, FollowedKV) or self._followed.watcher.synced()
        consul_synced = self._consul is None or self._consul.wait_synced(0)
        if not (kv_synced and consul_synced) and time.monotonic() < self._sync_deadline:
            return NOT_READY
        if self.empty_mesh_refused():
            return NOT_READY
        return None

    def empty_mesh_refused(self) -> bool:
        """Whether the mesh now built is empty (no config, no service) without being meant so.

        A config directory or KV prefix that holds nothing at start is far more often a volume not
        mounted yet, a checkout half-way or a wrong prefix than a mesh meant to be empty, and a
        replica that admits proxies with it makes every Envoy that fails over to it drop its
        listeners and clusters. So an empty mesh is served only when said so: `--allow-empty-mesh`,
        or a file named `EMPTY_MESH_MARKER` in the directory (a key of that name under the prefix).
        """
        snapshot = self._snapshot()
        if self._settings.allow_empty_mesh or snapshot is None:
            return False
        if snapshot.configs or snapshot.services.services:
            return False
        # Only an empty store gets here, so this walks a handful of file names at most.
        return not any(Path(name).name == EMPTY_MESH_MARKER for name in self._followed.store.file_status())

    def say_empty_mesh(self) -> None:
        """Say at start-up why proxies are refused when the config source gave nothing (not while
        Consul may still bring services or the KV prefix has not been read: that is said apart)."""
        kv_unread = isinstance(self._followed, FollowedKV) and not self._followed.watcher.synced()
        if self._consul is not None or kv_unread or not self.empty_mesh_refused():
            return
        settings = self._settings
        source = (
            settings.config_kv.display if settings.config_kv is not None else ", ".join(map(str, settings.config_dirs))
        )
        logger.error(
            "%s holds no config and there are no services: proxies are refused (not ready) until it does; "
            "to serve an empty mesh on purpose, put a file named %s in it or pass --allow-empty-mesh",
            source,
            EMPTY_MESH_MARKER,
        )

    def _sync_overdue(self) -> None:
        self._sync_timer = None
        if self._consul is not None and not self._consul.wait_synced(0):
            logger.error(
                "Consul has not synced %gs after start-up (%s): serving proxies the mesh without Consul's "
                "services until it does (--registry-sync-timeout)",
                self._settings.registry_sync_timeout,
                self._consul.status().message,
            )
