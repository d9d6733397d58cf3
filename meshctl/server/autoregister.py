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
Replicas that share Consul share registrations (`meshctl.registry.health_share`); a single server
keeps its own in `--state-dir` across restarts (`AutoRegistrar`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshctl.api.networking.v1alpha3 import workload_entry_pb2, workload_group_pb2
from meshctl.config.hosts import is_ip
from meshctl.config.labels import GROUP_ANNOTATION
from meshctl.config.model import Config, make_config
from meshctl.logs import untrusted
from meshctl.registry.files import FileRegistry
from meshctl.server.auth import PeerIdentity, check_identity
from meshctl.server.node_address import group_of
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyNode

logger = logging.getLogger("meshctl.server.autoregister")


WorkloadKey = tuple[str, str]


def entry_name(group: str, ip: str, network: str) -> str:
    name = f"{group}-{ip.replace(':', '-')}"
    return f"{name}-{network}" if network else name


@dataclass(frozen=True, slots=True)
class _View:
    """Another replica's registration of a VM (or one remembered after its replica's key went)."""

    entry: Config
    streams: int
    gone_since: float | None


def registered_entry(namespace: str, name: str, group: str, address: str) -> Config:
    """The WorkloadEntry a VM of `group` at `address` is registered as (named `name`)."""
    spec = workload_entry_pb2.WorkloadEntry(address=address)
    return make_config("WorkloadEntry", name, namespace, spec, annotations={GROUP_ANNOTATION: group})


def _describe(entry: Config) -> dict[str, Any]:
    """What a replica shares (and `--state-dir` keeps) of a registration: the rest is the group's."""
    spec: Any = entry.spec
    return {"group": entry.annotations.get(GROUP_ANNOTATION, ""), "address": spec.address}


def _entry_of(namespace: str, name: str, value: Mapping[str, Any]) -> Config | None:
    group, address = value.get("group"), value.get("address")
    if not isinstance(group, str) or not group or not isinstance(address, str) or not is_ip(address):
        return None
    return registered_entry(namespace, name, group, address)


class AutoRegistrar:
    """The registered VMs' WorkloadEntries, their streams, and their removal after the grace.

    Its own registrations are those of the VMs whose streams are (or were, within the grace) on
    this server. With replicas sharing (`meshctl.registry.health_share`) each is also written
    as this replica's view (`on_local`), and the other replicas' views are laid beside them
    (`set_remote`): a VM registered on any replica is an entry on all, kept while any replica
    holds its stream, and for the grace after the last one goes; a view that disappears with
    its replica's session counts as gone since then. With `state_file` (in `--state-dir`) the
    own registrations outlive a restart: they come back as gone since the start, so a VM that
    reconnects within the grace keeps its entry, and one that does not is removed as usual.
    """

    def __init__(
        self,
        files: FileRegistry,
        file_configs: Callable[[], Iterable[Config]],
        grace: float,
        *,
        state_file: Path | None = None,
    ) -> None:
        self._files = files
        self._file_configs = file_configs
        self.grace = grace
        self._state_file = state_file
        self._save_failed = False
        self._lock = threading.Lock()
        self._entries: dict[WorkloadKey, Config] = {}
        self._streams: dict[WorkloadKey, int] = {}
        self._gone: dict[WorkloadKey, float] = {}
        self._remote: dict[WorkloadKey, dict[str, _View]] = {}
        self._memory: dict[WorkloadKey, dict[str, _View]] = {}
        #: Called with this replica's own registration after each change (None: it holds none).
        self.on_local: Callable[[WorkloadKey, dict[str, Any] | None], None] | None = None
        #: Called (on any thread) when a removal may be due sooner than the timers know.
        self.on_expiry_changed: Callable[[], None] | None = None
        # One thread, so registry rebuilds apply in the order asked, each with the entries then held.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-register")

    def registered(self) -> int:
        return len(self._visible())

    def _visible(self) -> dict[WorkloadKey, Config]:
        """Every entry this server serves: its own, the other replicas', and those remembered."""
        with self._lock:
            found: dict[WorkloadKey, Config] = {}
            for table in (self._memory, self._remote):
                for key, views in table.items():
                    for view in views.values():
                        found[key] = view.entry
            found.update(self._entries)
            return found

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
        entry = registered_entry(node.namespace, entry_name(name, node.ip, spec.template.network), name, node.ip)
        bound = replace(
            node, attested=peer is not None, workload=f"{node.namespace}/{entry.name}", service_account=account
        )
        return bound, entry

    def opened(self, entry: Config) -> bool:
        """A stream of `entry`'s VM opened; True when the entry is new (the registry must change)."""
        key = (entry.namespace, entry.name)
        with self._lock:
            self._streams[key] = self._streams.get(key, 0) + 1
            self._gone.pop(key, None)
            known = self._entries.get(key)
            new = known is None or not known.same_content(entry)
            if new:
                self._entries[key] = entry
                served = any(
                    v.entry.same_content(entry) for t in (self._remote, self._memory) for v in t.get(key, {}).values()
                )
        self._share(key)
        if not new:
            return False
        logger.info("registered workload %s/%s into its WorkloadGroup", key[0], key[1])
        return not served

    def closed(self, key: WorkloadKey, now: float | None = None) -> None:
        with self._lock:
            count = self._streams.get(key, 0) - 1
            if count > 0:
                self._streams[key] = count
            else:
                self._streams.pop(key, None)
                if key in self._entries:
                    self._gone[key] = time.time() if now is None else now
        self._share(key)

    def expire(self, now: float | None = None) -> bool:
        """Remove the entries whose VM has been gone longer than the grace; True when any was."""
        at = time.time() if now is None else now
        with self._lock:
            due = [k for k, since in self._gone.items() if at - since >= self.grace]
            for key in due:
                del self._gone[key]
                self._entries.pop(key, None)
            forgotten = False
            for key, views in list(self._memory.items()):
                for session, view in list(views.items()):
                    if view.gone_since is None or at - view.gone_since >= self.grace:
                        del views[session]
                        forgotten = True
                if not views:
                    del self._memory[key]
            served = {k for t in (self._remote, self._memory) for k in t}
        for key in due:
            self._share(key)
            if key not in served:
                logger.info("removed workload %s/%s: its Envoy has been gone for %gs", key[0], key[1], self.grace)
        return bool(due) or forgotten

    def next_expiry(self) -> float | None:
        with self._lock:
            times = list(self._gone.values())
            times += [v.gone_since for m in self._memory.values() for v in m.values() if v.gone_since is not None]
        return min(times) + self.grace if times else None

    def set_remote(
        self, views: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]], now: float | None = None
    ) -> None:
        """Take the other replicas' registrations (workload -> session -> shared value) as they
        are now; a view that went (its replica's session ended) is kept for the grace."""
        at = time.time() if now is None else now
        parsed: dict[WorkloadKey, dict[str, _View]] = {}
        for (namespace, name), by_session in views.items():
            for session, value in by_session.items():
                entry = _entry_of(namespace, name, value)
                streams, gone = value.get("streams"), value.get("goneSince")
                if entry is None or not isinstance(streams, int) or not (gone is None or isinstance(gone, int | float)):
                    continue
                parsed.setdefault((namespace, name), {})[session] = _View(entry, streams, gone)
        before = self._visible()
        with self._lock:
            for key, old in self._remote.items():
                for session, view in old.items():
                    if session not in parsed.get(key, {}):
                        since = at if view.streams else view.gone_since
                        self._memory.setdefault(key, {})[session] = _View(view.entry, 0, since)
            for key, new in parsed.items():
                for session in new:
                    self._memory.get(key, {}).pop(session, None)
            self._remote = parsed
        after = self._visible()
        if self.on_expiry_changed is not None:
            self.on_expiry_changed()
        if before.keys() != after.keys() or any(not before[k].same_content(after[k]) for k in after):
            self.apply_soon()

    def _share(self, key: WorkloadKey) -> None:
        """Tell `on_local` this replica's registration of `key` as it is now."""
        if self.on_local is None:
            return
        with self._lock:
            entry = self._entries.get(key)
            value = (
                None
                if entry is None
                else {**_describe(entry), "streams": self._streams.get(key, 0), "goneSince": self._gone.get(key)}
            )
        self.on_local(key, value)

    def restore(self, now: float | None = None) -> int:
        """Take back the registrations `state_file` kept, as gone since now; returns how many."""
        if self._state_file is None:
            return 0
        try:
            saved = json.loads(self._state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            logger.warning(
                "cannot read the registrations kept in %s (%s): starting without them", self._state_file, exc
            )
            return 0
        at = time.time() if now is None else now
        restored = 0
        for item in saved if isinstance(saved, list) else []:
            if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("namespace", "name")):
                continue
            entry = _entry_of(item["namespace"], item["name"], item)
            if entry is None:
                continue
            with self._lock:
                self._entries[(entry.namespace, entry.name)] = entry
                self._gone[(entry.namespace, entry.name)] = at
            self._share((entry.namespace, entry.name))
            restored += 1
        if restored:
            logger.info(
                "took back %d registered workloads from %s; each is removed unless its VM reconnects within %gs",
                restored,
                self._state_file,
                self.grace,
            )
        return restored

    def _save(self, entries: Iterable[Config]) -> None:
        """Keep this server's own registrations in `state_file` (written whole, then renamed)."""
        if self._state_file is None:
            return
        items = [{"namespace": e.namespace, "name": e.name, **_describe(e)} for e in entries]
        items.sort(key=lambda i: (i["namespace"], i["name"]))
        temporary = self._state_file.with_name(self._state_file.name + ".tmp")
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")
            os.replace(temporary, self._state_file)
        except OSError as exc:
            if not self._save_failed:  # once: every registration would say it again
                logger.warning("cannot keep the registered workloads in %s: %s", self._state_file, exc)
            self._save_failed = True
        else:
            self._save_failed = False

    def publish(self) -> None:
        """Hand the registered entries to the file registry (a rebuild: call off the event loop)."""
        with self._lock:
            own = list(self._entries.values())
        self._save(own)
        self._files.set_registered(list(self._visible().values()), self._file_configs())

    async def apply(self) -> None:
        """`publish` on the registrar's thread, awaited."""
        await asyncio.wrap_future(self._worker.submit(self.publish))

    def apply_soon(self) -> None:
        with contextlib.suppress(RuntimeError):  # stopped
            self._worker.submit(self.publish)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
