"""What the server spends per stream on a change every proxy sees, pinned by counting: the work
done once per publication (not once per stream) stays so, and what a publication waits for
before its first push is the server's own work only."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tracemalloc
from collections.abc import KeysView
from pathlib import Path
from types import MappingProxyType

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from meshctl.server.cache import ResourceCache
from meshctl.server.connection import Connection
from meshctl.server.credentials import CredentialSecrets
from meshctl.server.delivery import Delivery
from meshctl.server.history import PushHistory
from meshctl.server.metrics import Metrics
from meshctl.server.proxy_resources import ProxyResources
from meshctl.server.rollout_plan import RolloutSettings
from meshctl.server.secrets import WorkloadSecrets
from meshctl.server.subscription import RequestKind, SotwSubscription
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.resources import Resource, ResourceSet

SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
"""


def _git_repo(tmp_path: Path) -> Path:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "web.yaml").write_text(SERVICE)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "web"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env, capture_output=True)
    return mesh


def test_a_publication_does_not_wait_for_git_and_its_entry_gets_the_commit_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git` that does not answer until released (a slow `git status` in a large checkout): the
    publication is recorded and handed on at once, and the history entry names the commit once
    git answers."""
    mesh = _git_repo(tmp_path)
    real_git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    release = tmp_path / "release"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    slow = bin_dir / "git"
    slow.write_text(f'#!/bin/sh\nwhile [ ! -e "{release}" ]; do sleep 0.02; done\nexec "{real_git}" "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    history = PushHistory(tmp_path / "state")
    snapshot = snapshot_from_yaml(SERVICE)

    async def main() -> dict[str, object]:
        delivery = Delivery(Metrics(), history, RolloutSettings(), [mesh], list, lambda: None)
        try:
            # Without git answering, this returns at once (milliseconds); waiting for git, only
            # at git's own time-out (5 s, after which the entry would name no commit).
            await asyncio.wait_for(delivery.published(snapshot), 3)
            entry = history.entry(snapshot.version)
            assert entry is not None and entry["git"] == []
            release.touch()
            for _ in range(3000):
                if history.entry(snapshot.version)["git"]:  # type: ignore[index]
                    break
                await asyncio.sleep(0.01)
            found = history.entry(snapshot.version)
            assert found is not None
            return found
        finally:
            release.touch()
            delivery.stop()

    entry = asyncio.run(main())
    head = subprocess.run(["git", "-C", str(mesh), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert entry["git"] == [{"dir": str(mesh), "commit": head.stdout.strip(), "dirty": False}]


def test_an_ack_naming_the_names_it_named_before_makes_no_string_of_them() -> None:
    """Every EDS ACK names every assignment the proxy watches: ten thousand names at ten
    thousand services, a thousand streams ACKing each push. The same names in the same order
    are recognised without making them into Python strings (what a set of them would take)."""
    names = [f"s{i}" for i in range(10_000)]
    sub = SotwSubscription(types.ENDPOINT, wildcard_when_empty=False, partial=True)

    def request(version: str = "", nonce: str = "") -> discovery_pb2.DiscoveryRequest:
        return discovery_pb2.DiscoveryRequest(
            type_url=types.ENDPOINT, resource_names=names, version_info=version, response_nonce=nonce
        )

    sub.handle(request())
    push = sub.next_push({})
    assert push is not None
    ack = request(push.version, push.nonce)
    tracemalloc.start()
    try:
        outcome = sub.handle(ack)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.kind is RequestKind.ACK and not outcome.subscription_changed
    assert sub.acked_version == push.version and sub.names == frozenset(names)
    # Ten thousand strings and a set of them take over 1 MB; their encoding alone, 80 KB.
    assert peak < 400_000, peak


SIDECAR = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["HOSTS"]}]
"""


def test_a_stream_resolved_at_each_publication_is_one_node_to_the_cache() -> None:
    """The servicer resolves every stream at every publication through the secrets' sources,
    which say whether the node may be sent keys and credentials: the node they hand the cache
    is made once per stream, not once per publication (a `dataclasses.replace` each, more than
    the rest of resolving a node whose binding is kept)."""
    cache = ResourceCache()
    workload = WorkloadSecrets(cache.resolve, None, trust_domain=lambda: "cluster.local")
    source = CredentialSecrets(workload.resolve, None)
    node = parse_node_id("sidecar~10.0.0.9~web.shop~shop.svc.cluster.local", {}, "")
    snapshots = [
        snapshot_from_yaml(SERVICE),
        snapshot_from_yaml(SERVICE + SIDECAR.replace("HOSTS", "./*")),
        snapshot_from_yaml(SERVICE + SIDECAR.replace("HOSTS", "*/*")),
    ]
    nodes = [source.resolve(node, snapshot).proxy.node for snapshot in snapshots]
    assert cache.bindings == 3  # a Sidecar each time: bound again, from the node it was handed
    assert not nodes[0].mesh_certificates and not nodes[0].credentials
    assert nodes[1] is nodes[0] and nodes[2] is nodes[0]


class CountedSet(ResourceSet):
    """A ResourceSet that counts how often its names are read whole (`keys()`)."""

    __slots__ = ("reads",)

    def __init__(self, resources: list[Resource]) -> None:
        super().__init__(resources)
        self.reads = 0

    def keys(self) -> KeysView[str]:
        self.reads += 1
        return super().keys()


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_the_streams_of_a_namespace_compare_their_names_with_a_new_set_once(delta: bool) -> None:
    """An endpoint change offers the sidecars of a namespace one new EDS set, and they hold one
    set of names between them: whether the names cover the set (is it the whole of what each
    stream is sent? does each watch every assignment of its clusters?) is a comparison of every
    name (a thousand at 10,000 services), made once for them all, not twice per stream; and a
    delta stream in step with the set before compares the two sets, once for them all."""
    names = [f"outbound|80||s{i}.shop.mesh" for i in range(1000)]
    clusters = ResourceSet(Resource(n, "1", n.encode()) for n in names)
    listeners = ResourceSet([Resource("0.0.0.0_80", "1", b"l")])

    def offered(version: str, eds: ResourceSet) -> ProxyResources:
        by_type = {types.CLUSTER: clusters, types.ENDPOINT: eds, types.LISTENER: listeners}
        return ProxyResources(version, "c", MappingProxyType(by_type))

    first = ResourceSet(Resource(n, "1", b"a") for n in names)
    streams = []
    for i in range(50):
        conn = Connection(f"c{i}", delta=delta)
        conn.update(offered("1", first))
        # Listeners too: whether routes must wait for the node to watch every cluster's
        # endpoints is asked at every push.
        if delta:
            for wildcard in (types.CLUSTER, types.LISTENER):
                conn.handle(wildcard, discovery_pb2.DeltaDiscoveryRequest(type_url=wildcard))
            eds = discovery_pb2.DeltaDiscoveryRequest(type_url=types.ENDPOINT, resource_names_subscribe=names)
            conn.handle(types.ENDPOINT, eds)
        else:
            for wildcard in (types.CLUSTER, types.LISTENER):
                conn.handle(wildcard, discovery_pb2.DiscoveryRequest(type_url=wildcard))
            eds = discovery_pb2.DiscoveryRequest(type_url=types.ENDPOINT, resource_names=names)
            conn.handle(types.ENDPOINT, eds)
        for push in conn.pushes():
            ack: discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest
            if delta:
                ack = discovery_pb2.DeltaDiscoveryRequest(type_url=push.type_url, response_nonce=push.nonce)
            else:
                ack = discovery_pb2.DiscoveryRequest(
                    type_url=push.type_url,
                    resource_names=names if push.type_url == types.ENDPOINT else [],
                    version_info=push.version,
                    response_nonce=push.nonce,
                )
            conn.handle(push.type_url, ack)
        streams.append(conn)
    changed = CountedSet([Resource(n, "2" if n == names[7] else "1", b"b" if n == names[7] else b"a") for n in names])
    sent = []
    for conn in streams:
        assert conn.update(offered("2", changed))
        sent += [(p.type_url, [r.name for r in p.resources]) for p in conn.pushes()]
    assert sent == [(types.ENDPOINT, [names[7]])] * len(streams)
    assert changed.reads <= 2, changed.reads
