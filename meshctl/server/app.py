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
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import grpc

from meshctl.config.loader import LoadOptions
from meshctl.config.parse_cache import STATE_FILE as PARSE_CACHE_FILE
from meshctl.config.parse_cache import ParseCache
from meshctl.config.watcher import WatchOptions
from meshctl.ingest import FollowedFiles
from meshctl.ingest_kv import FollowedKV
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.base import Registry
from meshctl.registry.consul import ConsulRegistry
from meshctl.registry.health import HealthCheckedRegistry, HealthReports, checked_endpoint_counts
from meshctl.registry.health_share import ShareOptions
from meshctl.server.admin import AdminServer
from meshctl.server.admission import Admission
from meshctl.server.ads import AdsServicer
from meshctl.server.auth import BearerToken, XdsTls, identity_authorizer, is_loopback
from meshctl.server.autoregister import AutoRegistrar
from meshctl.server.ca_follower import CaHolder
from meshctl.server.ca_service import CertificateService, serve_joins
from meshctl.server.ca_upkeep import CaUpkeep, certificate_authority
from meshctl.server.cache import ResourceCache
from meshctl.server.collector import QuietFreezer
from meshctl.server.credentials import CredentialDirectory, CredentialSecrets
from meshctl.server.delivery import Delivery
from meshctl.server.discovery import Discovery, Trigger
from meshctl.server.health import HealthDiscovery, share_between_replicas
from meshctl.server.history import PushHistory, history_dir
from meshctl.server.mesh_config import MeshConfigFile
from meshctl.server.metrics import Metrics
from meshctl.server.notify import SystemdNotifier, service_status
from meshctl.server.pacing import TokenBucket
from meshctl.server.rollout_kv import shared_rollout
from meshctl.server.secrets import WorkloadSecrets
from meshctl.server.settings import ServeSettings, check_bindable, grpc_age_options, split_address
from meshctl.server.status import ServerStatus
from meshctl.server.write_budget import WriteBudget
from meshctl.snapshot.model import Snapshot

if TYPE_CHECKING:
    from meshctl.security.ca import CertificateAuthority

logger = logging.getLogger("meshctl.server")

#: Calls gRPC core may hold before the server accepts them. Its default starts cancelling new
#: ones at random past 1,000 (all past 3,000), which a fleet reconnecting at once reaches while
#: the loop is busy; each waits a few KB, and the bound still stops a flood.
MAX_PENDING_CALLS = 50_000

#: The file in the state directory that keeps auto-registered WorkloadEntries across restarts.
REGISTRATIONS_FILE: Final = "registrations.json"


def _parse_cache(settings: ServeSettings, load: LoadOptions) -> ParseCache | None:
    """The parses of the last run, kept in the state directory (the default one only when it
    can be written), so that a restart parses only the files that changed."""
    directory = history_dir(settings.state_dir, given=settings.state_dir_given)
    if directory is None:
        return None
    return ParseCache(directory / PARSE_CACHE_FILE, max_values=load.max_values, max_alias_values=load.max_alias_values)


