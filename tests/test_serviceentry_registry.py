"""ServiceEntry/WorkloadEntry/WorkloadGroup YAML to services and endpoints, rule by rule as istiod
converts them, and the file registry's change events."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.api.networking.v1alpha3.service_entry_pb2 import ServiceEntry, ServicePort
from meshctl.api.networking.v1alpha3.workload_entry_pb2 import WorkloadEntry
from meshctl.config.labels import labels_match
from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.model import Config, ConfigKey
from meshctl.config.store import ConfigStore
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import (
    Endpoint,
    Location,
    Protocol,
    RegistryChange,
    Resolution,
    ServiceModel,
    TlsMode,
    diff_models,
    patched_hosts,
)
from meshctl.registry.serviceentry import build_file_model


def load(text: str, *, validate: bool = True) -> list[Config]:
    result = load_text(text, "<test>", LoadOptions(validate=validate))
    assert result.ok, [str(f) for f in result.findings]
    return list(result.configs)


def model_of(text: str, *, validate: bool = True) -> ServiceModel:
    return build_file_model(load(text, validate=validate))


def se(
    name: str = "reviews",
    namespace: str = "shop",
    *,
    hosts: str = "[reviews.shop.mesh]",
    ports: str = "[{number: 9080, name: http, protocol: HTTP}]",
    resolution: str = "STATIC",
    extra: str = "",
) -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  hosts: {hosts}
  ports: {ports}
  resolution: {resolution}
{extra}"""


def we(name: str, address: str, labels: str, namespace: str = "shop", *, spec: str = "", meta: str = "") -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: {namespace}
{meta}spec:
  address: {address}
  labels: {labels}
{spec}"""


SELECT_REVIEWS = "  workloadSelector: {labels: {app: reviews}}\n"


def addresses(model: ServiceModel, host: str) -> list[str]:
    return [e.address for e in model.endpoints_of(host)]


def only_endpoint(model: ServiceModel, host: str) -> Endpoint:
    (endpoint,) = model.endpoints_of(host)
    return endpoint


# -- services -----------------------------------------------------------------------------------


def test_one_service_per_host_in_the_service_entrys_namespace() -> None:
    model = model_of(se(hosts="[reviews.shop.mesh, reviews.shop.internal]"))
    assert sorted(model.services) == ["reviews.shop.internal", "reviews.shop.mesh"]
    for service in model.services.values():
        assert service.namespace == "shop"
        assert service.origin == "ServiceEntry shop/reviews"
        assert service.registry == "files"
        assert [(p.name, p.number, p.protocol) for p in service.ports] == [("http", 9080, Protocol.HTTP)]


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("HTTP", Protocol.HTTP),
        ("http", Protocol.HTTP),
        ("HTTP2", Protocol.HTTP2),
        ("GRPC", Protocol.GRPC),
        ("GRPC-Web", Protocol.GRPC_WEB),
        ("HTTPS", Protocol.HTTPS),
        ("TLS", Protocol.TLS),
        ("TCP", Protocol.TCP),
        ("Mongo", Protocol.MONGO),
        ("Redis", Protocol.REDIS),
        ("MySQL", Protocol.MYSQL),
    ],
)
def test_protocol_from_the_protocol_field(written: str, expected: Protocol) -> None:
    model = model_of(se(ports=f"[{{number: 8000, name: port, protocol: {written}}}]"))
    assert model.services["reviews.shop.mesh"].ports[0].protocol is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("http", Protocol.HTTP),
        ("http-api", Protocol.HTTP),
        ("http2-api", Protocol.HTTP2),
        ("grpc-api", Protocol.GRPC),
        ("grpc-web-ui", Protocol.GRPC_WEB),
        ("tcp-db", Protocol.TCP),
        ("tls-passthrough", Protocol.TLS),
        ("https-admin", Protocol.HTTPS),
        ("mongo-main", Protocol.MONGO),
        ("redis-cache", Protocol.REDIS),
        ("mysql-primary", Protocol.MYSQL),
        ("admin", Protocol.UNSUPPORTED),
    ],
)
def test_protocol_from_the_port_name_when_the_field_is_empty(name: str, expected: Protocol) -> None:
    model = model_of(se(ports=f"[{{number: 8000, name: {name}}}]"))
    assert model.services["reviews.shop.mesh"].ports[0].protocol is expected


def test_protocol_field_wins_over_the_port_name() -> None:
    model = model_of(se(ports="[{number: 8000, name: http-api, protocol: TCP}]"))
    assert model.services["reviews.shop.mesh"].ports[0].protocol is Protocol.TCP


@pytest.mark.parametrize("resolution", ["STATIC", "DNS", "DNS_ROUND_ROBIN", "NONE"])
def test_each_resolution(resolution: str) -> None:
    model = model_of(se(resolution=resolution))
    assert model.services["reviews.shop.mesh"].resolution is Resolution(resolution)


def test_unset_resolution_and_location_are_istios_defaults() -> None:
    text = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
"""
    service = model_of(text).services["api.example.com"]
    assert service.resolution is Resolution.NONE
    assert service.location is Location.MESH_EXTERNAL


