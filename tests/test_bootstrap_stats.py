"""`meshctl bootstrap`'s stats settings, as Istio's bootstrap makes them (`stats_config` and
`deferred_stat_options` of tools/packaging/common/envoy_bootstrap.json, the inclusion list of
pkg/bootstrap/config.go). Envoy runs them in tests/test_bootstrap_envoy.py.
"""

from __future__ import annotations

import re

import pytest
from conftest import BOOTSTRAP_NODE, bootstrap, cli_bootstrap, runner

from meshctl.bootstrap import STATS_TAGS, StatsInclusion
from meshctl.cli.app import app

# -- stats -------------------------------------------------------------------------------------------


def test_stats_config_is_istios_tags_alone_and_stats_are_created_when_used() -> None:
    config = bootstrap()
    assert config["stats_config"] == {"use_all_default_tags": False, "stats_tags": [dict(t) for t in STATS_TAGS]}
    assert [t["tag_name"] for t in STATS_TAGS] == [
        "cluster_name",
        "http_conn_manager_prefix",
        "thread_name",
        "tcp_prefix",
        "response_code",
        "response_code_class",
        "http_conn_manager_listener_prefix",
        "listener_address",
        "mongo_prefix",
        "cache",
        "component",
        "tag",
        "wasm_filter",
        "authz_enforce_result",
        "authz_dry_run_action",
        "authz_dry_run_result",
    ]
    assert config["deferred_stat_options"] == {"enable_deferred_creation_stats": True}


def cluster_name_tag(stat: str) -> tuple[str, str] | None:
    """What Envoy makes of `stat` with the cluster_name extractor: (value, name left), or None.
    (Envoy's regex engine here is ECMAScript's; this one is in the part both read alike.)"""
    (tag,) = (t for t in STATS_TAGS if t["tag_name"] == "cluster_name")
    match = re.search(tag["regex"], stat)
    if match is None:
        return None
    return match.group(2), stat[: match.start(1)] + stat[match.end(1) :]


@pytest.mark.parametrize(
    ("stat", "tagged"),
    [
        # Istio's `;`-ended names (alt_stat_name NAME;): the whole name, dots and all.
        (
            "cluster.outbound|9080|v1|reviews.bookinfo.mesh;.upstream_rq_total",
            ("outbound|9080|v1|reviews.bookinfo.mesh", "cluster.upstream_rq_total"),
        ),
        (
            "cluster.outbound|9080||reviews.bookinfo.mesh;.circuit_breakers.default.rq_open",
            ("outbound|9080||reviews.bookinfo.mesh", "cluster.circuit_breakers.default.rq_open"),
        ),
        ("cluster.inbound|8080||;.upstream_cx_active", ("inbound|8080||", "cluster.upstream_cx_active")),
        ("cluster.BlackHoleCluster;.upstream_cx_total", ("BlackHoleCluster", "cluster.upstream_cx_total")),
        # This bootstrap's own clusters keep their plain names.
        ("cluster.xds-grpc.upstream_cx_active", ("xds-grpc", "cluster.upstream_cx_active")),
        ("cluster.prometheus_stats.upstream_rq_200", ("prometheus_stats", "cluster.upstream_rq_200")),
        ("cluster.envoy_ready.upstream_rq_total", ("envoy_ready", "cluster.upstream_rq_total")),
        # A name without the delimiter has no end to find: not tagged rather than split.
        ("cluster.outbound|9080||reviews.bookinfo.mesh.upstream_rq_total", None),
        ("cluster.xds-grpc-2.upstream_cx_active", None),
        ("cluster_manager.active_clusters", None),
    ],
)
def test_cluster_name_tag_reads_istios_delimited_names(stat: str, tagged: tuple[str, str] | None) -> None:
    assert cluster_name_tag(stat) == tagged


def test_no_stats_matcher_unless_an_inclusion_list_is_given() -> None:
    assert "stats_matcher" not in bootstrap()["stats_config"]
    assert "stats_matcher" not in bootstrap(stats_inclusion=StatsInclusion())["stats_config"]


def test_inclusion_list_is_istios_required_patterns_then_the_given_ones() -> None:
    """pkg/bootstrap/config.go getStatsOptions appends Istio's required patterns to the
    ProxyConfig's; envoy_bootstrap.json puts `reporter=` first and `component`, `istio` last."""
    inclusion = StatsInclusion(("cluster.outbound",), ("upstream_rq_timeout",), (r"http\..*\.downstream_rq_5xx",))
    patterns = bootstrap(stats_inclusion=inclusion)["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    assert patterns == [
        {"prefix": "reporter="},
        {"prefix": "cluster_manager"},
        {"prefix": "listener_manager"},
        {"prefix": "server"},
        {"prefix": "cluster.xds-grpc"},
        {"prefix": "wasm"},
        {"prefix": "cluster.outbound"},
        {"suffix": "rbac.allowed"},
        {"suffix": "rbac.denied"},
        {"suffix": "shadow_allowed"},
        {"suffix": "shadow_denied"},
        {"suffix": "upstream_rq_timeout"},
        {"safe_regex": {"regex": r"vhost\..*\.route\..*"}},
        {"safe_regex": {"regex": r"http\..*\.downstream_rq_5xx"}},
        {"prefix": "component"},
        {"prefix": "istio"},
    ]


def test_cli_stats_inclusion_flags_repeat() -> None:
    config = cli_bootstrap(
        "--stats-inclusion-prefix",
        "cluster.outbound",
        "--stats-inclusion-prefix",
        "listener.",
        "--stats-inclusion-suffix",
        "rq_timeout",
        "--stats-inclusion-regex",
        ".*_5xx",
    )
    patterns = config["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    assert {"prefix": "cluster.outbound"} in patterns and {"prefix": "listener."} in patterns
    assert {"suffix": "rq_timeout"} in patterns
    assert {"safe_regex": {"regex": ".*_5xx"}} in patterns


@pytest.mark.parametrize(
    ("kind", "pattern", "says"),
    [
        ("regex", "cluster.(outbound", "missing )"),
        ("regex", "(?=x)", "invalid regex"),
        ("prefix", "", "must not be empty"),
        ("suffix", "", "must not be empty"),
    ],
)
def test_an_inclusion_list_envoy_would_refuse_is_refused(kind: str, pattern: str, says: str) -> None:
    result = runner.invoke(app, ["bootstrap", "--proxy", BOOTSTRAP_NODE, f"--stats-inclusion-{kind}", pattern])
    assert result.exit_code == 2
    assert says in result.output
    inclusion = StatsInclusion(**{f"{kind}es": (pattern,)})
    with pytest.raises(ValueError, match=re.escape(says)):
        bootstrap(stats_inclusion=inclusion)
