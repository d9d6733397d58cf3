"""Every command that takes a path takes it as a shell user writes it: `.`, `./`, `..`, a path
through `..`, or an absolute path, with the same result (`meshctl validate .` is how CI runs
a linter from inside the config directory)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, PRODUCTPAGE
from typer.testing import CliRunner, Result

from meshctl.cli.app import app
from meshctl.testing.fake_consul import FakeConsul

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "examples" / "routing-tests" / "bookinfo.yaml"
SPELLINGS = [".", "./", "..", "abs"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    (mesh / "ci").mkdir()  # a directory without YAML, to stand in when the tree is `..`
    shutil.copy(CASES, tmp_path / "cases.yaml")
    return mesh


def place(spelling: str, tree: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Change to where `spelling` names `tree`, and return it spelled so."""
    monkeypatch.chdir(tree / "ci" if spelling == ".." else tree)
    return str(tree) if spelling == "abs" else spelling


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"CONSUL_HTTP_TOKEN": ""})


@pytest.fixture
def consul() -> Iterator[str]:
    with FakeConsul() as fake:
        yield fake.address


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_command_takes_the_config_dir_however_it_is_spelled(
    spelling: str, tree: Path, monkeypatch: pytest.MonkeyPatch, consul: str
) -> None:
    at = place(spelling, tree, monkeypatch)
    cases = os.path.join(at, "..", "cases.yaml")
    runs = {
        "validate": invoke("validate", "--strict", at),
        "dump": invoke("dump", "--config-dir", at, "--proxy", PRODUCTPAGE, "-o", "json"),
        "diff": invoke("diff", at, str(tree), "--proxy", PRODUCTPAGE),
        "simulate": invoke("simulate", "--config-dir", at, "--cases", cases),
        "services": invoke("services", "--config-dir", at),
        "kv push": invoke("kv", "push", at, "--prefix", "mesh", "--consul", consul),
    }
    for command, result in runs.items():
        assert result.exit_code == 0, f"{command} {spelling}: {result.output}"
    assert "bookinfo/traffic.yaml" in runs["kv push"].output or "traffic.yaml" in runs["kv push"].output

    # The tree pushed from there comes back whole into a directory spelled the same way.
    out = tree.parent / "pulled"
    (out / "here").mkdir(parents=True)
    monkeypatch.chdir(out / "here")
    target = {".": ".", "./": "./", "..": "../there", "abs": str(out / "abs")}[spelling]
    pulled = invoke("kv", "pull", target, "--prefix", "mesh", "--consul", consul)
    assert pulled.exit_code == 0, pulled.output
    written = (out / "here" / target).resolve()
    assert (written / "bookinfo" / "traffic.yaml").read_text() == (tree / "bookinfo" / "traffic.yaml").read_text()
