"""Replicas fed the same inputs answer alike: the same bytes and versions to every proxy.

Versions are content hashes (DESIGN.md, "Contracts"), so two `meshctl serve` processes that read
the same YAML and the same Consul catalog give each proxy byte-identical resources, the same
state-of-the-world `version_info` and the same per-resource delta versions, whatever differs
between the two runs that no proxy can see: start time, file mtimes, the order files were written
(and so listed), the Python hash seed, the order inputs arrived in (each replica's Consul had
the instances registered in another order, at other raft indexes). That is what makes a failover free: a proxy
that reconnects to the other replica presenting what it holds is sent nothing.

One exception, by design: each replica issues its own workload certificates, with a key of its
own, so the SDS secret `default` differs between them even with a shared CA. The replicas here
share a copy of one CA state directory, so the trust bundle `ROOTCA` is the same; `default` is
compared by name only, and the SDS versions (which cover it) are not compared.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import EXTRA_FILES, GATEWAY, MESH_CONFIG, PRODUCTPAGE, REVIEWS_V1, SLEEP, examples_copy, jwt_yaml
from envoy.service.discovery.v3 import discovery_pb2

from meshctl.config.model import Config
from meshctl.ingest import load_files
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import make_model
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import build_snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.ads_client import AdsClient, eds_names, rds_names
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.serve_process import ServeProcess, meshctl_command
from meshctl.xds import types
from meshctl.xds.generate import generate
from meshctl.xds.mesh_tls import ROOT_SECRET, WORKLOAD_SECRET, secret_names
from meshctl.xds.resources import to_resource

#: A VM with no WorkloadEntry: bound to nothing, it gets the namespace's outbound config.
STRANGER = "sidecar~10.10.0.99~stranger.bookinfo~bookinfo.svc.cluster.local"
#: A VM behind a Sidecar ingress listener, labelled for mutual TLS (so clients name SDS secrets).
SHOP = "sidecar~10.20.0.5~reviews-v1.shop~shop.svc.cluster.local"
PROXIES = (PRODUCTPAGE, REVIEWS_V1, GATEWAY, SLEEP, STRANGER, SHOP)

#: Types whose resources and versions must match exactly; SDS differs by `default` (see above).
COMPARED = (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE)
#: Every xDS type, SDS included, so that SDS is exercised (its ROOTCA is compared).
ALL_TYPES = (*COMPARED, types.SECRET)

# -- two replicas --------------------------------------------------------------------------------


@dataclass
class Replicas:
    a: ServeProcess
    b: ServeProcess


def _consul_instance(node: str, address: str, service: str, port: int, **meta: str) -> dict[str, Any]:
    return {
        "Node": node,
        "Address": address,
        "NodeMeta": {"rack": node[-1]},
        "Service": {
            "ID": f"{service}-{node}",
            "Service": service,
            "Port": port,
            "Tags": ["v1", "primary"] if node.endswith("1") else ["v2"],
            "Meta": {"protocol": "http", **meta},
        },
    }


#: Consul's catalog: services with several instances on several nodes, HTTP and TCP.
CONSUL_INSTANCES = [
    _consul_instance(f"vm-{i}", f"10.40.0.{i}", service, port, **({"version": f"v{i}"} if service == "orders" else {}))
    for service, port in (("orders", 8080), ("payments", 8443), ("inventory", 9000))
    for i in (1, 2, 3)
]


def _tree(parent: Path) -> dict[Path, bytes]:
    """The example mesh and the extra files, as relative path -> content."""
    source = examples_copy(parent)
    (source / "extra").mkdir()
    for name, text in {**EXTRA_FILES, "jwt.yaml": jwt_yaml()}.items():
        (source / "extra" / name).write_text(text)
    return {p.relative_to(source): p.read_bytes() for p in sorted(source.rglob("*")) if p.is_file()}


def _write(root: Path, files: Mapping[Path, bytes], order: list[Path], mtimes: Mapping[Path, float]) -> Path:
    """The tree at `root`, its files created in `order` and given `mtimes`."""
    for rel in order:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(files[rel])
    for rel in order:
        os.utime(root / rel, (mtimes[rel], mtimes[rel]))
    return root


def _start(server: ServeProcess, seed: str) -> None:
    """Start `server` with PYTHONHASHSEED=`seed`: ServeProcess passes its own environment on."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONHASHSEED", seed)
        server.start()
    environ = Path(f"/proc/{server.pid}/environ")
    if environ.exists():  # Linux: prove the seed reached the process
        assert f"PYTHONHASHSEED={seed}".encode() in environ.read_bytes().split(b"\0")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Replica A on tree `a`, started with PYTHONHASHSEED=1; replica B a second later on tree `b`
    (the same files, written in another order, with other mtimes) with PYTHONHASHSEED=2."""
    tmp = tmp_path_factory.mktemp("replicas")
    files = _tree(tmp / "source")
    names = sorted(files)
    shuffled = names[:]
    random.Random(7).shuffle(shuffled)
    now = time.time()
    tree_a = _write(tmp / "a" / "mesh", files, names, {rel: now - 86400 - i for i, rel in enumerate(names)})
    tree_b = _write(
        tmp / "b" / "mesh", files, shuffled[::-1], {rel: now - 60 + 7 * i for i, rel in enumerate(shuffled)}
    )
    (tmp / "mesh.yaml").write_text(MESH_CONFIG)

    def replica(tree: Path, state: Path, consul: FakeConsul) -> ServeProcess:
        # --insecure-send-keys: SDS for proxies that prove no identity, acceptable on loopback only.
        args = ["--insecure-send-keys", "--mesh-config", str(tmp / "mesh.yaml"), "--state-dir", str(state)]
        return ServeProcess([tree], consul=consul.address, extra_args=args)

    with ExitStack() as stack:
        # Each replica reads its own Consul (two agents of one datacenter): the same instances,
        # registered in other orders and at other raft indexes.
        consul_a, consul_b = stack.enter_context(FakeConsul()), stack.enter_context(FakeConsul())
        for body in CONSUL_INSTANCES:
            consul_a.register(body)
        consul_b.set_index(5000)
        for body in reversed(CONSUL_INSTANCES):
            consul_b.register(body)
        a = stack.push(replica(tree_a, tmp / "state-a", consul_a))
        _start(a, "1")
        # One CA for both (the root A created on its first start): then only workload keys differ.
        shutil.copytree(tmp / "state-a", tmp / "state-b")
        time.sleep(1.0)  # B starts later
        b = stack.push(replica(tree_b, tmp / "state-b", consul_b))
        _start(b, "2")
        yield Replicas(a, b)


# -- what a proxy is sent --------------------------------------------------------------------------


class RecordingClient(AdsClient):
    """An AdsClient that also keeps the version of each resource a delta response carries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resource_versions: dict[str, dict[str, str]] = {t: {} for t in types.PUSH_ORDER}

    def _apply(self, response: Any) -> None:
        if self.delta:
            held = self.resource_versions[response.type_url]
            held.update((r.name, r.version) for r in response.resources)
            for name in response.removed_resources:
                held.pop(name, None)
        super()._apply(response)


