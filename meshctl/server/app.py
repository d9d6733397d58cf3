"""`Server(settings)`: start-up, signals and shutdown of `meshctl serve`.

Settings are plain data passed in (the CLI builds them from flags and the environment); nothing
runs at import. Start-up loads the config directory and starts the registries before the xDS
port opens, so the first proxy gets a complete config; with Consul down the server still starts
and serves the files, and Consul's endpoints join when it comes back.

Signals: SIGTERM/SIGINT close the streams cleanly (Envoy keeps its config and reconnects to
another replica); SIGHUP reloads the config directory at once. Under systemd each of these steps,
and a watchdog ping from the event loop, is reported over sd_notify (`meshctl.server.notify`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from meshctl.config.loader import LoadOptions
from meshctl.config.store import ConfigStore
from meshctl.config.watcher import DirectoryWatcher, WatchOptions
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.base import Registry
from meshctl.registry.consul import ConsulOptions, ConsulRegistry
from meshctl.registry.serviceentry import FileRegistry
from meshctl.server.admin import AdminServer
from meshctl.server.ads import AdsServicer
from meshctl.server.auth import BearerToken, XdsTls, identity_authorizer
from meshctl.server.cache import ResourceCache
from meshctl.server.discovery import DebounceSettings, Discovery, Trigger
from meshctl.server.metrics import Metrics
from meshctl.server.notify import NotifySettings, SystemdNotifier, service_status
from meshctl.server.status import ServerStatus
from meshctl.snapshot.model import MeshSettings, Snapshot

logger = logging.getLogger("meshctl.server")


def split_address(address: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` -> (host, port); raises ValueError with the reason."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return (host.strip("[]") or default_host), int(port)


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything `meshctl serve` is told; built by the CLI, passed down, never global."""

    config_dirs: tuple[Path, ...]
    xds_address: str = "127.0.0.1:15010"
    admin_address: str = "127.0.0.1:15014"
    consul: ConsulOptions | None = None
    default_namespace: str = "default"
    debounce: DebounceSettings = field(default_factory=DebounceSettings)
    mesh: MeshSettings = field(default_factory=MeshSettings)
    #: How long a stopping server lets streams finish before closing them.
    drain_seconds: float = 5.0
    #: TLS on the xDS port; with a client CA, proxies must prove the workload their node id names.
    tls: XdsTls | None = None
    #: A file holding the bearer token the /debug admin pages require.
    admin_token_file: Path | None = None
    #: systemd's notify socket and watchdog (read from the environment by the CLI); off by default.
    notify: NotifySettings = field(default_factory=NotifySettings)
    #: Called once the server is up, with the (xds, admin) ports chosen.
    on_ready: Callable[[int, int], None] | None = None