def test_location() -> None:
    model = model_of(se(extra="  location: MESH_INTERNAL\n"))
    assert model.services["reviews.shop.mesh"].location is Location.MESH_INTERNAL


def test_empty_export_to_takes_the_mesh_default_public_unless_said() -> None:
    service = model_of(se()).services["reviews.shop.mesh"]
    assert service.export_to == frozenset()  # unset: MeshConfig's defaultServiceExportTo decides
    assert service.visible_from("anywhere")
    assert service.visible_from("shop", frozenset({"."}))
    assert not service.visible_from("anywhere", frozenset({"."}))


def test_export_to_limits_visibility() -> None:
    service = model_of(se(extra='  exportTo: [".", "frontend"]\n')).services["reviews.shop.mesh"]
    assert service.export_to == frozenset({".", "frontend"})
    assert service.visible_from("shop")
    assert service.visible_from("frontend")
    assert not service.visible_from("billing")


def test_addresses_with_single_address_cidrs_as_plain_addresses() -> None:
    text = se(extra="  addresses: [240.0.0.10, 10.20.0.0/16, 10.30.0.7/32]\n")
    service = model_of(text).services["reviews.shop.mesh"]
    assert service.addresses == ("240.0.0.10", "10.20.0.0/16", "10.30.0.7")


# -- endpoints ----------------------------------------------------------------------------------


def test_inline_endpoints() -> None:
    extra = """  endpoints:
  - address: 10.0.0.1
    labels: {version: v1}
    weight: 3
    locality: eu-west/zone-a
    network: vpc-1
    serviceAccount: reviews
  - address: 10.0.0.2
"""
    model = model_of(se(extra=extra))
    first, second = model.endpoints_of("reviews.shop.mesh")
    assert (first.address, dict(first.ports), dict(first.labels)) == ("10.0.0.1", {9080: 9080}, {"version": "v1"})
    assert (first.weight, first.locality, first.network, first.service_account) == (
        3,
        "eu-west/zone-a",
        "vpc-1",
        "reviews",
    )
    assert (first.name, first.namespace) == ("", "shop")
    assert second.address == "10.0.0.2"
    assert (second.weight, second.locality, second.service_account) == (0, "", "")