def settled(client: AdsClient) -> bool:
    """Complete, and holding every secret its clusters and listeners name."""
    named = secret_names(client.resources[types.CLUSTER].values(), client.resources[types.LISTENER].values())
    return client.complete() and named <= client.names(types.SECRET)


@dataclass(frozen=True)
class Seen:
    """What one proxy holds from one replica."""

    #: type -> name -> the resource, serialized deterministically (packed Anys keep the server's bytes)
    resources: dict[str, dict[str, bytes]]
    #: type -> the version of the last response (SotW `version_info`, delta `system_version_info`)
    versions: dict[str, str]
    #: delta only: type -> name -> `Resource.version`
    resource_versions: dict[str, dict[str, str]]
    #: type -> the names the proxy watches (empty for the wildcard types), as Envoy would ask again
    watched: dict[str, list[str]]


def seen(client: RecordingClient) -> Seen:
    versions = {r.type_url: r.version for r in client.log}
    clusters, listeners = client.resources[types.CLUSTER], client.resources[types.LISTENER]
    return Seen(
        resources={
            t: {n: m.SerializeToString(deterministic=True) for n, m in client.resources[t].items()} for t in ALL_TYPES
        },
        versions=versions,
        resource_versions={t: dict(v) for t, v in client.resource_versions.items()},
        watched={
            types.CLUSTER: [],
            types.ENDPOINT: sorted(eds_names(clusters)),
            types.LISTENER: [],
            types.ROUTE: sorted(rds_names(listeners)),
            types.SECRET: sorted(secret_names(clusters.values(), listeners.values())),
        },
    )


