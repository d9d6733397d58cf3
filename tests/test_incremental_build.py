"""A change costs what it touches, and gives the same result as building everything again.

The server updates its snapshot from the one before (`Discovery.build_next`: the store's changed
keys, the registry's memo, the index's reusable parts, the digests a model carries over). These
tests apply random sequences of edits, through the store and the file registry as the server
does, and check after each one that the updated snapshot is the one a full build makes: same
versions, same configs per kind, same lookups, and the same generated config for proxies.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.config.store import ConfigStore
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import make_model
from meshctl.registry.serviceentry import build_file_model
from meshctl.server.cache import ResourceCache
from meshctl.server.discovery import Discovery
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import configs_from_yaml, file_discovery
from meshctl.xds.generate import generate

SERVICES = ("a", "b", "c")
NAMESPACES = ("ns1", "ns2")


def _service_entry(name: str, ns: str, port: int) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{name}.{ns}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: {name}}}}}
"""


def _workload(name: str, ns: str, app: str, ip: str) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: {ns}}}
spec: {{address: {ip}, labels: {{app: {app}}}}}
"""


def _rule(name: str, ns: str, max_connections: int) -> str:
    # Some rules hash (routes to the host carry it), some name the subset routes may ask for.
    hashing = ", loadBalancer: {consistentHash: {httpHeaderName: x-user}}" if max_connections % 2 else ""
    # ... and the subset's labels change (the same cluster, other endpoints).
    labels = f"{{app: {name}}}" if max_connections != 3 else f"{{app: {name}, tier: gold}}"
    subsets = f"[{{name: v1, labels: {labels}}}]" if max_connections != 2 else "[]"
    return f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {ns}}}
spec:
  host: {name}.{ns}.mesh
  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: {max_connections}}}}}{hashing}}}
  subsets: {subsets}
"""


def _route(name: str, ns: str, timeout: int) -> str:
    # Routes to another service (whose rule and ports then shape them), by short name or in
    # full, to a subset, or mirrored: what route translations read beyond their own resource.
    other = SERVICES[(SERVICES.index(name) + timeout) % len(SERVICES)]
    target = other if timeout == 2 else f"{other}.{ns}.mesh"
    subset = ", subset: v1" if timeout == 3 else ""
    mirror = f", mirror: {{host: {name}.{ns}.mesh}}" if timeout == 1 else ""
    # ... or only for the callers of one service (a label selector: proxies part ways).
    source = f"match: [{{sourceLabels: {{app: {other}}}}}], " if timeout == 2 else ""
    return f"""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: {ns}}}
spec:
  hosts: [{name}.{ns}.mesh]
  http: [{{{source}timeout: {timeout}s, route: [{{destination: {{host: {target}{subset}}}}}]{mirror}}}]
"""


def _policy(name: str, ns: str, n: int) -> str:
    """What selects a service's workloads by label and shapes their inbound config or their
    binding: an AuthorizationPolicy, a PeerAuthentication, a Telemetry or an EnvoyFilter."""
    selector = f"{{matchLabels: {{app: {name}}}}}"
    if n == 1:
        return f"""
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: {name}, namespace: {ns}}}
spec: {{selector: {selector}, action: DENY, rules: [{{to: [{{operation: {{paths: [/admin]}}}}]}}]}}
"""
    if n == 2:
        return f"""
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: {name}, namespace: {ns}}}
spec: {{selector: {selector}, mtls: {{mode: STRICT}}}}
"""
    return f"""
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: {name}, namespace: {ns}}}
spec: {{selector: {selector}, accessLogging: [{{providers: [{{name: envoy}}]}}]}}
"""


def _filter(name: str, ns: str, n: int) -> str:
    """An EnvoyFilter for a service's workloads (its proxies' patch key)."""
    return f"""
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: {name}, namespace: {ns}}}
spec:
  workloadSelector: {{labels: {{app: {name}}}}}
  configPatches:
  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND}}
    patch: {{operation: MERGE, value: {{connect_timeout: {n}s}}}}
"""


def _sidecar(ns: str, n: int) -> str:
    """A namespace's Sidecar: its own namespace only, everything, or its own plus one service of
    the other namespace (scopes that differ by namespace, so outbound parts do)."""
    other = NAMESPACES[(NAMESPACES.index(ns) + 1) % len(NAMESPACES)]
    hosts = {1: '["./*"]', 2: '["*/*"]'}.get(n, f'["./*", "{other}/{SERVICES[n % len(SERVICES)]}.{other}.mesh"]')
    return f"""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  egress: [{{hosts: {hosts}}}]
"""


# One edit: (what, service, namespace, a number for the new content; 0 deletes it).
edits = st.tuples(
    st.sampled_from(("entry", "workload", "workload", "workload2", "rule", "route", "sidecar", "policy", "filter")),
    st.sampled_from(SERVICES),
    st.sampled_from(NAMESPACES),
    st.integers(min_value=0, max_value=3),
)