class Server:
    """One `meshctl serve`: the watcher, the registries, the debounce, the ADS and admin servers."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        load = LoadOptions(default_namespace=settings.default_namespace)
        #: The files, followed: the store, its watcher and the file registry (`meshctl.ingest`).
        self.followed: FollowedFiles | FollowedKV = (
            FollowedKV(settings.config_kv, load)
            if settings.config_kv is not None
            else FollowedFiles(
                settings.config_dirs,
                WatchOptions(load=load, resync_period=settings.resync_period),
                _parse_cache(settings, load),
            )
        )
        self.store, self.watcher, self.files = self.followed.store, self.followed.watcher, self.followed.registry
        self.consul = ConsulRegistry(settings.consul) if settings.consul is not None else None
        #: What the workloads' own Envoys report over HDS, laid over the files' endpoints.
        self.health = HealthReports()
        self.checked = HealthCheckedRegistry(self.files, self.health)
        members: list[Registry] = [self.checked]
        if self.consul is not None:
            members.append(self.consul)
        self.registry = AggregateRegistry(members)
        self.metrics = Metrics()
        self.cache = ResourceCache(on_failure=self.metrics.internal_errors.inc)
        self.mesh_config = MeshConfigFile(settings.mesh_config, settings.mesh) if settings.mesh_config else None
        mesh = self.mesh_config.settings if self.mesh_config is not None else settings.mesh
        self.discovery = Discovery(self.store, self.registry, self._publish, mesh=mesh, debounce=settings.debounce)
        self.discovery.on_debounced = self._debounced
        #: Whether a proxy connecting now is served (`meshctl.server.admission`).
        self.readiness = Admission(settings, self.followed, self.consul, lambda: self.discovery.snapshot)
        tls = settings.tls
        authorize = identity_authorizer(lambda: self.discovery.snapshot) if tls and tls.client_ca_file else None
        ca = certificate_authority(settings, mesh.trust_domain)
        #: The CA in force; with --ca-dir, replaced when its files change (`meshctl.server.ca_follower`).
        self.ca_holder = CaHolder(ca) if ca is not None else None
        #: The push history and the staged rollout (`meshctl.server.delivery`).
        self.delivery = Delivery(
            self.metrics,
            PushHistory(history_dir(settings.state_dir, given=settings.state_dir_given), settings.history_size),
            settings.rollout,
            settings.config_dirs if settings.config_kv is None else (),
            lambda: self.ads.streams.values(),  # noqa: PLW0108 (self.ads is made below)
            self._republish,
            shared_rollout(settings.config_kv, settings.rollout),
        )
        self.secrets = WorkloadSecrets(
            self.delivery.source(self.cache.resolve).resolve,
            self.ca_holder,
            trust_domain=lambda: self.discovery.mesh.trust_domain,
            lifetime=settings.workload_cert_lifetime,
            send_keys_unauthenticated=settings.insecure_send_keys,
        )
        self.credentials = CredentialDirectory(settings.credentials_dir) if settings.credentials_dir else None
        self.credential_secrets = CredentialSecrets(
            self.secrets.resolve, self.credentials, send_keys_unauthenticated=settings.insecure_send_keys
        )
        self.ads = AdsServicer(
            self.credential_secrets,
            lambda: self.discovery.snapshot,
            self.delivery,
            authorize=authorize,
            admit=self.admission,
            pace=TokenBucket(rate) if (rate := settings.max_new_streams_per_second) > 0 else None,
            limits=settings.limits,
            left=self.secrets.forget,
            write_budget=WriteBudget(settings.max_write_bytes) if settings.max_write_bytes > 0 else None,
        )
        #: Certificates renewed as they come due, the CA's end watched, a --ca-dir swap followed.
        self.ca_upkeep = (
            CaUpkeep(
                settings,
                self.ca_holder,
                self.secrets,
                self.metrics,
                ads=self.ads,
                snapshot=lambda: self.discovery.snapshot,
            )
            if self.ca_holder is not None
            else None
        )
        # The store's view is replaced on each change: read at each call, not bound now.
        self.registrar = AutoRegistrar(
            self.files,
            lambda: self.store.configs.values(),  # noqa: PLW0108
            settings.health_grace,
            state_file=settings.state_dir / REGISTRATIONS_FILE if settings.state_dir is not None else None,
        )
        self.hds = HealthDiscovery(
            self.health,
            lambda: self.discovery.snapshot,
            grace=settings.health_grace,
            authorize=authorize,
            admit=self.admission,
            observe=self.metrics.hds_streams.set,
            registrar=self.registrar,
            checks=self.checked.checks,
        )
        #: Health and registrations shared with the replicas of the same Consul (none without one).
        consul = settings.consul or (settings.config_kv.consul if settings.config_kv is not None else None)
        self.share = (
            share_between_replicas(
                ShareOptions(consul, settings.health_session_ttl),
                self.health,
                self.registrar,
                self.hds,
                self.checked.checks,
            )
            if consul is not None
            else None
        )
        if self.share is not None:
            self.checked.shared_status = self.share.status
            self.share.on_failing = lambda failing: self.metrics.shared_health_failing.set(int(failing))
        self._credentials_task: asyncio.Task[None] | None = None
        self._unfollow_checks: Callable[[], None] | None = None
        self.status = ServerStatus(self)
        self.notify = SystemdNotifier(settings.notify, lambda: service_status(self))
        self._grpc: grpc.aio.Server | None = None
        self._joins: grpc.aio.Server | None = None
        self.join_port = 0
        self._admin: AdminServer | None = None
        self._stopping: asyncio.Event | None = None
        self.xds_port = 0
        self.admin_port = 0
        self.started_at = time.time()
        self._mesh_timer: asyncio.TimerHandle | None = None
        self._republishing: set[asyncio.Future[None]] = set()

    @property
    def ca(self) -> CertificateAuthority | None:
        """The CA in force (None: workload mutual TLS is off)."""
        return self.ca_holder.current if self.ca_holder is not None else None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # Credentials first: a bad certificate or token file stops start-up before anything opens.
        tls = self.settings.tls
        credentials = tls.server_credentials() if tls is not None else None
        token = BearerToken(self.settings.admin_token_file) if self.settings.admin_token_file else None
        # Then the xDS address: a busy or foreign one is said at once, before minutes of loading.
        check_bindable(*split_address(self.settings.xds_address))
        loop = asyncio.get_running_loop()
        if self._stopping is None:  # `run` makes it first, with the stop signals' handlers
            self._stopping = asyncio.Event()
        # The first read and the registry's first build (seconds for a large tree) off the loop.
        first = await loop.run_in_executor(None, self.followed.start)
        for finding in first.errors:
            logger.error("%s", finding)
        self._unfollow_checks = self.checked.follow(self.store)
        # Registrations kept across the restart, and the other replicas' views, before the first snapshot.
        self.hds.bind_loop(loop)
        self.registrar.restore()
        if self.share is not None:
            await loop.run_in_executor(None, self.share.start)
        await self.registrar.apply()
        self.hds.expiry_changed()
        if self.consul is not None:
            self.consul.start()
        snapshot = await self.discovery.start()
        await self.delivery.published(snapshot)
        if self.mesh_config is not None:
            self._follow_mesh_config()
        if self.credentials is not None:
            self._credentials_task = asyncio.create_task(self._follow_credentials(), name="meshctl-credentials")
        self._observe(snapshot)
        self.readiness.say_empty_mesh()
        if self.settings.freeze_startup:
            # Frozen objects are still freed by reference counting when a change drops them.
            gc.collect()
            gc.freeze()
            # And what the fleet's streams and each change's config leave alive, once quiet.
            self.ads.quiet_freezer = QuietFreezer(loop)

        self.readiness.start(loop)
        self._grpc = grpc.aio.server(
            options=[
                # One server per xDS address: with the port shared (gRPC's default), a second
                # meshctl would start without error and the kernel would split the fleet.
                ("grpc.so_reuseport", 0),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.http2.bdp_probe", 0),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # A fleet reconnecting at once must not have its calls cancelled after 30 s unaccepted.
                ("grpc.server_max_unrequested_time_in_server", 600),
                # Nor cancelled at random once more than 1,000 wait (gRPC core's early rejection of
                # calls not yet accepted, between these two bounds): a fleet of thousands
                # connecting while the loop is busy is the normal case, not an overload.
                ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
                *grpc_age_options(self.settings.max_connection_age),
            ]
        )
        self._grpc.add_generic_rpc_handlers((self.ads.handlers(), self.hds.handlers()))
        ca_service = None
        if self.ca is not None:  # Istio's CA service: VMs renew their xDS client certificates
            ca_service = CertificateService(
                self.ca_holder or self.ca,
                lambda: self.discovery.snapshot,
                self.settings.workload_cert_lifetime,
                tls.client_ca_file if tls else None,
                state_dir=self.settings.state_dir,
                trust_domain=lambda: self.discovery.mesh.trust_domain,
            )
            self._grpc.add_generic_rpc_handlers((ca_service.handlers(),))
        host, port = split_address(self.settings.xds_address)
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if credentials is None:
                self.xds_port = self._grpc.add_insecure_port(listen)
            else:
                self.xds_port = self._grpc.add_secure_port(listen, credentials)
        except RuntimeError:  # lost a race for the port since check_bindable
            self.xds_port = 0
        if self.xds_port == 0:
            raise OSError(f"cannot listen for xDS on {self.settings.xds_address}")
        if credentials is None:
            if not is_loopback(host):
                logger.warning(
                    "xDS on %s is plaintext: any host that reaches it can ask for any proxy's config and "
                    "read it on the wire; give --tls-cert, --tls-key and --client-ca (docs/vm-setup.md)",
                    self.settings.xds_address,
                )
        else:
            logger.info(
                "xDS uses TLS%s",
                "; proxies must present a client certificate naming their workload"
                if tls is not None and tls.client_ca_file
                else " (no client certificates: any proxy may ask for any node's config)",
            )
        proven = tls is not None and tls.client_ca_file is not None
        if self.settings.insecure_send_keys and self.ca is not None and not proven and not is_loopback(host):
            logger.warning(
                "--insecure-send-keys on %s, beyond loopback: any host that reaches it and names a workload "
                "is handed that workload's PRIVATE KEY and certificate; give --client-ca instead",
                self.settings.xds_address,
            )
        await self._grpc.start()
        if self.settings.join_address and ca_service is not None and tls is not None:
            joins = XdsTls(tls.cert_file, tls.key_file)  # no client certificate: a joining VM has none yet
            self._joins, self.join_port = await serve_joins(
                split_address(self.settings.join_address), joins, ca_service
            )
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
        if self.ca_upkeep is not None:
            self.ca_upkeep.start()
        if self.settings.on_ready is not None:
            self.settings.on_ready(self.xds_port, self.admin_port)

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT (or `shutdown()`), then stop cleanly.

        The stop signals are handled from before the start: one that comes while the server
        starts (or just after it logs that it serves) stops it cleanly once started, where the
        default action would kill it mid-write."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown)
        try:
            await self.start()
        except BaseException:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            raise
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

    def _follow_mesh_config(self) -> None:
        """Look at the MeshConfig file once a second (a stat); a change that loads is pushed."""
        follower = self.mesh_config
        if follower is None or self._stopping is None or self._stopping.is_set():
            return
        changed = follower.check()
        if changed is not None:
            self.discovery.set_mesh(changed)
        self._mesh_timer = asyncio.get_running_loop().call_later(1.0, self._follow_mesh_config)

    async def _follow_credentials(self) -> None:
        """Look at the credentials directory once a second; push the secrets of a namespace whose
        files changed to the streams of that namespace (only their secrets change: Envoy swaps the
        certificate under live connections)."""
        directory = self.credentials
        assert directory is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            try:
                changed = await loop.run_in_executor(None, directory.check)
                snapshot = self.discovery.snapshot
                if not changed or snapshot is None:
                    continue
                nodes = {
                    s.node.id for s in self.ads.streams.values() if s.node is not None and s.node.namespace in changed
                }
                if nodes:
                    await self.ads.publish(snapshot, nodes=nodes)
            except Exception:
                logger.exception("following the credentials directory failed; retrying")

    async def stop(self) -> None:
        if self._credentials_task is not None:
            self._credentials_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._credentials_task
            self._credentials_task = None
        if self._mesh_timer is not None:
            self._mesh_timer.cancel()
        if self.ca_upkeep is not None:
            await self.ca_upkeep.stop()
        if self.ads.quiet_freezer is not None:
            self.ads.quiet_freezer.stop()
        self.readiness.stop()
        await self.discovery.stop()
        self.delivery.stop()
        self.hds.stop()
        if self.share is not None:  # first: streams closing as the server stops are not VMs going away
            await asyncio.get_running_loop().run_in_executor(None, self.share.stop)
        if self._unfollow_checks is not None:
            self._unfollow_checks()
        self.checked.close()
        self.registrar.close()
        if self._joins is not None:
            await self._joins.stop(0)
            self._joins = None
        if self._grpc is not None:
            await self._grpc.stop(self.settings.drain_seconds)
            self._grpc = None
        if self._admin is not None:
            await self._admin.stop()
            self._admin = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.followed.stop)
        if self.consul is not None:
            await loop.run_in_executor(None, self.consul.stop)

    # -- pushes ------------------------------------------------------------------------------

    async def _publish(self, snapshot: Snapshot, seen: float) -> None:
        self._observe(snapshot)
        await self.delivery.published(snapshot)
        self.hds.publish(snapshot)
        await self.ads.publish(snapshot, seen)

    def _republish(self) -> None:
        """The rollout's plan changed: every stream is resolved again (the snapshot is the same)."""
        snapshot = self.discovery.snapshot
        if snapshot is not None:
            task = asyncio.ensure_future(self.ads.publish(snapshot))
            self._republishing.add(task)
            task.add_done_callback(self._republishing.discard)

    def _observe(self, snapshot: Snapshot) -> None:
        self.metrics.services.set(len(snapshot.services.services))
        healthy, unhealthy = checked_endpoint_counts(snapshot.services, self.checked.checks())
        self.metrics.checked_endpoints.set(healthy, "healthy")
        self.metrics.checked_endpoints.set(unhealthy, "unhealthy")
        self.metrics.registered.set(self.registrar.registered())

    def _debounced(self, seconds: float, trigger: Trigger) -> None:
        self.metrics.debounce.observe(seconds)
        for name, count in (("config", trigger.config), ("endpoint", trigger.endpoint), ("service", trigger.service)):
            if count:
                self.metrics.triggers.inc(name, by=count)

    def admission(self) -> str | None:
        """None when a proxy connecting now gets a complete mesh, else why it must wait
        (`Admission.admission`)."""
        return self.readiness.admission()

    def ready(self) -> bool:
        """What `/ready` says: whether a proxy connecting now is served (`admission`)."""
        return self.admission() is None

    def describe(self) -> dict[str, Any]:
        snapshot = self.discovery.snapshot
        return {
            "version": snapshot.version if snapshot else "",
            "proxies": len(self.ads.streams),
            "configs": len(snapshot.configs) if snapshot else 0,
            "services": len(snapshot.services.services) if snapshot else 0,
        }
