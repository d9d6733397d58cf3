"""Which VirtualService routes a host for a sidecar, as Istio chooses it: wildcard hosts against a
Sidecar's egress imports, and the oldest of two VirtualServices for one host."""

from __future__ import annotations

import pytest

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import proxy_for, snapshot_from_yaml

CLIENT = "sidecar~10.0.0.99~client.shop~shop.svc.cluster.local"

SERVICES = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.2}]
"""


def vs(name: str, host: str, created: str | None = None) -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    return f"""
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: shop{stamp}}}
spec:
  hosts: ["{host}"]
  http: [{{route: [{{destination: {{host: ratings.shop.mesh}}}}]}}]
"""


SIDECAR = """
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./reviews.shop.mesh", "./ratings.shop.mesh"]}]
"""


def routing(yaml: str, host: str = "reviews.shop.mesh") -> str | None:
    snapshot = snapshot_from_yaml(yaml)
    found = ProxyScope(snapshot, proxy_for(snapshot, CLIENT)).virtual_service_for(host)
    return found.name if found is not None else None


def test_a_wildcard_virtual_service_applies_to_a_host_a_sidecar_imports() -> None:
    """Istio's `SidecarScope` `selectVirtualServices` matches hosts with `host.Name.Matches`,
    which is symmetric: `*.shop.mesh` is kept for an egress import of `reviews.shop.mesh`."""
    assert routing(SERVICES + vs("all", "*.shop.mesh")) == "all"  # no Sidecar: everything imported
    assert routing(SERVICES + vs("all", "*.shop.mesh") + SIDECAR) == "all"


def test_a_wildcard_virtual_service_of_another_namespace_is_not_imported() -> None:
    other = vs("all", "*.shop.mesh").replace("namespace: shop", "namespace: elsewhere")
    assert routing(SERVICES + other + SIDECAR) is None


@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        # Istio's sortConfigByCreationTime: the oldest wins...
        (("b-vs", "2024-01-01T00:00:00Z"), ("a-vs", "2024-06-01T00:00:00Z"), "b-vs"),
        (("a-vs", "2024-06-01T00:00:00Z"), ("b-vs", "2024-01-01T00:00:00Z"), "b-vs"),
        # ...one without a creation time is older than any that has one...
        (("b-vs", None), ("a-vs", "2024-01-01T00:00:00Z"), "b-vs"),
        # ...and at the same time, the first by name.
        (("b-vs", "2024-01-01T00:00:00Z"), ("a-vs", "2024-01-01T00:00:00Z"), "a-vs"),
        (("b-vs", None), ("a-vs", None), "a-vs"),
    ],
)
def test_of_two_virtual_services_for_one_host_the_oldest_routes_it(
    first: tuple[str, str | None], second: tuple[str, str | None], winner: str
) -> None:
    yaml = SERVICES + vs(first[0], "reviews.shop.mesh", first[1]) + vs(second[0], "reviews.shop.mesh", second[1])
    assert routing(yaml) == winner


def test_the_name_decides_before_the_namespace_on_a_tie() -> None:
    """sortConfigByCreationTime compares names before namespaces: `a` of namespace `zz` is older
    than `b` of namespace `shop` when neither has a creation time."""
    other_ns = vs("a-vs", "reviews.shop.mesh").replace("namespace: shop", "namespace: zz")
    assert routing(SERVICES + vs("b-vs", "reviews.shop.mesh") + other_ns) == "a-vs"


def test_a_creation_time_that_is_no_rfc3339_time_is_an_error() -> None:
    text = vs("x", "reviews.shop.mesh", "yesterday").lstrip("\n-")
    (finding,) = load_text(text, "t.yaml").findings
    assert finding.severity is Severity.ERROR and finding.field == "metadata.creationTimestamp"


def test_a_sidecar_egress_host_led_by_tilde_imports_every_namespace_but_that_one() -> None:
    """Istio's Sidecar egress `~NS/host`: the host from any namespace except NS."""
    other = SERVICES.replace("namespace: shop}", "namespace: other}").replace(".shop.mesh", ".other.mesh")
    sidecar = SIDECAR.replace('["./reviews.shop.mesh", "./ratings.shop.mesh"]', '["~other/*"]')
    snapshot = snapshot_from_yaml(SERVICES + "---\n" + other + sidecar)
    imported = {s.hostname for s in ProxyScope(snapshot, proxy_for(snapshot, CLIENT)).services}
    assert imported == {"reviews.shop.mesh", "ratings.shop.mesh"}
    assert load_text(sidecar, "sidecar.yaml").ok
