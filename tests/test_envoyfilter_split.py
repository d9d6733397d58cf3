"""EnvoyFilters are applied a part at a time by the server (`envoyfilter_parts`): each outbound
part once for every proxy that shares it, decoding only what a patch can touch. What a proxy is
sent must be what patching its whole config makes (`generate`, as `meshctl dump` prints it),
and the filters said to match nothing must be those `meshctl dump` names: over random filter sets
on the example mesh, for sidecars that share an outbound part and a gateway."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cache import MESH, SECOND_V1, assert_serves_what_generate_makes, node

from meshctl.server.cache import ResourceCache
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.envoyfilter_report import UnmatchedFilters
from meshctl.xds.generate import unpatched_config

GATEWAY = "router~10.10.0.2~ingressgateway-vm.bookinfo~bookinfo.svc.cluster.local"
#: (node id, envoy version, metadata): two replicas of reviews (one outbound part), others of
#: the namespace, one whose version and metadata proxy matches pick out, and the gateway.
PROXIES = (
    (node("reviews-v1-vm", "10.10.0.41"), "1.40.0", None),
    (node("reviews-v1-b", "10.10.0.44"), "1.40.0", None),
    (node("productpage-v1-vm", "10.10.0.11"), "1.39.1", {"ISTIO_VERSION": "1.99"}),
    (node("details-v1-vm", "10.10.0.21"), "1.40.0", None),
    (GATEWAY, "1.40.0", {"LABELS": {"istio": "ingressgateway"}}),
)
_FAULT = "{{name: envoy.filters.http.fault, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}}"  # noqa: E501
#: Patches by what they do, `{ctx}` the context: every kind of object, every operation the
#: server splits (MERGE, REMOVE, ADD per part and joined), names that exist and that do not, a
#: renaming MERGE (the joined config as one part), inbound clusters matched by their service.
PATCHES = (
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{service: ratings.bookinfo.mesh}}}},"
    " patch: {{operation: MERGE, value: {{connect_timeout: 7s}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{portNumber: 9080}}}},"
    " patch: {{operation: MERGE, value: {{per_connection_buffer_limit_bytes: 4321}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{service: reviews.bookinfo.mesh}}}},"
    " patch: {{operation: REMOVE}}",
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{name: 'outbound|9080||details.bookinfo.mesh'}}}},"
    " patch: {{operation: REMOVE}}",
    "applyTo: CLUSTER, match: {{context: {ctx}}}, patch: {{operation: ADD, value: {{name: added, type: STATIC,"
    " connect_timeout: 1s}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}}}, patch: {{operation: ADD, value: {{name: BlackHoleCluster,"
    " type: STATIC, connect_timeout: 2s}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{name: 'outbound|9080||details.bookinfo.mesh'}}}},"
    " patch: {{operation: MERGE, value: {{name: renamed}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}}}, patch: {{operation: ADD, value: {{name: 'inbound|9080||',"
    " type: STATIC, connect_timeout: 3s}}}}",
    "applyTo: CLUSTER, match: {{context: {ctx}, cluster: {{service: nowhere.example}}}},"
    " patch: {{operation: MERGE, value: {{connect_timeout: 9s}}}}",
    "applyTo: LISTENER, match: {{context: {ctx}, listener: {{portNumber: 9080}}}},"
    " patch: {{operation: MERGE, value: {{per_connection_buffer_limit_bytes: 1234}}}}",
    "applyTo: LISTENER, match: {{context: {ctx}, listener: {{portNumber: 15001}}}}, patch: {{operation: REMOVE}}",
    "applyTo: LISTENER, match: {{context: {ctx}}}, patch: {{operation: ADD, value: {{name: added,"
    " address: {{socket_address: {{address: 127.0.0.1, port_value: 15999}}}}}}}}",
    "applyTo: FILTER_CHAIN, match: {{context: {ctx}, listener: {{portNumber: 9080}}}},"
    " patch: {{operation: MERGE, value: {{name: patched-chain}}}}",
    "applyTo: HTTP_FILTER, match: {{context: {ctx}, listener: {{filterChain: {{filter: {{name:"
    " envoy.filters.network.http_connection_manager, subFilter: {{name: envoy.filters.http.router}}}}}}}}}},"
    " patch: {{operation: INSERT_BEFORE, value: " + _FAULT + "}}",
    "applyTo: HTTP_FILTER, match: {{context: {ctx}, listener: {{filterChain: {{filter: {{name:"
    " envoy.filters.network.http_connection_manager, subFilter: {{name: bookinfo.plugin}}}}}}}}}},"
    " patch: {{operation: REMOVE}}",
    "applyTo: ROUTE_CONFIGURATION, match: {{context: {ctx}, routeConfiguration: {{portNumber: 9080}}}},"
    " patch: {{operation: MERGE, value: {{max_direct_response_body_size_bytes: 2048}}}}",
    "applyTo: VIRTUAL_HOST, match: {{context: {ctx}}}, patch: {{operation: ADD, value: {{name: extra,"
    " domains: [extra.example]}}}}",
    "applyTo: HTTP_ROUTE, match: {{context: {ctx}, routeConfiguration: {{vhost: {{route: {{action: ROUTE}}}}}}}},"
    " patch: {{operation: MERGE, value: {{route: {{timeout: 3s}}}}}}",
)
CONTEXTS = ("ANY", "SIDECAR_OUTBOUND", "SIDECAR_INBOUND", "GATEWAY")
PROXY_MATCHES = ("", ", proxy: {{proxyVersion: '^1\\\\.40'}}", ", proxy: {{metadata: {{ISTIO_VERSION: '1.99'}}}}")
#: WasmPlugins, which the same stage places before the patches: none, everywhere, on inbound
#: traffic to one port, in network filter chains.
WASM = (
    "",
    "  phase: STATS\n",
    "  phase: AUTHN\n  match: [{mode: SERVER, ports: [{number: 9080}]}]\n",
    "  type: NETWORK\n",
)


def wasm_plugin(body: str) -> str:
    if not body:
        return ""
    return (
        "\n---\napiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\n"
        f"metadata: {{name: plugin, namespace: bookinfo}}\nspec:\n  url: file:///opt/wasm/p.wasm\n{body}"
    )


patch_st = st.tuples(st.sampled_from(PATCHES), st.sampled_from(CONTEXTS), st.sampled_from(PROXY_MATCHES))
filter_st = st.tuples(
    st.sampled_from(["istio-system", "bookinfo"]),
    st.sampled_from([-1, 0, 1]),
    st.sampled_from(["", "  workloadSelector: {labels: {app: reviews}}\n"]),
    st.lists(patch_st, min_size=1, max_size=3),
)


def envoy_filters(filters: list[tuple[str, int, str, list[tuple[str, str, str]]]]) -> str:
    out = []
    for n, (namespace, priority, selector, patches) in enumerate(filters):
        lines = []
        for template, context, proxy in patches:
            text = template.format(ctx=context)
            if proxy:
                text = text.replace("match: {", "match: {" + proxy.format()[2:] + ", ", 1)
            lines.append(f"  - {{{text}}}")
        out.append(
            f"---\napiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\n"
            f"metadata: {{name: f{n}, namespace: {namespace}}}\nspec:\n{selector}  priority: {priority}\n"
            "  configPatches:\n" + "\n".join(lines) + "\n"
        )
    return "\n".join(out)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filters=st.lists(filter_st, min_size=1, max_size=3), wasm=st.sampled_from(WASM))
def test_split_patching_sends_what_whole_patching_makes(
    filters: list[tuple[str, int, str, list[tuple[str, str, str]]]], wasm: str
) -> None:
    snapshot = snapshot_from_yaml(MESH + SECOND_V1 + wasm_plugin(wasm) + "\n" + envoy_filters(filters))
    cache = ResourceCache(strict=True)
    said = UnmatchedFilters()  # the report as `meshctl dump` makes it, on the whole config
    expected_lines = []
    lines = _Lines()
    logger = logging.getLogger("meshctl.server.cache")
    logger.addHandler(lines)
    try:
        for node_id, version, metadata in PROXIES:
            proxy = bind_proxy(parse_node_id(node_id, metadata, version), snapshot)
            view = cache.resources(snapshot, proxy)
            assert_serves_what_generate_makes(view, snapshot, proxy, node_id)
            expected_lines += said.new_messages(unpatched_config(snapshot, proxy), proxy)
    finally:
        logger.removeHandler(lines)
    assert [line for line in lines.lines if "matched anything" in line] == expected_lines


def test_proxies_that_share_an_outbound_part_share_its_patching() -> None:
    """A namespace's EnvoyFilter merging into the clusters of one service: three sidecars of the
    namespace with one outbound part and an inbound part each get their outbound part patched
    once, and of its resources only the clusters the patch matches are decoded."""
    text = envoy_filters([("bookinfo", 0, "", [(PATCHES[0], "SIDECAR_OUTBOUND", "")])])
    snapshot = snapshot_from_yaml(MESH + text)
    cache = ResourceCache()
    proxies = [bind_proxy(parse_node_id(n, m, v), snapshot) for n, v, m in (PROXIES[0], *PROXIES[2:4])]
    views = [cache.resources(snapshot, proxy) for proxy in proxies]
    assert cache.outbound_generations == 1  # one outbound part, three inbound parts
    ratings = [n for n in views[0].of(types.CLUSTER) if n.endswith("|ratings.bookinfo.mesh")]
    assert ratings and all(n in v.of(types.CLUSTER) for v in views for n in ratings)
    assert (cache.patched_parts, cache.patched_resources) == (4, len(ratings))
    for view, proxy in zip(views, proxies, strict=True):
        assert_serves_what_generate_makes(view, snapshot, proxy)
