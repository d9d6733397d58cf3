"""The real-Envoy helpers fail on deprecated config, and on nothing else Envoy warns about.

Envoy accepts a field it deprecates and only logs a warning (on every push of the config), so
a test that checks only whether Envoy took a config would never notice meshctl generating one.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from conftest import needs_envoy

from meshctl.testing.envoy import (
    DeprecatedConfig,
    EnvoyError,
    EnvoyProcess,
    deprecation_warnings,
    free_port,
    validate_config,
)

#: Envoy 1.40's own words, as `--log-level warning` prints them.
LOG = """\
[2026-11-25 12:28:34.536][25820][warning][main] [source/server/server.cc:1059] There is no configured \
limit to the number of allowed active downstream connections. Configure a limit in \
`envoy.resource_monitors.downstream_connections` resource monitor.
[2026-11-25 12:28:34.536][25820][warning][misc] [source/common/protobuf/message_validator_impl.cc:23] \
Deprecated field: type envoy.config.route.v3.RouteAction Using deprecated option \
'envoy.config.route.v3.RouteAction.max_grpc_timeout' from file route_components.proto. This \
configuration will be removed from Envoy soon. Please see \
https://www.envoyproxy.io/docs/envoy/latest/version_history/version_history for details.
[2026-11-25 12:28:35.001][25821][warning][misc] [source/common/protobuf/message_validator_impl.cc:23] \
Deprecated field: type envoy.config.route.v3.RouteAction Using deprecated option \
'envoy.config.route.v3.RouteAction.max_grpc_timeout' from file route_components.proto. This \
configuration will be removed from Envoy soon.
[2026-11-25 12:28:36.000][25820][warning][config] [source/extensions/config_subscription/grpc/grpc_stream.h:193] \
StreamAggregatedResources gRPC config stream to xds-grpc closed: 14, upstream connect error
"""


def test_deprecation_warnings_are_read_once_without_boilerplate() -> None:
    assert deprecation_warnings(LOG) == [
        "Deprecated field: type envoy.config.route.v3.RouteAction Using deprecated option "
        "'envoy.config.route.v3.RouteAction.max_grpc_timeout' from file route_components.proto."
    ]
    assert deprecation_warnings(LOG.split("\n", 3)[0]) == [], "a start-up warning is no deprecation"


_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def config_with(action: dict[str, Any], port: int = 0) -> dict[str, Any]:
    """A listener routing everything to a static cluster with `action`'s extra route settings."""
    route = {"match": {"prefix": "/"}, "route": {"cluster": "c", **action}}
    hcm = {
        "@type": _HCM,
        "stat_prefix": "test",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    listener = {
        "name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "http", "typed_config": hcm}]}],
    }
    return {
        "node": {"id": "sidecar~127.0.0.1~test.default~default.svc.cluster.local", "cluster": "test"},
        "static_resources": {
            "clusters": [{"name": "c", "type": "STATIC", "connect_timeout": "1s"}],
            "listeners": [listener],
        },
    }


DEPRECATED = {"timeout": "1s", "max_grpc_timeout": "1s"}
CURRENT = {"timeout": "1s"}


@needs_envoy
def test_validate_config_fails_on_a_deprecated_field() -> None:
    validate_config(config_with(CURRENT))
    with pytest.raises(DeprecatedConfig, match=r"'envoy\.config\.route\.v3\.RouteAction\.max_grpc_timeout'"):
        validate_config(config_with(DEPRECATED))


@needs_envoy
def test_validate_config_still_reports_a_rejection_as_one() -> None:
    broken = copy.deepcopy(config_with(CURRENT))
    broken["static_resources"]["clusters"][0]["connect_timeout"] = "-1s"
    with pytest.raises(EnvoyError, match="rejected") as caught:
        validate_config(broken)
    assert not isinstance(caught.value, DeprecatedConfig)


@pytest.mark.e2e
@needs_envoy
def test_envoy_process_fails_on_leaving_when_its_log_warned() -> None:
    with EnvoyProcess(config_with(CURRENT)) as envoy:
        assert envoy.deprecations() == []
    # Raised on leaving the block, once Envoy has stopped.
    with pytest.raises(DeprecatedConfig, match="max_grpc_timeout"), EnvoyProcess(config_with(DEPRECATED)) as envoy:
        assert len(envoy.deprecations()) == 1


@pytest.mark.e2e
@needs_envoy
def test_envoy_process_reports_the_test_failure_rather_than_the_warning() -> None:
    with pytest.raises(ZeroDivisionError), EnvoyProcess(config_with(DEPRECATED)):
        1 / 0  # noqa: B018 - the failure the block leaves with


@pytest.mark.parametrize("count", [2, 3, 4])
def test_free_port_gives_each_xdist_worker_ports_no_other_worker_is_given(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """Workers of one pytest-xdist run each take ports from their own part of the range (one
    process stands in for them here: what it handed out is not what keeps them apart)."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    spans = []
    for index in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        ports = [free_port() for _ in range(30)]
        spans.append((min(ports), max(ports)))
    assert spans == sorted(spans)
    assert all(high < low for (_, high), (low, _) in itertools.pairwise(spans)), spans
