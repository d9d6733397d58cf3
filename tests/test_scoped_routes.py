"""A VirtualService change makes each scope look again at that VirtualService alone, and each
scope sees what it would see in a snapshot built from nothing."""

from __future__ import annotations

from dataclasses import replace

from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for

NAMESPACES = ("ns1", "ns2", "ns3")


def _mesh(timeout: int, *, gone: bool = False, extra: bool = False) -> str:
    docs = []
    for ns in NAMESPACES:
        docs.append(
            f"kind: Sidecar\napiVersion: networking.istio.io/v1\nmetadata: {{name: default, namespace: {ns}}}\n"
            f'spec: {{egress: [{{hosts: ["./*", "ns1/s0.ns1.mesh"]}}]}}\n'
        )
        for i in range(20):
            host = f"s{i}.{ns}.mesh"
            docs.append(
                "kind: ServiceEntry\napiVersion: networking.istio.io/v1\n"
                f"metadata: {{name: s{i}, namespace: {ns}}}\n"
                f"spec: {{hosts: [{host}], location: MESH_INTERNAL, resolution: STATIC,"
                f" ports: [{{number: 80, name: http, protocol: HTTP}}], endpoints: [{{address: 10.1.{i}.1}}]}}\n"
            )
            if gone and (ns, i) == ("ns2", 3):
                continue
            seconds = timeout if (ns, i) == ("ns1", 0) else 5
            docs.append(
                "kind: VirtualService\napiVersion: networking.istio.io/v1\n"
                f"metadata: {{name: s{i}, namespace: {ns}}}\n"
                f"spec: {{hosts: [{host}], http: [{{route: [{{destination: {{host: {host}}}}}],"
                f" timeout: {seconds}s}}]}}\n"
            )
    if extra:
        docs.append(
            "kind: VirtualService\napiVersion: networking.istio.io/v1\nmetadata: {name: extra, namespace: ns3}\n"
            "spec: {hosts: [s1.ns3.mesh], exportTo: ['.'], http: [{route: [{destination: {host: s1.ns3.mesh}}]}]}\n"
        )
    return "---\n".join(docs)


def _scopes(snapshot):  # type: ignore[no-untyped-def]
    return {
        ns: ProxyScope(snapshot, proxy_for(snapshot, f"sidecar~10.9.0.1~vm.{ns}~{ns}.svc.cluster.local"))
        for ns in NAMESPACES
    }


def _build(text: str, previous=None):  # type: ignore[no-untyped-def]
    configs = configs_from_yaml(text)
    if previous is None:
        return build_snapshot(configs, build_file_model(configs))
    old = {c.key: c for c in previous.by_kind.get("VirtualService", ())}
    changed = {
        c.key
        for c in configs
        if c.kind == "VirtualService"
        and ((o := old.pop(c.key, None)) is None or o.content_digest() != c.content_digest())
    } | set(old)
    # The unchanged configs are the very objects of the snapshot before, as the store keeps them.
    kept = {c.key: c for kind in previous.by_kind.values() for c in kind}
    configs = [kept.get(c.key, c) if c.key not in changed else c for c in configs]
    return build_snapshot(configs, previous.services, previous=previous, changed=changed)


def test_a_virtual_service_change_tests_only_the_changed_ones_and_agrees_with_a_full_build() -> None:
    first = _build(_mesh(5))
    for scope in _scopes(first).values():
        scope.virtual_services()
    assert first.index.visibility_tests == 3 * 60
    # (the next tree, how many of its VirtualServices are new or changed)
    for text, changed in ((_mesh(7), 1), (_mesh(7, gone=True), 0), (_mesh(7, gone=True, extra=True), 1)):
        nxt = _build(text, first)
        assert nxt.services is first.services
        scopes = _scopes(nxt)
        full = _scopes(_build(text))
        for ns in NAMESPACES:
            assert [vs.key for vs in scopes[ns].virtual_services()] == [vs.key for vs in full[ns].virtual_services()]
        # Each scope tested the changed VirtualServices (a removed one needs no test), not all.
        assert nxt.index.visibility_tests == 3 * changed
        first = nxt