async def fetch(address: str, node_id: str, *, delta: bool) -> Seen:
    async with RecordingClient(address, node_id, delta=delta) as client:
        await client.wait_for(settled, timeout=20)
        return seen(client)


def fetch_all(address: str) -> dict[tuple[str, bool], Seen]:
    async def run() -> dict[tuple[str, bool], Seen]:
        keys = [(p, d) for p in PROXIES for d in (False, True)]
        got = await asyncio.gather(*(fetch(address, p, delta=d) for p, d in keys))
        return dict(zip(keys, got, strict=True))

    return asyncio.run(asyncio.wait_for(run(), 60))


@pytest.fixture(scope="module")
def seen_by_replica(replicas: Replicas) -> tuple[dict[tuple[str, bool], Seen], dict[tuple[str, bool], Seen]]:
    return fetch_all(replicas.a.xds_address), fetch_all(replicas.b.xds_address)


# -- 1. the same bytes and versions ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
@pytest.mark.parametrize("node_id", PROXIES, ids=lambda n: n.split("~")[2])
def test_replicas_send_every_proxy_the_same_bytes_and_versions(
    seen_by_replica: tuple[dict[tuple[str, bool], Seen], dict[tuple[str, bool], Seen]], node_id: str, delta: bool
) -> None:
    a, b = (side[(node_id, delta)] for side in seen_by_replica)
    assert a.resources[types.CLUSTER] and a.resources[types.LISTENER], "the proxy was sent a mesh"
    for t in COMPARED:
        assert sorted(a.resources[t]) == sorted(b.resources[t]), types.SHORT_NAMES[t]
        differ = sorted(n for n in a.resources[t] if a.resources[t][n] != b.resources[t][n])
        assert not differ, f"{types.SHORT_NAMES[t]} resources differ between replicas: {differ}"
        assert a.versions.get(t) == b.versions.get(t), f"{types.SHORT_NAMES[t]} version"
        if delta:
            assert a.resource_versions[t] == b.resource_versions[t], f"{types.SHORT_NAMES[t]} resource versions"
            assert a.resource_versions[t].keys() == a.resources[t].keys()
    # SDS: the trust bundle is the shared CA's; `default` is each replica's own key and certificate.
    secrets_a, secrets_b = a.resources[types.SECRET], b.resources[types.SECRET]
    assert secrets_a.keys() == secrets_b.keys()
    if secrets_a:
        assert secrets_a.keys() == {ROOT_SECRET, WORKLOAD_SECRET}
        assert secrets_a[ROOT_SECRET] == secrets_b[ROOT_SECRET]
        if delta:
            assert a.resource_versions[types.SECRET][ROOT_SECRET] == b.resource_versions[types.SECRET][ROOT_SECRET]