class Tree:
    """The mesh as files would hold it: one YAML document per (what, service, namespace)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str, str], str] = {}
        for ns in NAMESPACES:
            for name in SERVICES:
                self.docs[("entry", name, ns)] = _service_entry(name, ns, 8080)
                self.docs[("workload", name, ns)] = _workload(f"{name}-0", ns, name, _ip(name, ns, 0))

    def apply(self, edit: tuple[str, str, str, int]) -> None:
        what, name, ns, n = edit
        key = (what, name, ns)
        if n == 0:
            self.docs.pop(key if what != "sidecar" else ("sidecar", "", ns), None)
        elif what == "entry":
            self.docs[key] = _service_entry(name, ns, 8080 + n)
        elif what == "workload":
            self.docs[key] = _workload(f"{name}-0", ns, name, _ip(name, ns, n))
        elif what == "workload2":  # a second VM, which may move to another service
            app = SERVICES[(SERVICES.index(name) + n) % len(SERVICES)]
            self.docs[key] = _workload(f"{name}-1", ns, app, _ip(name, ns, (n + 4) % 6))  # may share an address
        elif what == "rule":
            self.docs[key] = _rule(name, ns, n)
        elif what == "sidecar":
            self.docs[("sidecar", "", ns)] = _sidecar(ns, n)
        elif what == "policy":
            self.docs[key] = _policy(name, ns, n)
        elif what == "filter":
            self.docs[key] = _filter(name, ns, n)
        else:
            self.docs[key] = _route(name, ns, n)

    def configs(self) -> list:  # type: ignore[type-arg]
        return configs_from_yaml("---".join(self.docs[k] for k in sorted(self.docs)))


def _ip(name: str, ns: str, n: int) -> str:
    return f"10.{NAMESPACES.index(ns) + 1}.{SERVICES.index(name)}.{n + 1}"


def _same(incremental: Snapshot, full: Snapshot) -> None:
    assert incremental.version == full.version
    assert incremental.config_version == full.config_version
    assert {k: [c.key for c in v] for k, v in incremental.by_kind.items()} == {
        k: [c.key for c in v] for k, v in full.by_kind.items()
    }
    for ns in NAMESPACES:
        for name in SERVICES:
            for n in range(8):
                address = _ip(name, ns, n)
                assert [(s.hostname, e) for s, e in incremental.index.endpoints_at(address)] == [
                    (s.hostname, e) for s, e in full.index.endpoints_at(address)
                ]
                found, expected = (
                    incremental.index.workload_entry_at(ns, address),
                    full.index.workload_entry_at(ns, address),
                )
                assert (found.key if found else None) == (expected.key if expected else None)
            host = f"{name}.{ns}.mesh"
            assert incremental.services.endpoints_digest(host) == full.services.endpoints_digest(host)
            for rules_ns in NAMESPACES:
                assert [c.key for c, _ in incremental.index.destination_rules(rules_ns, host)] == [
                    c.key for c, _ in full.index.destination_rules(rules_ns, host)
                ]
    assert incremental.index.label_selectors() == full.index.label_selectors()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(edits, min_size=1, max_size=12))
def test_updated_snapshots_equal_full_builds(sequence: list[tuple[str, str, str, int]]) -> None:
    tree = Tree()
    store = ConfigStore()
    files = FileRegistry()
    files.follow(store)
    registry = AggregateRegistry([files])

    async def _publish(_snapshot: Snapshot, _seen: float) -> None:
        return None

    discovery = Discovery(store, registry, _publish)
    cache = ResourceCache()
    store.replace_all(tree.configs())
    discovery.build_next()
    # Clients in both namespaces: their outbound parts are kept or regenerated separately.
    nodes = [
        parse_node_id(f"sidecar~10.{i + 1}.0.1~a-0.{ns}~{ns}.svc.cluster.local") for i, ns in enumerate(NAMESPACES)
    ]
    for edit in sequence:
        tree.apply(edit)
        store.replace_all(tree.configs())
        if edit[3] % 2:
            discovery.build_next()  # built and dropped unindexed: the next is indexed from the last indexed
        incremental = discovery.build_next()
        full = discovery.build()
        _same(incremental, full)
        # The file registry, updated from the store's events, holds what a build from scratch makes.
        model, scratch = files.model(), build_file_model(store.configs.values())
        assert model == scratch
        assert list(model.services) == list(scratch.services)  # in hostname order, as generators read them
        assert list(model.endpoints) == list(scratch.endpoints)
        # ... and the same digests, though a patched model sums them from the model before.
        assert model.digest() == scratch.digest()
        assert model.digest(definitions=True) == scratch.digest(definitions=True)
        assert model.identities_digest() == scratch.identities_digest()
        # The server's cache on the updated snapshot serves what `generate` makes from scratch,
        # to nodes resolved as the servicer resolves them (a binding kept where its inputs are).
        for node in nodes:
            served = cache.resolve(node, incremental).resources
            expected = generate(full, bind_proxy(node, full))
            for type_url, messages in expected.items():
                got = served.of(type_url)
                assert sorted(got) == sorted(_name(m) for m in messages), (node.id, type_url)
                for message in messages:
                    body = message.SerializeToString(deterministic=True)
                    assert got[_name(message)].body.endswith(body), (node.id, type_url)


def _name(message: object) -> str:
    from meshctl.xds.names import resource_name

    return resource_name(message)  # type: ignore[arg-type]


def test_a_model_carries_over_digests_of_what_it_kept_and_only_those() -> None:
    configs = configs_from_yaml(
        _service_entry("a", "ns1", 8080)
        + "---"
        + _workload("a-0", "ns1", "a", "10.0.0.1")
        + "---"
        + _service_entry("b", "ns1", 8080)
    )
    first = build_file_model(configs)
    digests = {h: first.endpoints_digest(h) for h in first.services}
    kept = make_model(first.services.values(), dict(first.endpoints), previous=[first])
    assert kept.endpoints["a.ns1.mesh"] is first.endpoints["a.ns1.mesh"]
    assert kept._endpoint_digests == digests  # carried over, not computed
    # Endpoints that changed are hashed again, and differ.
    moved = configs_from_yaml(_workload("a-0", "ns1", "a", "10.0.0.2"))
    second = build_file_model([c for c in configs if c.kind != "WorkloadEntry"] + moved)
    changed = make_model(second.services.values(), dict(second.endpoints), previous=[first])
    assert "a.ns1.mesh" not in changed._endpoint_digests
    assert changed.endpoints_digest("a.ns1.mesh") != digests["a.ns1.mesh"]


def test_the_store_says_which_keys_changed_since_a_revision() -> None:
    store = ConfigStore()
    a = configs_from_yaml(_route("a", "ns1", 1))
    b = configs_from_yaml(_route("b", "ns1", 1))
    store.replace_all(a)
    first = store.revision
    store.replace_all(a + b)
    store.replace_all(configs_from_yaml(_route("a", "ns1", 2)) + b)
    view, changed = store.changed_since(first)
    assert view.revision == first + 2
    assert changed == {a[0].key, b[0].key}
    assert store.changed_since(view.revision)[1] == frozenset()
    assert store.changed_since(-5)[1] is None  # further back than remembered: everything


def test_a_file_change_is_built_without_a_second_quiet_period() -> None:
    """The watcher waited for the files to settle; Discovery builds at once for their changes,
    and waits its quiet period for other inputs (a Consul burst)."""

    async def scenario() -> tuple[float, float]:
        store = ConfigStore()
        files = FileRegistry()
        files.follow(store)
        built: list[float] = []

        async def publish(_snapshot: Snapshot, _seen: float) -> None:
            built.append(loop.time())

        from meshctl.server.discovery import DebounceSettings

        loop = asyncio.get_running_loop()
        discovery = Discovery(store, AggregateRegistry([files]), publish, debounce=DebounceSettings(quiet=2.0))
        await discovery.start()
        started = loop.time()
        await loop.run_in_executor(None, store.replace_all, configs_from_yaml(_route("a", "ns1", 1)))
        while not built:
            await asyncio.sleep(0.01)
        settled = built[-1] - started
        started = loop.time()
        discovery.set_mesh(discovery._mesh)  # an input that did not wait: a quiet period first
        discovery.set_mesh(type(discovery._mesh)(connect_timeout_seconds=3.0))
        while len(built) < 2:
            await asyncio.sleep(0.01)
        unsettled = built[-1] - started
        await discovery.stop()
        return settled, unsettled

    settled, unsettled = asyncio.run(scenario())
    assert settled < 1.0  # no quiet period (2 s) waited
    assert unsettled >= 2.0


def test_a_build_that_changed_nothing_leaves_the_next_its_index_to_update() -> None:
    """Two inputs telling of one edit (the store and the registry) make a second build that
    changes nothing, which the server drops unindexed; the build after it still updates the
    last index: a new service is tested against each scope alone, not the mesh again, and the
    scopes' VirtualServices are kept."""
    tree = Tree()
    tree.apply(("route", "b", "ns1", 1))
    store, discovery = file_discovery()
    cache = ResourceCache()
    node = parse_node_id("sidecar~10.1.0.1~a-0.ns1~ns1.svc.cluster.local")
    store.replace_all(tree.configs())
    first = discovery.build_next()
    cache.resources(first, bind_proxy(node, first))
    assert discovery.build_next().version == first.version  # nothing changed: never indexed
    tree.docs[("entry", "new", "ns1")] = _service_entry("new", "ns1", 8080)
    store.replace_all(tree.configs())
    after = discovery.build_next()
    cache.resources(after, bind_proxy(node, after))
    # The new service alone: not every service again, nor the VirtualService, whose hosts
    # resolve as before.
    assert after.index.visibility_tests == 1
    _same(after, discovery.build())