def test_selector_picks_matching_workload_entries_of_the_same_namespace() -> None:
    text = (
        se(extra=SELECT_REVIEWS)
        + we("reviews-v1", "10.0.0.1", "{app: reviews, version: v1}")
        + we("reviews-v2", "10.0.0.2", "{app: reviews, version: v2}")
        + we("ratings", "10.0.0.3", "{app: ratings}")
        + we("reviews-elsewhere", "10.9.0.1", "{app: reviews}", namespace="other")
    )
    model = model_of(text)
    assert addresses(model, "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]
    v1 = model.endpoints_of("reviews.shop.mesh")[0]
    assert (v1.name, v1.namespace) == ("reviews-v1", "shop")
    assert dict(v1.labels) == {"app": "reviews", "version": "v1"}


def test_selector_matches_metadata_labels_too_and_metadata_wins() -> None:
    meta = "  labels: {app: reviews, version: v2}\n"
    text = se(extra=SELECT_REVIEWS) + we("reviews-a", "10.0.0.1", "{version: v1, zone: a}", meta=meta)
    endpoint = only_endpoint(model_of(text), "reviews.shop.mesh")
    assert dict(endpoint.labels) == {"app": "reviews", "version": "v2", "zone": "a"}


def test_selector_wins_over_inline_endpoints() -> None:
    # Validation rejects the pair; a file loaded without validation still gets Istio's behaviour.
    extra = SELECT_REVIEWS + "  endpoints: [{address: 10.0.0.99}]\n"
    text = se(extra=extra) + we("reviews-v1", "10.0.0.1", "{app: reviews}")
    assert addresses(model_of(text, validate=False), "reviews.shop.mesh") == ["10.0.0.1"]


def test_endpoint_port_precedence_workload_entry_port_then_target_port_then_number() -> None:
    ports = "[{number: 9080, name: http, protocol: HTTP, targetPort: 8080}, {number: 9090, name: grpc, protocol: GRPC}]"
    text = (
        se(ports=ports, extra=SELECT_REVIEWS)
        + we("own-ports", "10.0.0.1", "{app: reviews}", spec="  ports: {http: 7070, grpc: 7071}\n")
        + we("no-ports", "10.0.0.2", "{app: reviews}")
        + we("other-port-name", "10.0.0.3", "{app: reviews}", spec="  ports: {admin: 7000}\n")
    )
    by_address = {e.address: dict(e.ports) for e in model_of(text).endpoints_of("reviews.shop.mesh")}
    assert by_address == {
        "10.0.0.1": {9080: 7070, 9090: 7071},
        "10.0.0.2": {9080: 8080, 9090: 9090},
        "10.0.0.3": {9080: 8080, 9090: 9090},
    }


def test_workload_entry_fields_reach_the_endpoint() -> None:
    spec = "  weight: 5\n  locality: us-east/zone-b/rack-1\n  network: dc-2\n  serviceAccount: reviews-sa\n"
    text = se(extra=SELECT_REVIEWS) + we("reviews-v1", "10.0.0.1", "{app: reviews}", spec=spec)
    endpoint = only_endpoint(model_of(text), "reviews.shop.mesh")
    assert endpoint.weight == 5
    assert endpoint.locality == "us-east/zone-b/rack-1"
    assert endpoint.network == "dc-2"
    assert endpoint.service_account == "reviews-sa"


def test_locality_and_network_from_labels_when_the_fields_are_empty() -> None:
    labels = '{app: reviews, istio-locality: us-east.zone-b, "topology.istio.io/network": dc-3}'
    text = se(extra=SELECT_REVIEWS) + we("reviews-v1", "10.0.0.1", labels)
    endpoint = only_endpoint(model_of(text), "reviews.shop.mesh")
    assert (endpoint.locality, endpoint.network) == ("us-east/zone-b", "dc-3")


def test_endpoints_are_healthy_and_tls_mode_comes_from_the_label_only() -> None:
    text = (
        se(extra=SELECT_REVIEWS)
        + we("mtls", "10.0.0.1", '{app: reviews, "security.istio.io/tlsMode": istio}')
        + we("plain", "10.0.0.2", "{app: reviews}", spec="  serviceAccount: reviews\n")
    )
    first, second = model_of(text).endpoints_of("reviews.shop.mesh")
    assert first.tls_mode is TlsMode.ISTIO
    assert second.tls_mode is TlsMode.DISABLED
    assert {first.health.value, second.health.value} == {"HEALTHY"}


@pytest.mark.parametrize("resolution", ["DNS", "DNS_ROUND_ROBIN"])
def test_dns_without_endpoints_uses_the_host_itself(resolution: str) -> None:
    ports = "[{number: 443, name: tls, protocol: TLS}, {number: 80, name: http, protocol: HTTP, targetPort: 8080}]"
    model = model_of(se(hosts="[api.example.com, api2.example.com]", ports=ports, resolution=resolution))
    for host in ("api.example.com", "api2.example.com"):
        endpoint = only_endpoint(model, host)
        assert endpoint.address == host
        assert dict(endpoint.ports) == {443: 443, 80: 8080}
        assert endpoint.tls_mode is TlsMode.DISABLED


@pytest.mark.parametrize("resolution", ["STATIC", "NONE"])
def test_no_endpoints_without_dns(resolution: str) -> None:
    assert model_of(se(resolution=resolution)).endpoints_of("reviews.shop.mesh") == ()


def test_dns_with_a_selector_that_matches_nothing_has_no_endpoints() -> None:
    assert model_of(se(resolution="DNS", extra=SELECT_REVIEWS)).endpoints_of("reviews.shop.mesh") == ()


def test_hostname_workload_entries_serve_only_dns_services() -> None:
    text = (
        se("by-dns", hosts="[reviews-dns.shop.mesh]", resolution="DNS", extra=SELECT_REVIEWS)
        + se("static", hosts="[reviews.shop.mesh]", extra=SELECT_REVIEWS)
        + we("vm-by-name", "vm1.shop.internal", "{app: reviews}")
        + we("vm-by-ip", "10.0.0.1", "{app: reviews}")
    )
    model = model_of(text)
    assert addresses(model, "reviews-dns.shop.mesh") == ["10.0.0.1", "vm1.shop.internal"]
    assert addresses(model, "reviews.shop.mesh") == ["10.0.0.1"]


def test_unix_socket_workload_entries_have_no_port_and_serve_only_dns_services() -> None:
    text = (
        se("by-dns", hosts="[local-dns.shop.mesh]", resolution="DNS", extra=SELECT_REVIEWS)
        + se("static", hosts="[local.shop.mesh]", extra=SELECT_REVIEWS)
        + we("on-this-host", "unix:///var/run/reviews.sock", "{app: reviews}")
    )
    model = model_of(text)
    endpoint = only_endpoint(model, "local-dns.shop.mesh")
    assert (endpoint.address, dict(endpoint.ports)) == ("/var/run/reviews.sock", {9080: 0})
    assert model.endpoints_of("local.shop.mesh") == ()


def test_a_host_defined_twice_belongs_to_the_first_service_entry_by_namespace_and_name() -> None:
    text = (
        se("zeta", "alpha", hosts="[shared.example.com]", resolution="DNS", extra="  location: MESH_INTERNAL\n")
        + se("beta", "beta", hosts="[shared.example.com]", resolution="STATIC", extra=SELECT_REVIEWS)
        + we("reviews", "10.0.0.1", "{app: reviews}", namespace="beta")
    )
    model = model_of(text)
    service = model.services["shared.example.com"]
    assert (service.origin, service.resolution) == ("ServiceEntry alpha/zeta", Resolution.DNS)
    assert addresses(model, "shared.example.com") == ["shared.example.com"]
    (note,) = model.notes
    assert "shared.example.com" in note
    assert "ServiceEntry alpha/zeta" in note
    assert "ServiceEntry beta/beta" in note


GROUP = """---
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: reviews, namespace: shop}
spec:
  metadata:
    labels: {app: reviews, team: books}
  template:
    labels: {app: template-app, version: v1}
    serviceAccount: reviews-sa
    ports: {http: 8080}
    network: dc-1
"""

IN_GROUP = "  annotations: {istio.io/autoRegistrationGroup: reviews}\n"


def test_workload_group_template_fills_what_the_entry_leaves_unset() -> None:
    text = (
        se(extra=SELECT_REVIEWS)
        + GROUP
        + we("vm-1", "10.0.0.1", "{version: v2}", meta=IN_GROUP)
        + we("vm-2", "10.0.0.2", "{}", meta=IN_GROUP, spec="  serviceAccount: own-sa\n  network: dc-9\n")
    )
    vm1, vm2 = model_of(text).endpoints_of("reviews.shop.mesh")
    assert dict(vm1.labels) == {"app": "reviews", "team": "books", "version": "v2"}
    assert (vm1.service_account, vm1.network, dict(vm1.ports)) == ("reviews-sa", "dc-1", {9080: 8080})
    assert (vm2.service_account, vm2.network) == ("own-sa", "dc-9")
    assert dict(vm2.labels)["version"] == "v1"


def test_a_workload_entry_naming_a_missing_group_is_used_as_is_with_a_note() -> None:
    text = se(extra=SELECT_REVIEWS) + we("vm-1", "10.0.0.1", "{app: reviews}", meta=IN_GROUP)
    model = model_of(text)
    assert only_endpoint(model, "reviews.shop.mesh").service_account == ""
    (note,) = model.notes
    assert "WorkloadEntry shop/vm-1" in note
    assert "WorkloadGroup shop/reviews" in note


def test_a_group_in_another_namespace_does_not_apply() -> None:
    other_group = GROUP.replace("namespace: shop", "namespace: other")
    text = se(extra=SELECT_REVIEWS) + other_group + we("vm-1", "10.0.0.1", "{app: reviews}", meta=IN_GROUP)
    model = model_of(text)
    assert only_endpoint(model, "reviews.shop.mesh").service_account == ""
    assert len(model.notes) == 1


def test_the_model_does_not_depend_on_config_order() -> None:
    configs = load(
        se(extra=SELECT_REVIEWS)
        + se("b", hosts="[reviews.shop.mesh]")
        + we("vm-1", "10.0.0.1", "{app: reviews}")
        + we("vm-2", "10.0.0.2", "{app: reviews}")
    )
    forward, backward = build_file_model(configs), build_file_model(reversed(configs))
    assert forward == backward
    assert forward.digest() == backward.digest()


# -- workload selectors ------------------------------------------------------------------------


def selecting(labels: str) -> str:
    return f"  workloadSelector: {{labels: {labels}}}\n"


def test_a_selector_with_several_labels_takes_only_workload_entries_with_all_of_them() -> None:
    text = (
        se(extra=selecting("{app: reviews, version: v2, track: stable}"))
        + we("all-three", "10.0.0.1", "{app: reviews, version: v2, track: stable, zone: a}")
        + we("no-track", "10.0.0.2", "{app: reviews, version: v2}")
        + we("no-app", "10.0.0.3", "{version: v2, track: stable}")
        + we("other-version", "10.0.0.4", "{app: reviews, version: v1, track: stable}")
        + we("only-track", "10.0.0.5", "{track: stable}")
    )
    assert addresses(model_of(text), "reviews.shop.mesh") == ["10.0.0.1"]


def test_the_rarest_label_alone_does_not_select() -> None:
    # `track: canary` is on one entry of the namespace, `app: reviews` on many: the entry with the
    # rare label still needs the common one, and one in another namespace with both is not ours.
    text = (
        se(extra=selecting("{app: reviews, track: canary}"))
        + "".join(we(f"reviews-{i}", f"10.0.1.{i}", "{app: reviews}") for i in range(1, 6))
        + we("ratings-canary", "10.0.2.1", "{app: ratings, track: canary}")
        + we("reviews-canary", "10.9.0.1", "{app: reviews, track: canary}", namespace="other")
    )
    model = model_of(text)
    assert model.endpoints_of("reviews.shop.mesh") == ()
    text += we("reviews-canary", "10.0.3.1", "{app: reviews, track: canary}")
    assert addresses(model_of(text), "reviews.shop.mesh") == ["10.0.3.1"]


def test_workload_entries_of_other_namespaces_are_never_selected() -> None:
    labels = "{app: reviews, version: v1}"
    text = (
        se(extra=selecting(labels))
        + se("reviews", "other", hosts="[reviews.other.mesh]", extra=selecting(labels))
        + we("vm", "10.0.0.1", labels)
        + we("vm", "10.1.0.1", labels, namespace="other")
        + we("vm", "10.2.0.1", labels, namespace="third")
    )
    model = model_of(text)
    assert addresses(model, "reviews.shop.mesh") == ["10.0.0.1"]
    assert addresses(model, "reviews.other.mesh") == ["10.1.0.1"]


def test_a_workload_entry_can_serve_several_service_entries() -> None:
    text = (
        se(extra=selecting("{app: reviews}"))
        + se("v2", hosts="[reviews-v2.shop.mesh, reviews-next.shop.mesh]", extra=selecting("{version: v2}"))
        + we("reviews-v1", "10.0.0.1", "{app: reviews, version: v1}")
        + we("reviews-v2", "10.0.0.2", "{app: reviews, version: v2}")
    )
    model = model_of(text)
    assert addresses(model, "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]
    assert addresses(model, "reviews-v2.shop.mesh") == ["10.0.0.2"]
    assert addresses(model, "reviews-next.shop.mesh") == ["10.0.0.2"]


@pytest.mark.parametrize(
    "labels",
    ["{app: Reviews}", "{app: reviews-v1}", "{app: review}", "{app: ''}", "{application: reviews}", "{}"],
)
def test_a_label_value_must_be_equal_to_be_selected(labels: str) -> None:
    text = se(extra=SELECT_REVIEWS) + we("near-miss", "10.0.0.1", labels)
    assert model_of(text).endpoints_of("reviews.shop.mesh") == ()


def test_an_empty_label_value_is_selected_by_an_empty_value_only() -> None:
    text = (
        se(extra=selecting("{app: ''}"))
        + we("empty", "10.0.0.1", "{app: ''}")
        + we("unset", "10.0.0.2", "{tier: web}")
        + we("set", "10.0.0.3", "{app: reviews}")
    )
    assert addresses(model_of(text), "reviews.shop.mesh") == ["10.0.0.1"]


@pytest.mark.parametrize("selector", ["{}", "{labels: {}}"])
def test_a_selector_without_labels_takes_every_workload_entry_of_the_namespace(selector: str) -> None:
    text = (
        se(extra=f"  workloadSelector: {selector}\n")
        + we("bare", "10.0.0.1", "{}")
        + we("labelled", "10.0.0.2", "{app: ratings}")
        + we("elsewhere", "10.1.0.1", "{}", namespace="other")
    )
    assert addresses(model_of(text), "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]


def test_selected_endpoints_are_ordered_by_address_whatever_the_names_and_config_order() -> None:
    # Names run the other way from addresses, so an order taken from names or files would show.
    vms = [we(f"vm-{9 - i}", f"10.0.0.{i + 1}", "{app: reviews}") for i in range(8)]
    configs = load(se(extra=SELECT_REVIEWS) + "".join(vms))
    expected = [f"10.0.0.{i + 1}" for i in range(8)]
    for order in (configs, configs[::-1], configs[1::2] + configs[::2]):
        model = build_file_model(order)
        assert addresses(model, "reviews.shop.mesh") == expected
        assert model == build_file_model(configs)


def workload_entry_config(
    namespace: str, name: str, address: str, spec_labels: dict[str, str], meta_labels: dict[str, str]
) -> Config:
    spec = WorkloadEntry(address=address, labels=spec_labels)
    return Config(ConfigKey("WorkloadEntry", namespace, name), "networking.istio.io/v1", spec, labels=meta_labels)


NAMESPACES = ("shop", "other")
# Few keys and values, so that selectors often match, half match and share labels across namespaces.
label_maps = st.dictionaries(st.sampled_from(["app", "version", "zone"]), st.sampled_from(["a", "b", ""]), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    workloads=st.lists(st.tuples(st.sampled_from(NAMESPACES), label_maps, label_maps), max_size=25),
    selectors=st.lists(st.tuples(st.sampled_from(NAMESPACES), st.none() | label_maps), min_size=1, max_size=6),
)
def test_selection_is_labels_match_over_the_namespace(
    workloads: list[tuple[str, dict[str, str], dict[str, str]]],
    selectors: list[tuple[str, dict[str, str] | None]],
) -> None:
    configs = [
        workload_entry_config(namespace, f"vm-{i}", f"10.0.{i // 250}.{i % 250 + 1}", spec_labels, meta_labels)
        for i, (namespace, spec_labels, meta_labels) in enumerate(workloads)
    ]
    for i, (namespace, selector) in enumerate(selectors):
        entry = ServiceEntry(
            hosts=[f"s{i}.mesh"],
            ports=[ServicePort(number=80, name="http", protocol="HTTP")],
            resolution=ServiceEntry.Resolution.STATIC,
        )
        if selector is not None:
            entry.workload_selector.SetInParent()
            entry.workload_selector.labels.update(selector)
        configs.append(Config(ConfigKey("ServiceEntry", namespace, f"s{i}"), "networking.istio.io/v1", entry))

    model = build_file_model(configs)

    for i, (namespace, selector) in enumerate(selectors):
        expected = sorted(
            (c.spec.address, c.name)
            for c in configs[: len(workloads)]
            if selector is not None
            and c.namespace == namespace
            and labels_match(selector, {**c.spec.labels, **c.labels})
        )
        assert [(e.address, e.name) for e in model.endpoints_of(f"s{i}.mesh")] == expected


# -- the file registry --------------------------------------------------------------------------

REVIEWS = se(extra=SELECT_REVIEWS)
VM1 = we("vm-1", "10.0.0.1", "{app: reviews}")
VM2 = we("vm-2", "10.0.0.2", "{app: reviews}")
ROUTE = """---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.mesh]
  http: [{route: [{destination: {host: reviews.shop.mesh}}]}]
"""


def recording(registry: FileRegistry) -> list[RegistryChange]:
    events: list[RegistryChange] = []
    registry.subscribe(events.append)
    return events


def test_a_new_workload_entry_is_an_endpoint_only_change() -> None:
    registry = FileRegistry(load(REVIEWS + VM1))
    events = recording(registry)
    registry.replace(load(REVIEWS + VM1 + VM2))
    assert events == [RegistryChange(frozenset({"reviews.shop.mesh"}), endpoint_only=True, settled=True)]
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]


def test_a_service_entry_change_is_not_endpoint_only() -> None:
    registry = FileRegistry(load(REVIEWS + VM1))
    events = recording(registry)
    registry.replace(load(se(extra=SELECT_REVIEWS, ports="[{number: 9081, name: http, protocol: HTTP}]") + VM1))
    assert events == [RegistryChange(frozenset({"reviews.shop.mesh"}), endpoint_only=False, settled=True)]


def test_new_endpoints_of_a_dns_service_are_not_endpoint_only() -> None:
    # Envoy's DNS clusters carry their endpoints in CDS, so the cluster must be pushed again.
    dns = se(resolution="DNS", extra=SELECT_REVIEWS)
    registry = FileRegistry(load(dns + VM1))
    events = recording(registry)
    registry.replace(load(dns + VM1 + VM2))
    assert events == [RegistryChange(frozenset({"reviews.shop.mesh"}), endpoint_only=False, settled=True)]


def test_unrelated_or_unchanged_configs_publish_nothing() -> None:
    registry = FileRegistry(load(REVIEWS + VM1))
    events = recording(registry)
    assert registry.replace(load(REVIEWS + VM1 + ROUTE)) is None
    assert registry.replace(load(ROUTE + VM1 + REVIEWS)) is None
    # A WorkloadEntry that no selector picks changes no service.
    assert registry.replace(load(REVIEWS + VM1 + we("x", "10.0.0.9", "{app: x}"))) is None
    assert events == []


def test_apply_updates_and_deletes() -> None:
    registry = FileRegistry(load(REVIEWS + VM1 + VM2))
    events = recording(registry)
    registry.apply(deleted=[ConfigKey("WorkloadEntry", "shop", "vm-1")])
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.2"]
    registry.apply(updated=load(we("vm-2", "10.0.0.22", "{app: reviews}")))
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.22"]
    assert [e.endpoint_only for e in events] == [True, True]


def test_follows_a_config_store() -> None:
    store = ConfigStore()
    store.replace_all(load(REVIEWS + VM1))
    registry = FileRegistry()
    events = recording(registry)
    stop = registry.follow(store)
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.1"]
    assert events == [RegistryChange(frozenset({"reviews.shop.mesh"}), endpoint_only=False, settled=True)]

    store.replace_all(load(REVIEWS + VM1 + VM2))
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]
    store.replace_all(load(REVIEWS + VM1 + VM2 + ROUTE))  # not our kinds: no rebuild, no event
    assert len(events) == 2

    stop()
    store.replace_all(load(REVIEWS))
    assert addresses(registry.model(), "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]
    assert len(events) == 2


def test_status_counts_services_and_endpoints_and_shows_notes() -> None:
    registry = FileRegistry(load(REVIEWS + VM1 + VM2 + se("zz-dup", hosts="[reviews.shop.mesh]")))
    status = registry.status()
    assert (status.name, status.healthy, status.services, status.endpoints) == ("files", True, 1, 2)
    assert "reviews.shop.mesh" in status.message


# -- memory: what thousands of endpoints share ----------------------------------------------------


def test_endpoints_share_equal_labels_and_their_entrys_ports() -> None:
    ports = "[{number: 9080, name: http, protocol: HTTP, targetPort: 8080}]"
    text = (
        se(ports=ports, extra=SELECT_REVIEWS)
        + we("v1-a", "10.0.0.1", "{app: reviews, version: v1}")
        + we("v1-b", "10.0.0.2", "{version: v1, app: reviews}")
        + we("v2", "10.0.0.3", "{app: reviews, version: v2}")
        + we("own-port", "10.0.0.4", "{app: reviews, version: v1}", spec="  ports: {http: 7070}\n")
    )
    a, b, c, own = model_of(text).endpoints_of("reviews.shop.mesh")
    assert a.labels is b.labels is own.labels and dict(a.labels) == {"app": "reviews", "version": "v1"}
    assert c.labels is not a.labels and dict(c.labels) == {"app": "reviews", "version": "v2"}
    assert a.ports is b.ports is c.ports and dict(a.ports) == {9080: 8080}
    assert dict(own.ports) == {9080: 7070}


def test_label_strings_are_interned() -> None:
    text = se(extra=SELECT_REVIEWS) + we("vm-1", "10.0.0.1", "{app: reviews}")
    text += we("vm-2", "10.0.0.2", "{app: reviews, x: y}")
    first, second = model_of(text).endpoints_of("reviews.shop.mesh")
    (key_1, value_1), (key_2, value_2) = next(iter(first.labels.items())), next(iter(second.labels.items()))
    assert key_1 is key_2 and value_1 is value_2


def test_a_read_only_mapping_is_taken_as_is_and_empty_ones_are_one() -> None:
    labels = MappingProxyType({"app": "reviews"})
    assert Endpoint("10.0.0.1", {9080: 9080}, labels).labels is labels
    assert Endpoint("10.0.0.1", {}).ports is Endpoint("10.0.0.2", {}, {}).labels
    copied = Endpoint("10.0.0.1", {9080: 9080}, {"app": "reviews"}).labels
    assert isinstance(copied, MappingProxyType) and copied == {"app": "reviews"}


def test_a_service_entry_edit_is_applied_to_the_last_model_and_touches_its_hosts_only() -> None:
    store = ConfigStore()
    others = "".join(se(name=f"s{i}", hosts=f"[s{i}.shop.mesh]") for i in range(5))
    store.replace_all(load(REVIEWS + VM1 + others))
    registry = FileRegistry()
    events = recording(registry)
    registry.follow(store)
    before = registry.model()
    store.replace_all(load(REVIEWS + VM1 + others + se(name="added", hosts="[added.shop.mesh]")))
    after = registry.model()
    assert patched_hosts(before, after) == {"added.shop.mesh"}
    assert after.services["s0.shop.mesh"] is before.services["s0.shop.mesh"]
    assert events[-1] == RegistryChange(frozenset({"added.shop.mesh"}), endpoint_only=False, settled=True)
    assert after == build_file_model(store.configs.values())


def test_edits_in_a_row_name_their_hosts_against_a_model_several_edits_old() -> None:
    """A part last checked a few edits ago compares the hosts those edits touched, not the
    mesh: `patched_hosts` follows the chain of patches (up to eight), then knows nothing."""
    store = ConfigStore()
    others = "".join(se(name=f"s{i}", hosts=f"[s{i}.shop.mesh]") for i in range(5))
    store.replace_all(load(REVIEWS + VM1 + others))
    registry = FileRegistry()
    registry.follow(store)
    models = [registry.model()]
    added = ""
    for i in range(9):
        added += se(name=f"added-{i}", hosts=f"[added-{i}.shop.mesh]")
        store.replace_all(load(REVIEWS + VM1 + others + added))
        models.append(registry.model())
    assert patched_hosts(models[1], models[3]) == {"added-1.shop.mesh", "added-2.shop.mesh"}
    assert patched_hosts(models[1], models[9]) == {f"added-{i}.shop.mesh" for i in range(1, 9)}
    assert patched_hosts(models[0], models[9]) is None  # nine patches back: beyond the chain
    change = diff_models(models[2], models[7])
    assert change is not None and change.hosts == {f"added-{i}.shop.mesh" for i in range(2, 7)}
    assert models[9] == build_file_model(store.configs.values())


def test_a_host_defined_twice_by_an_edit_is_left_to_the_whole_build() -> None:
    store = ConfigStore()
    store.replace_all(load(REVIEWS + VM1))
    registry = FileRegistry()
    registry.follow(store)
    # A second entry for the same host, first by name: it wins, and a note names both.
    store.replace_all(load(REVIEWS + VM1 + se(name="a-reviews", hosts="[reviews.shop.mesh]")))
    model = registry.model()
    assert model == build_file_model(store.configs.values())
    assert model.services["reviews.shop.mesh"].origin == "ServiceEntry shop/a-reviews"
    assert model.notes


def test_health_checks_follow_workload_entries_edited_one_at_a_time() -> None:
    from meshctl.registry.health import HealthCheckedRegistry, HealthReports

    annotated = '  annotations: {proxy.istio.io/health-checks-enabled: "true"}\n'
    checked = we("vm-2", "10.0.0.2", "{app: reviews}", meta=annotated)
    store = ConfigStore()
    store.replace_all(load(REVIEWS + VM1))
    files = FileRegistry()
    health = HealthCheckedRegistry(files, HealthReports())
    files.follow(store)
    health.follow(store)
    assert dict(health.checks()) == {}
    store.replace_all(load(REVIEWS + VM1 + checked))  # WorkloadEntries alone: applied to the last build
    assert list(health.checks()) == [("shop", "vm-2")]
    assert health.checks()[("shop", "vm-2")].probe.ports == (9080,)
    store.replace_all(load(REVIEWS + VM1 + VM2))  # the annotation gone
    assert dict(health.checks()) == {}
    health.close()
