"""Generation failing for one proxy stops only that proxy: it keeps its last good config, every
other proxy gets the publication, a new stream of the same proxy still gets the last good
config, and the error names the proxy and the input that changed.

The failing input is crafted past validation (which refuses it): a DestinationRule of one
namespace whose TCP keepalive time does not fit Envoy's 32-bit seconds, which the generator
cannot even put into a Cluster. Anything validation lets through and a generator trips on takes
the same path.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from meshctl.api.networking.v1alpha3.destination_rule_pb2 import DestinationRule
from meshctl.config.model import Config, ConfigKey, Source
from meshctl.registry.serviceentry import build_file_model
from meshctl.server.cache import GenerationError, ResourceCache
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.builders import configs_from_yaml
from meshctl.testing.server import run, serving
from meshctl.xds import types

MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shared}
spec:
  hosts: [api.shared.example]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.0.1}]
"""
NEW_SERVICE = """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: shared}
spec:
  hosts: [billing.shared.example]
  ports: [{number: 9090, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.0.2}]
"""
NODE_A = "sidecar~10.0.0.1~client.team-a~team-a.svc.cluster.local"
NODE_A2 = "sidecar~10.0.0.2~client2.team-a~team-a.svc.cluster.local"
NODE_B = "sidecar~10.0.0.3~client.team-b~team-b.svc.cluster.local"
API = "outbound|8080||api.shared.example"
BILLING = "outbound|9090||billing.shared.example"


def bad_rule() -> Config:
    """A DestinationRule for team-a only, with a keepalive time Envoy (and the generator) cannot
    hold; built directly, as validation would refuse it."""
    spec = DestinationRule(host="api.shared.example", export_to=["."])
    spec.traffic_policy.connection_pool.tcp.tcp_keepalive.time.CopyFrom(duration_pb2.Duration(seconds=2**32))
    source = Source("team-a/keepalive.yaml", 3, 1)
    return Config(ConfigKey("DestinationRule", "team-a", "keepalive"), "networking.istio.io/v1", spec, source=source)


def snapshot(text: str, *extra: Config) -> Snapshot:
    configs = [*configs_from_yaml(text), *extra]
    return build_snapshot(configs, build_file_model(configs))


def test_one_proxy_failing_keeps_its_config_and_the_others_move_on(caplog: pytest.LogCaptureFixture) -> None:
    cache = ResourceCache()
    good = snapshot(MESH)
    before = {n: cache.resolve(parse_node_id(n), good).resources for n in (NODE_A, NODE_B)}
    broken = snapshot(MESH + NEW_SERVICE, bad_rule())
    with caplog.at_level(logging.ERROR, logger="meshctl.server.cache"):
        a = cache.resolve(parse_node_id(NODE_A), broken).resources
        b = cache.resolve(parse_node_id(NODE_B), broken).resources
        again = cache.resolve(parse_node_id(NODE_A2), broken).resources  # same key: a new stream
    assert a is before[NODE_A] and again is before[NODE_A]  # the last good config, as it was
    assert BILLING not in a.of(types.CLUSTER)
    assert b.snapshot_version == broken.version and BILLING in b.of(types.CLUSTER)
    assert cache.generation_failures == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # once per key and config version, not per stream
    assert NODE_A in errors[0] and "DestinationRule team-a/keepalive (team-a/keepalive.yaml:3:1)" in errors[0]
    assert "keeps its last good config" in errors[0]


def test_a_proxy_with_no_good_config_yet_gets_the_error() -> None:
    cache = ResourceCache()
    with pytest.raises(GenerationError, match=NODE_A.split("~")[2]):
        cache.resolve(parse_node_id(NODE_A), snapshot(MESH, bad_rule()))


@pytest.mark.slow
def test_through_the_server_the_other_proxies_get_the_next_publication(tmp_path: Path) -> None:
    """Over real ADS streams: the publication that team-a's proxies cannot take reaches team-b,
    team-a keeps what it had, and a team-a proxy that connects afterwards is served (the last
    good config), not refused."""
    (tmp_path / "mesh.yaml").write_text(MESH)

    async def test() -> None:
        async with serving(tmp_path) as server:
            address = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(address, NODE_A) as a, AdsClient(address, NODE_B) as b:
                for client in (a, b):
                    await client.wait_for(lambda c: c.complete() and API in c.names(types.CLUSTER))
                # As if the directory had produced it: the server's current snapshot, published
                # the way the server publishes one (the push history and rollout learn it first).
                broken = snapshot(MESH + NEW_SERVICE, bad_rule())
                server.discovery.snapshot = broken
                await server.delivery.published(broken)
                await server.ads.publish(broken)
                await b.wait_for(lambda c: BILLING in c.names(types.CLUSTER))
                assert API in a.names(types.CLUSTER) and BILLING not in a.names(types.CLUSTER)
                assert server.metrics.internal_errors.value() >= 1  # /metrics: pilot_total_xds_internal_errors
                async with AdsClient(address, NODE_A2) as late:
                    await late.wait_for(lambda c: c.complete() and API in c.names(types.CLUSTER))
                    assert BILLING not in late.names(types.CLUSTER)

    run(test)


def test_a_proxy_gone_for_a_while_has_no_last_good_config_kept() -> None:
    """Last good configs are kept for the proxies still asking, not for every key ever seen: a
    proxy that left, and comes back after the mesh moved on, is not handed an old config."""
    cache = ResourceCache()
    cache.resolve(parse_node_id(NODE_A), snapshot(MESH))
    for extra in (NEW_SERVICE, NEW_SERVICE.replace("billing", "ledger")):
        cache.resolve(parse_node_id(NODE_B), snapshot(MESH + extra))  # only team-b asks meanwhile
    with pytest.raises(GenerationError):
        cache.resolve(parse_node_id(NODE_A), snapshot(MESH + NEW_SERVICE, bad_rule()))
