"""The mesh's CA while serving: which CA signs, and workload certificates kept current.

`certificate_authority` picks the CA of the settings at start (a plug-in `--ca-dir`, or the
self-signed root of the state directory). `CaUpkeep` then keeps what the CA issued in force for
as long as the server runs: certificates are pushed again as they come due (each stream
re-resolves and only its secrets change), the CA's end is watched (`ca_expiry.py`), and with
`--ca-dir` a CA replaced on disk is swapped in (`ca_follower.py`): every proxy gets the new trust
bundle at once, and what the old signer issued is reissued within the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from meshctl.errors import CredentialError
from meshctl.security.ca import RENEW_FRACTION
from meshctl.server.ca_expiry import CaExpiryWatch
from meshctl.server.ca_follower import CaDirFollower, CaHolder
from meshctl.server.settings import ServeSettings
from meshctl.snapshot.model import Snapshot

if TYPE_CHECKING:
    from meshctl.security.ca import CertificateAuthority
    from meshctl.server.ads import AdsServicer
    from meshctl.server.metrics import Metrics
    from meshctl.server.secrets import WorkloadSecrets

logger = logging.getLogger("meshctl.server")

#: The least outage of every replica that workload certificates should outlast (a third of their
#: lifetime: the default 24 h gives 8 h); less is warned about at start.
OUTAGE_WARNING: Final = datetime.timedelta(hours=1)


def certificate_authority(settings: ServeSettings, trust_domain: str) -> CertificateAuthority | None:
    """The CA of `settings` (see `ServeSettings.ca_dir`); raises CredentialError for files that
    cannot be used."""
    from meshctl.security.ca import CertificateAuthority

    if settings.ca_dir is not None:
        return CertificateAuthority.from_ca_dir(settings.ca_dir)
    if settings.state_dir is None:
        return None
    try:
        return CertificateAuthority.self_signed(settings.state_dir, trust_domain)
    except CredentialError as exc:
        if settings.state_dir_given:
            raise
        logger.warning("workload mutual TLS is off (give --state-dir or --ca-dir): %s", exc)
        return None


class CaUpkeep:
    """Renewal, expiry watch and CA swaps for the CA in `holder`, from `start` to `stop`."""

    def __init__(
        self,
        settings: ServeSettings,
        holder: CaHolder,
        secrets: WorkloadSecrets,
        metrics: Metrics,
        *,
        ads: AdsServicer,
        snapshot: Callable[[], Snapshot | None],
    ) -> None:
        self._settings = settings
        self._holder = holder
        self._secrets = secrets
        self._metrics = metrics
        self._ads = ads
        self._snapshot = snapshot
        self._renewal: asyncio.Task[None] | None = None
        self._ca_watch: CaExpiryWatch | None = None
        self._ca_follower: CaDirFollower | None = None
        self._ca_push: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The server serves: renew as certificates come due, and say which CA signs."""
        ca = self._holder.current
        settings = self._settings
        self._renewal = asyncio.create_task(self._renew_certificates(), name="meshctl-renew")
        self._metrics.watch_ca(ca.root_not_after.timestamp(), ca.not_after.timestamp(), ca.root_fingerprints)
        # Which CA signs, and whether this start made it: a root found in a state directory
        # (a root's first start reusing /var/lib/meshctl, say) must not be a surprise.
        logger.info("workload certificates are signed by the %s", ca.describe())
        self._metrics.watch_workload_certificates(self._secrets.earliest_expiry, self._secrets.signers)
        if (outage := settings.workload_cert_lifetime * (1 - RENEW_FRACTION)) < OUTAGE_WARNING:
            logger.warning(
                "--workload-cert-lifetime %s: certificates are renewed at two thirds of it, so proxies lose "
                "mutual TLS (and VMs their xDS certificate) after %s without any replica: under an hour",
                settings.workload_cert_lifetime,
                outage,
            )
        self._ca_watch = CaExpiryWatch(ca)
        self._ca_watch.start()
        if settings.ca_dir is not None:
            self._ca_follower = CaDirFollower(settings.ca_dir, self._holder, self._ca_swapped)
            self._ca_follower.start()

    async def stop(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        if self._ca_watch is not None:
            self._ca_watch.stop()
        if self._ca_follower is not None:
            self._ca_follower.stop()

    def _ca_swapped(self, before: CertificateAuthority, after: CertificateAuthority) -> None:
        """A new CA is in force: every proxy gets a new trust bundle now, and the certificates a
        signing certificate no longer in force issued are reissued within the window."""
        window = min(self._settings.ca_reissue_window, self._settings.workload_cert_lifetime / 3)
        nodes = self._secrets.follow_ca(window)
        self._metrics.watch_ca(after.root_not_after.timestamp(), after.not_after.timestamp(), after.root_fingerprints)
        if self._ca_watch is not None:
            self._ca_watch.stop()
        self._ca_watch = CaExpiryWatch(after)
        self._ca_watch.start()
        snapshot = self._snapshot()
        if nodes and snapshot is not None:
            self._ca_push = asyncio.create_task(self._push_trust(snapshot, nodes), name="meshctl-trust-bundle")

    async def _push_trust(self, snapshot: Snapshot, nodes: set[str]) -> None:
        try:
            await self._ads.publish(snapshot, nodes=nodes)
        except Exception:  # the next renewal round or config push carries it; say so now
            logger.exception("pushing the new trust bundle to %d proxies failed", len(nodes))

    async def _renew_certificates(self) -> None:
        """Publish the current snapshot again to the streams whose workload certificates are due
        (or nearly: `WorkloadSecrets.due_nodes`): they re-resolve, and only their `default`
        secret changes."""
        secrets = self._secrets
        while True:
            due = secrets.due()
            now = datetime.datetime.now(datetime.UTC)
            # Looked at every second at most: a certificate issued meanwhile may be short-lived.
            wait = 1.0 if due is None else min(1.0, max(0.2, (due - now).total_seconds()))
            await asyncio.sleep(wait)
            due = secrets.due()
            snapshot = self._snapshot()
            started = datetime.datetime.now(datetime.UTC)
            if due is not None and snapshot is not None and started >= due:
                try:
                    await self._ads.publish(snapshot, nodes=secrets.due_nodes(started))
                except Exception:
                    logger.exception("renewing workload certificates failed; retrying")
                    continue
                secrets.forget_due(started)
