"""/metrics as Prometheus and an Istio dashboard read it: every series from the start, Istio's
label values on every metric, and the process metrics every exporter has."""

from __future__ import annotations

import time

from meshctl.server.metrics import Metrics
from meshctl.server.subscription import Push
from meshctl.xds import types


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_every_series_a_dashboard_reads_exists_at_zero_from_the_start() -> None:
    """`increase()` over a series that appears with its first event misses that event."""
    page = samples(Metrics().render())
    for kind in ("cds", "eds", "lds", "rds"):
        assert page[f'pilot_total_xds_rejects{{type="{kind}"}}'] == 0
        assert page[f'pilot_xds_pushes{{type="{kind}"}}'] == 0
        assert page[f'pilot_xds_config_size_bytes_count{{type="{kind}"}}'] == 0
    for reason in ("config", "endpoint", "service"):
        assert page[f'pilot_push_triggers{{type="{reason}"}}'] == 0
    assert page["pilot_xds"] == 0
    assert page["pilot_proxy_convergence_time_count"] == 0


def test_type_labels_are_istios_and_the_same_on_every_metric() -> None:
    metrics = Metrics()
    push = Push(types.CLUSTER, "v1", "n1", ())
    metrics.pushed(None, push, 1234)  # type: ignore[arg-type]  # the stream is not read
    metrics.rejected(None, types.CLUSTER, "bad")  # type: ignore[arg-type]
    page = samples(metrics.render())
    assert page['pilot_xds_pushes{type="cds"}'] == 1
    assert page['pilot_xds_config_size_bytes_count{type="cds"}'] == 1
    assert page['pilot_total_xds_rejects{type="cds"}'] == 1
    assert not any('type="CDS"' in name for name in page)


def test_process_metrics_describe_this_process() -> None:
    page = samples(Metrics().render())
    assert page["process_resident_memory_bytes"] > 10 * 1024 * 1024
    assert page["process_virtual_memory_bytes"] >= page["process_resident_memory_bytes"]
    assert page["process_cpu_seconds_total"] > 0
    assert 0 < time.time() - page["process_start_time_seconds"] < 3600
    assert 3 <= page["process_open_fds"] <= page["process_max_fds"]
