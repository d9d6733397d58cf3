"""The command output that README.md and the pages of docs/ show, held to what the commands print.

docs/vm-setup.md is run whole by test_vm_setup_doc.py (with a real Envoy); here, quickly and for
every page that shows output, the shapes a reader copies into scripts: table columns, finding
lines, the routing-test report, exit statuses, and the commands README.md gives to try.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, PRODUCTPAGE, ROOT, examples_copy
from ruamel.yaml import YAML
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CASES = ROOT / "examples" / "routing-tests" / "bookinfo.yaml"
runner = CliRunner()


def fenced(page: Path, language: str) -> list[tuple[int, str]]:
    """Every ```LANGUAGE block of `page`: (line of the fence, text)."""
    lines = page.read_text().splitlines()
    out: list[tuple[int, str]] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == f"```{language}":
            end = lines.index("```", index + 1)
            out.append((index + 1, "\n".join(lines[index + 1 : end]) + "\n"))
            index = end
        index += 1
    return out


def following_output(page: Path, command: str) -> str:
    """The ```text block right after the ```sh block that holds `command`."""
    text = page.read_text()
    at = text.index(command)
    rest = text[at:]
    block = re.search(r"\A[^\n]*\n```\n\s*```text\n(.*?)\n```", rest, re.S)
    assert block, f"{page.name}: no output shown after {command!r}"
    return block.group(1) + "\n"


def box_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The tables drawn as rich draws them on a terminal: (columns, rows)."""
    tables = []
    for match in re.finditer(r"^┏[^\n]*\n(┃[^\n]*)\n(?:[^\n]*\n)*?└[^\n]*$", text, re.M):
        lines = match.group(0).splitlines()
        columns = [c.strip() for c in lines[1].strip("┃").split("┃")]
        rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
        tables.append((columns, rows))
    return tables


# -- proxy-status: every table on every page has the command's columns ------------------------


@pytest.fixture(scope="module")
def proxy_status_columns(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The header of `meshctl proxy-status` as it prints it, for one served proxy."""
    tree = examples_copy(tmp_path_factory.mktemp("mesh"))
    header: list[str] = []

    async def test() -> None:
        async with serving(tree) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as client:
            await client.wait_for(lambda c: c.complete())
            args = ["proxy-status", "--admin", f"127.0.0.1:{server.admin_port}"]
            result = await asyncio.to_thread(runner.invoke, app, args)
            assert result.exit_code in (0, 1), result.output
            header.extend(re.split(r"\s{2,}", result.stdout.splitlines()[0].strip()))

    run(test)
    return header


def proxy_status_tables() -> list[tuple[str, list[str], list[list[str]]]]:
    found = []
    for page in PAGES:
        for line, text in fenced(page, "text"):
            for columns, rows in box_tables(text):
                if columns[:1] == ["NAME"] and "CDS" in columns:
                    found.append((f"{page.name}:{line}", columns, rows))
    return found


def test_the_pages_show_proxy_status_tables() -> None:
    where = {w.split(":")[0] for w, _, _ in proxy_status_tables()}
    assert {"vm-setup.md", "replicas.md"} <= where


@pytest.mark.parametrize(("where", "columns", "rows"), proxy_status_tables(), ids=lambda v: str(v)[:40])
def test_every_proxy_status_table_has_the_columns_of_the_command(
    where: str, columns: list[str], rows: list[list[str]], proxy_status_columns: list[str]
) -> None:
    assert columns == proxy_status_columns, where
    states = {"SYNCED", "STALE", "NOT SENT", "ERROR"}
    for row in rows:
        assert len(row) == len(columns), where
        assert {row[columns.index(t)] for t in ("CDS", "LDS", "EDS", "RDS", "SDS")} <= states, where


def test_the_replica_column_names_a_replica_of_the_command() -> None:
    page = ROOT / "docs" / "replicas.md"
    command = "meshctl proxy-status --admin 10.0.0.11:15014 --admin 10.0.0.12:15014"
    [(columns, rows)] = box_tables(following_output(page, command))
    replicas = {row[columns.index("REPLICA")] for row in rows}
    assert replicas == {"10.0.0.11:15014", "10.0.0.12:15014"}


# -- docs/replicas.md: the env file the git-sync steps leave ------------------------------------


def test_the_git_sync_steps_leave_one_config_dir_in_the_env_file(tmp_path: Path) -> None:
    vm_setup = next(t for _, t in fenced(ROOT / "docs" / "vm-setup.md", "sh") if "cat > /etc/meshctl/meshctl.env" in t)
    replicas = next(t for _, t in fenced(ROOT / "docs" / "replicas.md", "sh") if "meshctl-git-sync" in t)
    steps = [line for line in replicas.splitlines() if "/etc/meshctl/meshctl.env" in line]
    script = "\n".join([vm_setup, *steps]).replace("/etc/meshctl", str(tmp_path))
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, cwd=tmp_path, timeout=30)
    lines = (tmp_path / "meshctl.env").read_text().splitlines()
    assert [line for line in lines if line.startswith("MESHCTL_CONFIG_DIR=")] == [
        "MESHCTL_CONFIG_DIR=/var/lib/meshctl-git/current"
    ]
    assert "MESHCTL_ADMIN_ADDRESS=127.0.0.1:15014" in lines  # the rest is kept


