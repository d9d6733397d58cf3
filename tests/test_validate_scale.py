"""`meshctl validate` at scale: loading in forked workers changes the time, never the answer; and
the table-driven schema conversion answers with a finding where the old one crashed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config import loader, parallel
from meshctl.config.check import check
from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.tree import load_paths

HEAD = "apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: ns-{ns}\nspec:\n"


def service(i: int) -> str:
    return HEAD.format(kind="ServiceEntry", name=f"svc-{i}", ns=i % 3) + (
        f"  hosts: [svc-{i}.ns-{i % 3}.mesh]\n"
        "  ports: [{number: 8080, name: http, protocol: HTTP}]\n"
        "  resolution: STATIC\n"
        f"  workloadSelector: {{labels: {{app: svc-{i}}}}}\n"
    )


def workload(i: int) -> str:
    return HEAD.format(kind="WorkloadEntry", name=f"svc-{i}", ns=i % 3) + (
        f"  address: 10.0.{i // 250}.{i % 250 + 1}\n  labels: {{app: svc-{i}, version: v1}}\n"
    )


def route(i: int, to: str) -> str:
    return HEAD.format(kind="VirtualService", name=f"svc-{i}", ns=i % 3) + (
        f"  hosts: [svc-{i}.ns-{i % 3}.mesh]\n  http:\n  - route:\n    - destination: {{host: {to}, subset: v1}}\n"
    )


def write_tree(root: Path, files: int) -> None:
    """Files of every sort a big tree has: clean ones, broken YAML, schema errors, a resource
    defined in two files (the first in path order must win), and references analysis rejects."""
    for i in range(files):
        docs = [service(i), workload(i)]
        if i % 7 == 0:
            docs.append(route(i, f"svc-{i + 1}.ns-{(i + 1) % 3}.mesh"))  # no DestinationRule: IST0101
        if i % 11 == 0:
            docs.append(workload(i).replace("10.0.", "10.999."))  # defined twice, and not an IP
        if i % 13 == 0:
            docs.append(service(i - 1))  # also defined by the previous file
        text = "---\n".join(docs)
        if i % 17 == 0:
            text += "---\nkind: [unclosed\n"
        (root / f"ns-{i % 3}").mkdir(exist_ok=True)
        (root / f"ns-{i % 3}" / f"svc-{i:03}.yaml").write_text(text)


def ran_apart(request: pytest.FixtureRequest) -> bool:
    """Whether this test was run again in a fresh interpreter (and passed there), because this
    one has threads (gRPC's, after the server tests) and the loader rightly does not fork in a
    process with threads. A fork test that skipped there would never run in the whole suite."""
    if not parallel.other_threads():
        return False
    if os.environ.get("MESHCTL_FORK_TEST_APART"):
        pytest.fail("threads are running even in a fresh interpreter")
    # In this one interpreter: worker processes (the suite's default `-n`) would bring their threads.
    alone = ["-n0"] if importlib.util.find_spec("xdist") is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *alone, request.node.nodeid],
        cwd=request.config.rootpath,
        env={**os.environ, "MESHCTL_FORK_TEST_APART": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return True


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_tree(tmp_path, 150)
    return tmp_path


def test_workers_load_what_one_process_loads_in_the_same_order(
    tree: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if ran_apart(request):
        return
    unpacked: list[str] = []
    real_unpack = parallel._unpack

    def unpack(packed: parallel._PackedFile) -> loader.FileResult:
        unpacked.append(packed[0])
        return real_unpack(packed)

    monkeypatch.setattr(parallel, "_unpack", unpack)

    serial = load_paths([tree], LoadOptions(workers=1))
    assert unpacked == []
    forked = load_paths([tree], LoadOptions(workers=2))
    assert unpacked == list(serial.files)  # every file came back from a worker, in path order

    assert list(forked.files) == list(serial.files)
    for path, expected in serial.files.items():
        got = forked.files[path]
        assert got.findings == expected.findings
        assert [c.key for c in got.configs] == [c.key for c in expected.configs]
        for a, b in zip(got.configs, expected.configs, strict=True):
            assert a.same_content(b)
            assert (a.api_version, a.source) == (b.api_version, b.source)


def test_findings_are_the_same_with_workers(tree: Path) -> None:
    serial = check([str(tree)], LoadOptions(workers=1))
    assert {f.code for f in serial} >= {"IST0101", ""}
    assert any("is defined twice" in f.message for f in serial)
    assert check([str(tree)], LoadOptions(workers=2)) == serial


def test_jobs_option(tree: Path) -> None:
    runner = CliRunner()
    one = runner.invoke(app, ["validate", "-o", "json", "--jobs", "1", str(tree)])
    two = runner.invoke(app, ["validate", "-o", "json", "-j", "2", str(tree)])
    assert one.exit_code == two.exit_code == 1
    assert one.stdout == two.stdout


def test_an_enum_number_out_of_int32_range_is_a_finding() -> None:
    text = HEAD.format(kind="ServiceEntry", name="a", ns=0) + "  hosts: [a.ns-0.mesh]\n  location: 1099511627776\n"
    result = load_text(text, "se.yaml")
    assert [(f.field, f.message) for f in result.findings] == [
        ("spec.location", 'invalid value "1099511627776": must be one of MESH_EXTERNAL, MESH_INTERNAL')
    ]


def test_jobs_0_forks_workers_only_for_a_tree_big_enough_to_pay(
    tree: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if ran_apart(request):
        return
    unpacked: list[str] = []
    real_unpack = parallel._unpack

    def unpack(packed: parallel._PackedFile) -> loader.FileResult:
        unpacked.append(packed[0])
        return real_unpack(packed)

    monkeypatch.setattr(parallel, "_unpack", unpack)
    monkeypatch.setattr(parallel, "spare_cpus", lambda: 2)  # an idle machine of two cores
    runner = CliRunner()
    small = runner.invoke(app, ["validate", "-o", "json", "-j", "0", str(tree)])  # 150 files
    assert small.exit_code == 1 and unpacked == []
    big = tmp_path_factory.mktemp("big")
    write_tree(big, 1000)
    runner.invoke(app, ["validate", "-o", "json", "-j", "0", "--no-analyze", str(big)])
    assert len(unpacked) == 1000
