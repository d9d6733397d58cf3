"""WorkloadGroup auto-registration: a VM's Envoy connecting with `AUTO_REGISTER_GROUP` metadata
(Istio's name; `meshctl bootstrap --group NAME.NAMESPACE` writes it) gets a WorkloadEntry made
from the group, without a file per VM.

The entry is what Istio's auto-registration creates: named `GROUP-IP` (`:` of an IPv6 address
as `-`, and `-NETWORK` when the group's template names a network), in the group's namespace,
at the node's IP, annotated `istio.io/autoRegistrationGroup: GROUP`; the file registry fills
the rest from the group's template (labels, ports, service account, network, locality) as it
does for any entry of a group. A group with a `probe` has its entries health-checked.

Registration rides on the health stream (HDS), which every meshctl bootstrap opens: the entry
is made when the stream opens and removed once the node has had no stream for the grace period
(`--health-grace`), so a reconnect keeps it. With client certificates, the certificate must
name the group's service account in the group's namespace, as Istio requires of the token.
Registrations live in this server's memory: a restart forgets them until the VMs reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Final

from meshctl.api.networking.v1alpha3 import workload_entry_pb2, workload_group_pb2
from meshctl.config.model import Config, make_config
from meshctl.logs import untrusted
from meshctl.registry.files import FileRegistry
from meshctl.registry.health_checks import GROUP_ANNOTATION
from meshctl.server.auth import PeerIdentity, check_identity
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import ProxyNode

logger = logging.getLogger("meshctl.server.autoregister")

METADATA_KEY: Final = "AUTO_REGISTER_GROUP"

WorkloadKey = tuple[str, str]


def group_of(node: ProxyNode) -> str:
    """The WorkloadGroup `node` asks to register into ("" for none)."""
    return str(node.metadata.get(METADATA_KEY) or "")


def entry_name(group: str, ip: str, network: str) -> str:
    name = f"{group}-{ip.replace(':', '-')}"
    return f"{name}-{network}" if network else name


class AutoRegistrar:
    """The registered VMs' WorkloadEntries, their streams, and their removal after the grace."""

    def __init__(self, files: FileRegistry, file_configs: Callable[[], Iterable[Config]], grace: float) -> None:
        self._files = files
        self._file_configs = file_configs
        self.grace = grace
        self._entries: dict[WorkloadKey, Config] = {}
        self._streams: dict[WorkloadKey, int] = {}
        self._gone: dict[WorkloadKey, float] = {}
        # One thread, so registry rebuilds apply in the order asked, each with the entries then held.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-register")

    def registered(self) -> int:
        return len(self._entries)

    def entry_for(
        self, node: ProxyNode, snapshot: Snapshot, peer: PeerIdentity | None
    ) -> tuple[ProxyNode, Config] | str:
        """The node as its registration binds it and its entry, or why it may not register."""
        name = group_of(node)
        config = snapshot.get("WorkloadGroup", node.namespace, name)
        spec: Any = config.spec if config is not None else None
        if config is None or not isinstance(spec, workload_group_pb2.WorkloadGroup):
            return (
                f"node {untrusted(node.id)} asks to register into WorkloadGroup "
                f"{untrusted(node.namespace)}/{untrusted(name)}, which does not exist"
            )
        account = spec.template.service_account or "default"
        if peer is not None:
            refusal = check_identity(node, peer, account, bound_by_name=False)
            if refusal is not None:
                return refusal
        entry = make_config(
            "WorkloadEntry",
            entry_name(name, node.ip, spec.template.network),
            node.namespace,
            workload_entry_pb2.WorkloadEntry(address=node.ip),
            annotations={GROUP_ANNOTATION: name},
        )
        bound = replace(
            node, attested=peer is not None, workload=f"{node.namespace}/{entry.name}", service_account=account
        )
        return bound, entry

    def opened(self, entry: Config) -> bool:
        """A stream of `entry`'s VM opened; True when the entry is new (the registry must change)."""
        key = (entry.namespace, entry.name)
        self._streams[key] = self._streams.get(key, 0) + 1
        self._gone.pop(key, None)
        known = self._entries.get(key)
        if known is not None and known.same_content(entry):
            return False
        self._entries[key] = entry
        logger.info("registered workload %s/%s into its WorkloadGroup", key[0], key[1])
        return True

    def closed(self, key: WorkloadKey, now: float | None = None) -> None:
        count = self._streams.get(key, 0) - 1
        if count > 0:
            self._streams[key] = count
            return
        self._streams.pop(key, None)
        if key in self._entries:
            self._gone[key] = time.time() if now is None else now

    def expire(self, now: float | None = None) -> bool:
        """Remove the entries whose VM has been gone longer than the grace; True when any was."""
        at = time.time() if now is None else now
        due = [k for k, since in self._gone.items() if at - since >= self.grace]
        for key in due:
            del self._gone[key]
            self._entries.pop(key, None)
            logger.info("removed workload %s/%s: its Envoy has been gone for %gs", key[0], key[1], self.grace)
        return bool(due)

    def next_expiry(self) -> float | None:
        return min(self._gone.values()) + self.grace if self._gone else None

    def publish(self) -> None:
        """Hand the registered entries to the file registry (a rebuild: call off the event loop)."""
        self._files.set_registered(list(self._entries.values()), self._file_configs())

    async def apply(self) -> None:
        """`publish` on the registrar's thread, awaited."""
        await asyncio.wrap_future(self._worker.submit(self.publish))

    def apply_soon(self) -> None:
        with contextlib.suppress(RuntimeError):  # stopped
            self._worker.submit(self.publish)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