def test_a_service_change_tests_only_the_changed_services_and_agrees_with_a_full_build() -> None:
    """A ServiceEntry added in a namespace no Sidecar imports: each scope tests it alone (the
    unchanged services are the same objects, as the file registry keeps them)."""
    from meshctl.registry.model import make_model

    text = _mesh(5)
    first = _build(text)
    for scope in _scopes(first).values():
        scope.services  # noqa: B018 (computed on first read)
    assert first.index.visibility_tests == 3 * 60
    added = (
        "kind: ServiceEntry\napiVersion: networking.istio.io/v1\nmetadata: {name: new, namespace: other}\n"
        "spec: {hosts: [new.other.mesh], location: MESH_INTERNAL, resolution: STATIC,"
        " ports: [{number: 80, name: http, protocol: HTTP}], endpoints: [{address: 10.2.0.1}]}\n"
    )
    configs = configs_from_yaml(text + "---\n" + added)
    fresh = build_file_model(configs)
    kept = {h: first.services.services.get(h) or s for h, s in fresh.services.items()}
    model = make_model(kept.values(), {h: first.services.endpoints.get(h, ()) for h in kept}, previous=[first.services])
    changed = {c.key for c in configs if c.kind == "ServiceEntry" and c.name == "new"}
    old = {c.key: c for kind in first.by_kind.values() for c in kind}
    # A snapshot between them where no scope asks (the server had its config generated already).
    same = make_model(first.services.services.values(), first.services.endpoints, previous=[first.services])
    between = build_snapshot(list(old.values()), same, previous=first, changed=set())
    assert between.index is not None  # built, as the server builds each snapshot's index
    nxt = build_snapshot([old.get(c.key, c) for c in configs], model, previous=between, changed=changed)
    full = _build(text + "---\n" + added)
    for ns, scope in _scopes(nxt).items():
        assert [s.hostname for s in scope.services] == [s.hostname for s in _scopes(full)[ns].services]
    assert nxt.index.visibility_tests == 3


def test_services_patched_into_the_model_are_all_a_scope_looks_at_and_it_agrees_with_a_full_build() -> None:
    """The file registry patches its model for an edit (`patch_model`): a scope's services are
    then its answer before with the hosts the patches touched tested again, not a pass over the
    mesh's hostnames; also two edits on (a snapshot between where no scope asked)."""
    from meshctl.registry.model import patch_model

    text = _mesh(5)
    first = _build(text)
    for scope in _scopes(first).values():
        scope.services  # noqa: B018 (computed on first read)
    old = {c.key: c for kind in first.by_kind.values() for c in kind}
    model = first.services
    s4 = model.services["s4.ns2.mesh"]
    edits = [
        # a new service of ns1, seen by ns1 alone (the others import s0.ns1.mesh of it)
        ({"n0.ns1.mesh": replace(s4, hostname="n0.ns1.mesh", namespace="ns1")}, {}),
        ({"s4.ns2.mesh": None}, {"s4.ns2.mesh": ()}),  # one gone
        ({"a.ns3.mesh": replace(s4, hostname="a.ns3.mesh", namespace="ns3")}, {}),  # one first by name
    ]
    previous = first
    for step, (services, endpoints) in enumerate(edits):
        model = patch_model(model, services, endpoints)
        nxt = build_snapshot(list(old.values()), model, previous=previous, changed=set())
        if step == 1:
            previous = nxt  # no scope asks at this snapshot: the next one looks two patches back
            continue
        full = build_snapshot(list(old.values()), model)
        for ns, scope in _scopes(nxt).items():
            assert [s.hostname for s in scope.services] == [s.hostname for s in _scopes(full)[ns].services]
        assert nxt.index.hosts_walked == 3 * (1 if step == 0 else 2)
        previous = nxt


def test_the_rules_hosts_were_found_to_have_stand_after_a_patch_that_did_not_touch_them() -> None:
    """Which DestinationRule applies to a host reads the rules and that host's service: after
    a patch of the model, a scope finds the other hosts' answers from before (and the patched
    host's anew), the same as a full build's."""
    from meshctl.registry.model import patch_model

    rule = (
        "kind: DestinationRule\napiVersion: networking.istio.io/v1\nmetadata: {name: all, namespace: ns2}\n"
        "spec: {host: '*.ns2.mesh', trafficPolicy: {loadBalancer: {simple: RANDOM}}}\n"
    )
    text = _mesh(5) + "---\n" + rule
    first = _build(text)
    hosts = ("s1.ns1.mesh", "s1.ns2.mesh", "s2.ns2.mesh")
    for host in hosts:
        _scopes(first)["ns1"].destination_rule(host)
    s2 = first.services.services["s2.ns2.mesh"]
    model = patch_model(first.services, {"s2.ns2.mesh": replace(s2, namespace="ns3")}, {})
    configs = [c for kind in first.by_kind.values() for c in kind]
    nxt = build_snapshot(configs, model, previous=first, changed=set())
    scope = _scopes(nxt)["ns1"]
    found = nxt.index.scoped("destination_rules", (scope.proxy.namespace, scope.proxy.label_pairs), dict)
    assert set(found) == {"s1.ns1.mesh", "s1.ns2.mesh"}  # carried; the patched host asked anew
    full = _scopes(build_snapshot(configs, model))["ns1"]
    for host in hosts:
        assert scope.destination_rule(host) == full.destination_rule(host), host
