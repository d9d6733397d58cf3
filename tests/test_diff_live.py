"""`meshctl diff --live`: a real Envoy, synced by `meshctl serve`, compared with the config tree.

The server is stopped before the tree is edited, so Envoy keeps the config it was sent and the
edit is drift that only the comparison can see.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import SLEEP, SLEEP_VM, envoy_log_left_open, examples_copy, needs_envoy, runner, subcommand_app, wait_for

from meshctl.cli.diff import diff
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

app = subcommand_app("diff", diff)

#: The clusters whose connection pool the DestinationRule `reviews` sets: the service's and its subsets'.
REVIEWS_CLUSTERS = [f"outbound|9080|{s}|reviews.bookinfo.mesh" for s in ("", "v1", "v2", "v3")]


def settled(server: ServeProcess) -> bool:
    entry = next((e for e in server.admin_json("/debug/syncz") if e["proxy"] == SLEEP), None)
    if entry is None or set(entry["types"]) != {"CDS", "EDS", "LDS", "RDS"}:
        return False
    return all(not t["nack"] and t["sent"] and t["acked"] == t["sent"] for t in entry["types"].values())


@pytest.fixture
def synced(tmp_path: Path) -> Iterator[tuple[Path, ServeProcess, EnvoyProcess]]:
    """The example mesh with a client VM, served to that VM's Envoy until it has ACKed everything."""
    tree = examples_copy(tmp_path)
    (tree / "bookinfo" / "sleep.yaml").write_text(SLEEP_VM)
    with ExitStack() as stack:
        server = stack.enter_context(ServeProcess([tree]))
        envoy = stack.enter_context(EnvoyProcess(server.bootstrap(SLEEP)))
        wait_for(lambda: settled(server), "Envoy ACKs all four types", server.log)
        yield tree, server, envoy


def live(envoy: EnvoyProcess, tree: Path, *args: str) -> Any:
    url = f"http://127.0.0.1:{envoy.admin_port}"
    return runner.invoke(app, ["diff", "--live", url, "--proxy", SLEEP, "--config-dir", str(tree), *args])


def edit(path: Path, before: str, after: str) -> None:
    text = path.read_text()
    assert text.count(before) == 1, before
    path.write_text(text.replace(before, after))


def test_a_synced_envoy_has_no_drift(synced: tuple[Path, ServeProcess, EnvoyProcess]) -> None:
    tree, server, envoy = synced
    result = live(envoy, tree, "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["drift"], report["differences"], report["nacks"]) == (False, [], [])
    assert all(v["stale"] == 0 for v in report["versions"]), report["versions"]
    with_server = live(envoy, tree, "--server", server.admin_address, "-o", "json")
    assert with_server.exit_code == 0, with_server.output
    assert {d["drift"] for d in json.loads(with_server.stdout)["delivery"]} == {"none"}
    text = live(envoy, tree)
    assert "no drift" in text.stderr
    assert "MESHCTL VERSION" not in text.stdout  # no empty Drift table, only the versions
    assert text.stdout.startswith("TYPE ") and "STALE" in text.stdout.splitlines()[0], text.stdout


def test_an_edit_the_envoy_never_got_is_exactly_the_changed_resources(
    synced: tuple[Path, ServeProcess, EnvoyProcess],
) -> None:
    tree, server, envoy = synced
    server.stop()  # Envoy keeps what it holds
    traffic = tree / "bookinfo" / "traffic.yaml"
    edit(traffic, "weight: 90", "weight: 80")
    edit(traffic, "weight: 10\n", "weight: 20\n")
    edit(traffic, "maxConnections: 100", "maxConnections: 50")
    result = live(envoy, tree, "-o", "json")
    assert result.exit_code == 1, result.output
    changed = {(d["type"], d["name"], d["drift"]) for d in json.loads(result.stdout)["differences"]}
    expected = {("routes", "9080", "changed")} | {("clusters", name, "changed") for name in REVIEWS_CLUSTERS}
    assert changed == expected
    text = live(envoy, tree)
    assert text.exit_code == 1
    assert "9080" in text.stdout and "changed" in text.stdout


def test_an_unreachable_admin_url_is_an_error(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["diff", "--live", url, "--proxy", "reviews-v1-vm.bookinfo", "--config-dir", str(tree)])
    assert result.exit_code == 2
    assert f"error: nothing listens on {url}" in result.stderr