@pytest.mark.slow
def test_the_proxies_compared_cover_every_type_and_kind(
    seen_by_replica: tuple[dict[tuple[str, bool], Seen], dict[tuple[str, bool], Seen]],
) -> None:
    """Guards the test above against comparing little: SDS, DNS clusters, RBAC and gateways are in."""
    a, _ = seen_by_replica
    assert a[(SHOP, False)].resources[types.SECRET], "a proxy was sent secrets"
    clusters = {n for s in a.values() for n in s.resources[types.CLUSTER]}
    assert "outbound|5432|primary|db.legacy.internal" in clusters
    assert "outbound|443||api.payments.example.com" in clusters
    assert {"outbound|8080||orders.service.consul", "outbound|9000||inventory.service.consul"} <= clusters
    assignments = {n for s in a.values() for n in s.resources[types.ENDPOINT]}
    assert "outbound|8443||payments.service.consul" in assignments
    listeners = a[(GATEWAY, False)].resources[types.LISTENER]
    assert {"0.0.0.0_8080", "0.0.0.0_8443", "0.0.0.0_9000"} <= set(listeners)
    inbound = b"".join(a[(REVIEWS_V1, False)].resources[types.LISTENER].values())
    assert b"envoy.filters.http.rbac" in inbound
    assert b"envoy.filters.http.jwt_authn" in inbound


# -- 2. a proxy that moves to the other replica ------------------------------------------------------


_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def _resume_requests(node_id: str, held: Seen, *, delta: bool) -> list[Any]:
    """What Envoy sends first on a new stream after losing one: per type it watches, in the order
    it subscribed, the names it watches and what it holds (SotW: the version it last accepted;
    delta: `initial_resource_versions`); the first request names the node."""
    requests: list[Any] = []
    for t in (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE, types.SECRET):
        if t not in held.versions:
            continue  # never answered: a watch of nothing (no EDS cluster), or none at all
        request: Any
        if delta:
            request = discovery_pb2.DeltaDiscoveryRequest(
                type_url=t,
                resource_names_subscribe=held.watched[t],
                initial_resource_versions=held.resource_versions[t],
            )
        else:
            request = discovery_pb2.DiscoveryRequest(
                type_url=t, version_info=held.versions[t], resource_names=held.watched[t]
            )
        requests.append(request)
    requests[0].node.id = node_id
    requests[0].node.cluster = "meshctl-test"
    return requests


def _syncz_entry(server: ServeProcess, node_id: str) -> dict[str, Any] | None:
    for entry in server.admin_json("/debug/syncz"):
        if entry["proxy"] == node_id:
            found: dict[str, Any] = entry
            return found
    return None


async def resume(server: ServeProcess, node_id: str, held: Seen, *, delta: bool) -> list[Any]:
    """Open a stream to `server` as Envoy reconnecting with `held`; the responses it is sent
    until the server shows the proxy in sync, and half a second after."""
    done = asyncio.Event()

    async def requests() -> Any:
        for request in _resume_requests(node_id, held, delta=delta):
            yield request
        await done.wait()

    response_class = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
    received: list[Any] = []
    async with grpc.aio.insecure_channel(server.xds_address) as channel:
        call = channel.stream_stream(
            _DELTA if delta else _SOTW,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )(requests())

        async def receive() -> None:
            async for response in call:
                received.append(response)

        reader = asyncio.create_task(receive())
        deadline = time.monotonic() + 20
        want = {types.SHORT_NAMES[t]: held.versions[t] for t in COMPARED if t in held.versions}
        while True:
            entry = await asyncio.to_thread(_syncz_entry, server, node_id)
            acked = {k: v["acked"] for k, v in (entry or {}).get("types", {}).items() if k in want}
            if acked == want:
                break
            assert time.monotonic() < deadline, f"{node_id} not in sync on the other replica: {entry}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        done.set()
        reader.cancel()
        call.cancel()
    return received


@pytest.mark.slow
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_a_proxy_that_moves_to_the_other_replica_is_sent_nothing_new(replicas: Replicas, delta: bool) -> None:
    async def run() -> None:
        for node_id in (PRODUCTPAGE, GATEWAY, SHOP):
            async with RecordingClient(replicas.a.xds_address, node_id, delta=delta) as on_a:
                await on_a.wait_for(settled, timeout=20)
                held = seen(on_a)
            # A is gone for this proxy (it closed its stream); it comes back on B with what it holds.
            sent = await resume(replicas.b, node_id, held, delta=delta)
            changed = [r for r in sent if r.type_url != types.SECRET]
            assert not changed, f"{node_id}: the other replica sent {[(r.type_url, len(r.resources)) for r in changed]}"
            for response in sent:
                # Only SDS, and only the workload certificate this replica issued (see the docstring).
                if delta:
                    assert [r.name for r in response.resources] == [WORKLOAD_SECRET], node_id
                    assert not response.removed_resources
                else:
                    assert {a.value for a in response.resources} >= {held.resources[types.SECRET][ROOT_SECRET]}

    asyncio.run(asyncio.wait_for(run(), 60))


