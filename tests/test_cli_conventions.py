"""The conventions istioctl, kubectl and kumactl users expect of every meshctl command."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshctl import __version__
from meshctl.cli.app import app
from meshctl.cli.output import print_listing
from meshctl.testing.serve_process import ServeProcess, meshctl_command

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"
COMMANDS = [
    "validate",
    "serve",
    "services",
    "dump",
    "diff",
    "bootstrap",
    "proxy-status",
    "version",
    "simulate",
    "hosts",
]
NODE = "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local"

runner = CliRunner()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_dash_h_and_names_its_values(command: str) -> None:
    result = runner.invoke(app, [command, "-h"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"Usage: meshctl {command}" in result.output
    rows = [line for line in result.output.splitlines() if re.match(r"^│ +(\* +)?-", line) and "--help" not in line]
    assert rows, result.output
    for row in rows:
        # Values are named for what they are (ADDR, PATH, NODE_ID), never by a Python type.
        assert not re.search(r"<(str|int|float|path|bool)>|list\[", row), row


def test_help_paragraphs_reflow_to_the_terminal() -> None:
    result = runner.invoke(app, ["serve", "-h"], env={"COLUMNS": "200"}, terminal_width=200)
    assert "follows Consul when given, and keeps serving the last good config" in result.output


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert (result.exit_code, result.output.strip()) == (0, __version__)


@pytest.mark.slow
def test_version_of_a_running_server(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    with ServeProcess([mesh]) as serve:
        snapshot = serve.admin_json("version")["snapshot"]
        proc = subprocess.run(
            [*meshctl_command(), "version", "--server", serve.admin_address],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"client: {__version__}", f"server: {__version__} (snapshot {snapshot})"]
    assert snapshot


def test_dump_defaults_to_the_short_tables_as_istioctl_proxy_config() -> None:
    result = runner.invoke(app, ["dump", "--config-dir", str(EXAMPLES), "--proxy", NODE, "--type", "clusters"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("SERVICE FQDN")


@pytest.mark.parametrize("width", [60, 250])
def test_tables_never_break_an_id(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    """On a terminal too narrow for the ids the listing is plain aligned text; wide enough, a
    table: either way each node id stays whole on one line, to copy."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", str(width))
    out = io.StringIO()
    print_listing(["NAME", "WORKLOAD", "CDS"], [[NODE, "bookinfo/reviews-v1-vm", "SYNCED"]], out)
    assert any(NODE in line for line in out.getvalue().splitlines()), out.getvalue()
    assert ("┃" in out.getvalue()) is (width == 250)


def test_diff_of_every_proxy_shows_an_identical_change_once(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(EXAMPLES, old)
    shutil.copytree(EXAMPLES, new)
    # A ServiceEntry every proxy of the mesh may call: the same new cluster for each of them.
    (new / "bookinfo" / "extra.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: extra, namespace: bookinfo}\n"
        "spec: {hosts: [extra.example.com], resolution: DNS, location: MESH_EXTERNAL,"
        " ports: [{number: 80, name: http, protocol: HTTP}]}\n"
    )
    result = runner.invoke(app, ["diff", str(old), str(new), "--all-proxies"])
    assert result.exit_code == 1, result.output
    headers = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    added = [line for line in result.stdout.splitlines() if line == "+++ b/clusters/outbound|80||extra.example.com"]
    assert len(headers) > 1 and len(added) >= 1
    assert len(added) < len(headers)  # proxies with the same diff share one block
    first = result.stdout.splitlines().index(headers[0])
    assert result.stdout.splitlines()[first + 1].startswith("# ")  # the ids of a block stand together