class Server:
    """One `meshctl serve`: the watcher, the registries, the debounce, the ADS and admin servers."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.store = ConfigStore()
        load = LoadOptions(default_namespace=settings.default_namespace)
        self.watcher = DirectoryWatcher(list(settings.config_dirs), self.store, WatchOptions(load=load))
        self.files = FileRegistry()
        self.consul = ConsulRegistry(settings.consul) if settings.consul is not None else None
        members: list[Registry] = [self.files]
        if self.consul is not None:
            members.append(self.consul)
        self.registry = AggregateRegistry(members)
        self.metrics = Metrics()
        self.cache = ResourceCache()
        self.discovery = Discovery(
            self.store, self.registry, self._publish, mesh=settings.mesh, debounce=settings.debounce
        )
        self.discovery.on_debounced = self._debounced
        tls = settings.tls
        authorize = identity_authorizer(lambda: self.discovery.snapshot) if tls and tls.client_ca_file else None
        self.ads = AdsServicer(self.cache, lambda: self.discovery.snapshot, self.metrics, authorize=authorize)
        self.status = ServerStatus(self)
        self.notify = SystemdNotifier(settings.notify, lambda: service_status(self))
        self._grpc: grpc.aio.Server | None = None
        self._admin: AdminServer | None = None
        self._stopping: asyncio.Event | None = None
        self.xds_port = 0
        self.admin_port = 0
        self.started_at = time.time()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # Credentials first: a bad certificate or token file stops start-up before anything opens.
        tls = self.settings.tls
        credentials = tls.server_credentials() if tls is not None else None
        token = BearerToken(self.settings.admin_token_file) if self.settings.admin_token_file else None
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        first = await loop.run_in_executor(None, self.watcher.start)
        for finding in first.errors:
            logger.error("%s", finding)
        self.files.follow(self.store)
        if self.consul is not None:
            self.consul.start()
        snapshot = await self.discovery.start()
        self._observe(snapshot)

        self._grpc = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # A fleet reconnecting at once must not have its calls cancelled after 30 s unaccepted.
                ("grpc.server_max_unrequested_time_in_server", 600),
            ]
        )
        self._grpc.add_generic_rpc_handlers((self.ads.handlers(),))
        host, port = split_address(self.settings.xds_address)
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if credentials is None:
            self.xds_port = self._grpc.add_insecure_port(listen)
        else:
            self.xds_port = self._grpc.add_secure_port(listen, credentials)
            logger.info(
                "xDS uses TLS%s",
                "; proxies must present a client certificate naming their workload"
                if tls is not None and tls.client_ca_file
                else " (no client certificates: any proxy may ask for any node's config)",
            )
        if self.xds_port == 0:
            raise OSError(f"cannot listen for xDS on {self.settings.xds_address}")
        await self._grpc.start()
        admin_host, admin_port = split_address(self.settings.admin_address)
        self._admin = AdminServer(self.status, admin_host, admin_port, token)
        await self._admin.start()
        self.admin_port = self._admin.port
        logger.info(
            "serving xDS on %s:%d and admin on http://%s:%d (%d configs, %d services)",
            host,
            self.xds_port,
            admin_host,
            self.admin_port,
            len(snapshot.configs),
            len(snapshot.services.services),
        )
        if self.settings.on_ready is not None:
            self.settings.on_ready(self.xds_port, self.admin_port)

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT (or `shutdown()`), then stop cleanly."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        # Ready only once the handlers are in: a SIGHUP before them would kill the process.
        self.notify.ready()
        self.notify.start()
        try:
            assert self._stopping is not None
            await self._stopping.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            await self.stop()
            await self.notify.close()

    def shutdown(self) -> None:
        logger.info("stopping: closing xDS streams (proxies keep their config and reconnect)")
        self.notify.stopping()
        if self._stopping is not None:
            self._stopping.set()

    async def reload(self) -> None:
        """SIGHUP: read the config directory now and push without waiting for the debounce."""
        logger.info("reloading the config directories")
        self.notify.reloading()
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, self.watcher.reload_now)
            for finding in result.errors:
                logger.error("%s", finding)
            self.discovery.trigger_now()
        finally:
            self.notify.ready()  # even after a failure: systemd would otherwise wait out its timeout

    async def stop(self) -> None:
        await self.discovery.stop()
        if self._grpc is not None:
            await self._grpc.stop(self.settings.drain_seconds)
            self._grpc = None
        if self._admin is not None:
            await self._admin.stop()
            self._admin = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.watcher.stop)
        if self.consul is not None:
            await loop.run_in_executor(None, self.consul.stop)

    # -- pushes ------------------------------------------------------------------------------

    async def _publish(self, snapshot: Snapshot, seen: float) -> None:
        self._observe(snapshot)
        await self.ads.publish(snapshot, seen)

    def _observe(self, snapshot: Snapshot) -> None:
        self.metrics.services.set(len(snapshot.services.services))

    def _debounced(self, seconds: float, trigger: Trigger) -> None:
        self.metrics.debounce.observe(seconds)
        for name, count in (("config", trigger.config), ("endpoint", trigger.endpoint), ("service", trigger.service)):
            if count:
                self.metrics.triggers.inc(name, by=count)

    def ready(self) -> bool:
        if self.discovery.snapshot is None:
            return False
        return self.consul is None or self.consul.wait_synced(0)

    def describe(self) -> dict[str, Any]:
        snapshot = self.discovery.snapshot
        return {
            "version": snapshot.version if snapshot else "",
            "proxies": len(self.ads.streams),
            "configs": len(snapshot.configs) if snapshot else 0,
            "services": len(snapshot.services.services) if snapshot else 0,
        }