# -- 3. the snapshot version -----------------------------------------------------------------------


@pytest.mark.slow
def test_both_replicas_report_the_same_snapshot_version(replicas: Replicas) -> None:
    pages = [r.admin_json("/version") for r in (replicas.a, replicas.b)]
    assert pages[0]["snapshot"], "a snapshot is served"
    assert pages[0] == pages[1]
    printed = [
        subprocess.run(
            [*meshctl_command(), "version", "--server", r.admin_address],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        for r in (replicas.a, replicas.b)
    ]
    assert printed[0] == printed[1]
    assert f"(snapshot {pages[0]['snapshot']})" in printed[0]


# -- 4. in one process: the order inputs arrive in ----------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> list[Config]:
    tmp = tmp_path_factory.mktemp("inputs")
    files = _tree(tmp / "source")
    tree = _write(tmp / "mesh", files, sorted(files), {rel: time.time() for rel in files})
    result = load_files([tree])
    assert not result.errors
    return sorted(result.configs.values(), key=lambda c: c.key)


def _orders(configs: list[Config]) -> list[list[Config]]:
    shuffled = configs[:]
    random.Random(3).shuffle(shuffled)
    return [configs, configs[::-1], shuffled]


def test_registry_models_from_differently_ordered_inputs_have_the_same_digests(loaded: list[Config]) -> None:
    models = [build_file_model(order) for order in _orders(loaded)]
    # Arriving one at a time, in different orders, through the file registry.
    for order in _orders(loaded)[1:]:
        registry = FileRegistry()
        for config in order:
            registry.apply(updated=[config])
        models.append(registry.model())
    first = models[0]
    assert first.services and first.endpoints
    for model in models[1:]:
        assert model.digest() == first.digest()
        assert model.identities_digest() == first.identities_digest()
        assert dict(model.services) == dict(first.services)
        assert dict(model.endpoints) == dict(first.endpoints)
    # The model's own constructor, given services and endpoints in reverse.
    remade = make_model(
        reversed(list(first.services.values())),
        {host: tuple(reversed(eps)) for host, eps in reversed(list(first.endpoints.items()))},
    )
    assert remade.digest() == first.digest()
    assert remade.identities_digest() == first.identities_digest()


def test_snapshots_of_the_same_configs_in_any_order_have_the_same_versions(loaded: list[Config]) -> None:
    services = build_file_model(loaded)
    snapshots = [build_snapshot(order, build_file_model(order)) for order in _orders(loaded)]
    snapshots.append(build_snapshot({c.key: c for c in reversed(loaded)}, services))
    # Built up as the configs arrive, one change at a time, from an empty mesh.
    grown = build_snapshot([], make_model([], {}))
    present: dict[Any, Config] = {}
    for config in _orders(loaded)[2]:
        present[config.key] = config
        grown = build_snapshot(dict(present), build_file_model(present.values()), previous=grown, changed={config.key})
        grown.index  # noqa: B018 - each step indexed, as the server does, so the next reuses it
    snapshots.append(grown)
    first = snapshots[0]
    for snapshot in snapshots[1:]:
        assert (snapshot.version, snapshot.config_version) == (first.version, first.config_version)
    # And every proxy is generated the same resources from each.
    for node_id in PROXIES:
        generated = [
            {
                t: [(r.name, r.version) for r in (to_resource(m, t) for m in messages)]
                for t, messages in generate(s, bind_proxy(parse_node_id(node_id), s)).items()
            }
            for s in (first, snapshots[1], grown)
        ]
        assert generated[0] == generated[1] == generated[2], node_id
