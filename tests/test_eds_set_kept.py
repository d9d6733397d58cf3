"""An endpoint added to a service a scope sees: the scope's EDS set makes that service's
assignments alone and takes the others from the set it had, as the removal that takes the VM
back finds its set kept. Each step serves, byte for byte, what generation makes; the subsets of
the services not made again stay traced, so a DestinationRule that then moves one of their
subsets is seen."""

from __future__ import annotations

from test_incremental_build import _service_entry

from meshctl.server.cache import ResourceCache
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds.generate import generate
from meshctl.xds.resources import to_resource
from meshctl.xds.types import ENDPOINT

#: Services of each client namespace; every client also sees the shared namespace's service.
SERVICES = 20
CLIENTS = [f"sidecar~10.9.0.{i}~client.{ns}~{ns}.svc.cluster.local" for i, ns in enumerate(("a", "b"))]


def _vm(name: str, ns: str, j: int, version: str) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}-{j}, namespace: {ns}}}
spec: {{address: 10.{ord(ns[0])}.{len(name)}.{j}, labels: {{app: {name}, version: {version}}}}}
"""


def _subsets(name: str, ns: str, v1_is: str = "v1") -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: {name}, namespace: {ns}}}
spec:
  host: {name}.{ns}.mesh
  subsets:
  - {{name: v1, labels: {{version: {v1_is}}}}}
  - {{name: v2, labels: {{version: v2}}}}
"""


def _mesh(*, added: bool, moved: bool) -> str:
    docs = []
    for ns in ("a", "b"):
        docs.append(f"""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: {ns}}}
spec:
  egress: [{{hosts: ["./*", "shared/*"]}}]
""")
        for i in range(SERVICES):
            name = f"{ns}{i:03}"
            docs += [_service_entry(name, ns, 9080), _vm(name, ns, 1, "v1"), _vm(name, ns, 2, "v2")]
    docs += [_service_entry("web", "shared", 9080), _vm("web", "shared", 1, "v1"), _vm("web", "shared", 2, "v2")]
    docs += [_subsets("web", "shared"), _subsets("b001", "b", "v2" if moved else "v1")]
    if added:
        docs.append(_vm("web", "shared", 3, "v1"))
    return "---".join(docs)


def test_an_endpoint_added_makes_its_own_services_assignments_alone() -> None:
    cache = ResourceCache()
    steps = [
        ("start", _mesh(added=False, moved=False)),
        ("VM added to the shared service", _mesh(added=True, moved=False)),
        # b001's subset v1 now selects its v2 VM: b's set made at the step before must still
        # know the labels b001's subsets were assigned with, though it did not make them.
        ("b001's subset v1 moved", _mesh(added=True, moved=True)),
        ("the VM removed", _mesh(added=False, moved=True)),
    ]
    made = []
    for what, text in steps:
        snapshot = snapshot_from_yaml(text)
        before = cache.eds_set_members_made
        for client in CLIENTS:
            proxy = proxy_for(snapshot, client)
            view = cache.resources(snapshot, proxy)
            expected = sorted(
                (r.name, r.body) for r in (to_resource(m, ENDPOINT) for m in generate(snapshot, proxy)[ENDPOINT])
            )
            assert sorted((r.name, r.body) for r in view.of(ENDPOINT).values()) == expected, (what, client)
            assert len(expected) >= SERVICES + 3, (what, client)
        made.append(cache.eds_set_members_made - before)
    # Both sets whole at the start; b's again where b001's subsets moved (a's is kept); where
    # the shared service's VM came, its cluster and two subsets in each set; where it went, in
    # b's (a's is the set it had before the VM came, found again).
    assert made[0] >= 2 * SERVICES and made[2] >= SERVICES, made
    assert made[1] == 6 and made[3] == 3, made