# -- docs/routing-tests.md ----------------------------------------------------------------------


def test_the_example_cases_are_the_example_files() -> None:
    page = ROOT / "docs" / "routing-tests.md"
    [example] = [t for _, t in fenced(page, "yaml") if t.startswith("- name:")]
    shown = YAML(typ="safe").load(example)
    cases = YAML(typ="safe").load(CASES.read_text())
    for case in shown:
        assert case in cases, case["name"]


def test_a_failing_case_is_reported_as_the_page_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = ROOT / "docs" / "routing-tests.md"
    [(_, report), *_] = [(n, t) for n, t in fenced(page, "text") if "FAIL" in t]
    fail_line, summary = report.splitlines()
    wrong = tmp_path / "routing" / "bookinfo.yaml"
    wrong.parent.mkdir()
    text = CASES.read_text()
    canary = "    cluster: outbound|9080|v2|reviews.bookinfo.mesh\n"
    assert canary in text
    wrong.write_text(text.replace(canary, canary.replace("|v2|", "|v3|"), 1))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLES, tmp_path / "examples" / "configs")
    result = runner.invoke(app, ["simulate", "--cases", "routing/bookinfo.yaml", "--config-dir", "examples/configs"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [fail_line]
    assert summary in result.stderr.splitlines()

    github = runner.invoke(
        app, ["simulate", "--cases", "routing/bookinfo.yaml", "--config-dir", "examples/configs", "-o", "github"]
    )
    [annotation] = [t for _, t in fenced(page, "text") if t.startswith("::error")]
    shown = annotation.strip().replace("routing-tests/mesh.yaml", "routing/bookinfo.yaml")
    shown = shown.replace("mesh/", "examples/configs/")
    pattern = ".*?".join(re.escape(part) for part in shown.split("..."))
    assert re.fullmatch(pattern, github.stdout.strip()), github.stdout


def test_the_exit_codes_of_the_page() -> None:
    ok = runner.invoke(app, ["simulate", "--cases", str(CASES), "--config-dir", str(EXAMPLES)])
    assert ok.exit_code == 0, ok.output
    not_cases = runner.invoke(app, ["simulate", "--cases", str(EXAMPLES / "bookinfo" / "traffic.yaml")])
    assert not_cases.exit_code == 2


# -- README.md ----------------------------------------------------------------------------------


def readme_commands() -> list[str]:
    """The README's example commands that run on the bundled example alone (no server, no
    directories of the reader's own)."""
    out = []
    for _, block in fenced(ROOT / "README.md", "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            words = shlex.split(command)
            if words[:1] != ["meshctl"] or words[1] in ("serve", "validate") or "configs/" in words:
                continue
            if all(not w.startswith(("main/", "pr/", "http://127")) for w in words) and ">" not in words:
                out.append(command)
    return out


def test_the_readme_has_commands_to_try() -> None:
    assert any(c.startswith("meshctl simulate") for c in readme_commands())
    assert any(c.startswith("meshctl dump") for c in readme_commands())


@pytest.mark.parametrize("command", readme_commands())
def test_the_readme_commands_run_on_the_example(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()


def test_the_readme_finding_line_is_what_validate_prints(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    [shown] = re.findall(r"^error \S+ VirtualService bookinfo/reviews .*\[IST0101\]$", readme, re.M)
    tree = examples_copy(tmp_path)
    traffic = tree / "bookinfo" / "traffic.yaml"
    text = traffic.read_text()
    traffic.write_text(text.replace("        subset: v2\n", "        subset: v9\n", 1))
    result = runner.invoke(app, ["validate", str(tree)])
    assert result.exit_code == 1
    printed: list[Any] = [line for line in result.stdout.splitlines() if "IST0101" in line]
    assert len(printed) == 1
    # The same line but for the file and its position.
    assert printed[0].split(" ", 2)[2] == shown.split(" ", 2)[2]
    assert re.fullmatch(r"error \S+:\d+:\d+", " ".join(printed[0].split(" ", 2)[:2]))


def test_the_readme_exit_statuses_are_the_commands(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| 1 |"))
    for command in ("validate", "kv push", "diff", "simulate", "proxy-status"):
        assert f"`{command}`" in row, command
    helps = {c: runner.invoke(app, [*c.split(), "--help"], env={"COLUMNS": "200"}).stdout for c in ("proxy-status",)}
    assert "1 a proxy shows ERROR" in " ".join(helps["proxy-status"].replace("│", " ").split())
