"""`.meshctlignore`: a repository's config directory beside files that only look like config.
What it names is read neither by `meshctl validate` nor by `meshctl serve`'s watcher; a bad ignore
file or pattern says where and ignores nothing it cannot be sure of."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config.model import ConfigKey
from meshctl.config.store import ConfigStore
from meshctl.config.watcher import DirectoryWatcher

REPO = Path(__file__).resolve().parent.parent


def service_entry(name: str, host: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
  namespace: shop
spec:
  hosts: [{host}]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
"""


def validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", str(path)])
    return result.exit_code, result.output


def test_the_repository_validates_at_its_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """`meshctl validate .` in a checkout: the example mesh, and none of the test fixtures that
    define resources twice on purpose or hold Envoy output."""
    monkeypatch.chdir(REPO)
    code, output = validate(Path("."))
    assert code == 0, output
    assert "tests/golden" not in output and "tests/parity" not in output
    assert "0 error(s)" in output


def test_ignored_names_and_paths_are_not_read(tmp_path: Path) -> None:
    (tmp_path / "mesh").mkdir()
    (tmp_path / "mesh" / "api.yaml").write_text(service_entry("api", "api.shop.mesh"))
    # the same resource again, and a file that is no Istio config at all: both ignored
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "api.yaml").write_text(service_entry("api", "api.shop.mesh"))
    (tmp_path / "mesh" / "values.tmpl.yaml").write_text("{{ .Values.broken\n")
    (tmp_path / "charts" / "web" / "templates").mkdir(parents=True)
    (tmp_path / "charts" / "web" / "templates" / "se.yaml").write_text("kind: [\n")
    # `golden/` ignores directories only: a file of that name is still read
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "golden").mkdir()
    (tmp_path / "other" / "golden" / "x.yaml").write_text("kind: [\n")
    (tmp_path / ".meshctlignore").write_text("# not config\n/golden/\n*.tmpl.yaml\ncharts/*/templates\n")

    code, output = validate(tmp_path)
    assert code == 1, output  # other/golden/x.yaml: `/golden/` is anchored to the ignore file
    assert "other/golden/x.yaml" in output
    for ignored in ("golden/api.yaml", "values.tmpl.yaml", "templates/se.yaml", "defined twice"):
        assert ignored not in output.replace("other/golden/x.yaml", ""), output

    (tmp_path / "other" / ".meshctlignore").write_text("golden/\n")
    code, output = validate(tmp_path)
    assert code == 0, output


def test_a_pattern_it_cannot_follow_is_reported_with_its_line_and_ignores_nothing(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "bad.yaml").write_text("kind: [\n")
    (tmp_path / ".meshctlignore").write_text("\n!keep/\nkeep/**\n../x\n")
    code, output = validate(tmp_path)
    assert code == 1
    assert "keep/bad.yaml" in output
    assert ".meshctlignore:2:1" in output and "negation is not supported" in output
    assert ".meshctlignore:3:1" in output and "`**` is not supported" in output
    assert ".meshctlignore:4:1" in output and "below the ignore file" in output


def test_an_ignore_file_that_is_not_a_file_ignores_nothing_and_blocks_nothing(tmp_path: Path) -> None:
    (tmp_path / "api.yaml").write_text(service_entry("api", "api.shop.mesh"))
    os.mkfifo(tmp_path / ".meshctlignore")  # opened blindly, a FIFO would hold the walk forever
    code, output = validate(tmp_path)
    assert code == 0, output
    assert ".meshctlignore" in output and "not a regular file" in output


def test_the_watcher_drops_what_becomes_ignored_and_serves_the_rest(tmp_path: Path) -> None:
    (tmp_path / "mesh").mkdir()
    (tmp_path / "mesh" / "api.yaml").write_text(service_entry("api", "api.shop.mesh"))
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "web.yaml").write_text(service_entry("web", "web.shop.mesh"))
    store = ConfigStore()
    watcher = DirectoryWatcher([tmp_path], store)
    watcher.reload_now()
    assert store.get(ConfigKey("ServiceEntry", "shop", "web")) is not None

    (tmp_path / ".meshctlignore").write_text("scratch/\n")
    result = watcher.reload_now()  # an edit of the ignore file applies at the next full pass
    assert not result.errors
    assert store.get(ConfigKey("ServiceEntry", "shop", "web")) is None
    assert store.get(ConfigKey("ServiceEntry", "shop", "api")) is not None

    (tmp_path / ".meshctlignore").unlink()
    watcher.reload_now()
    assert store.get(ConfigKey("ServiceEntry", "shop", "web")) is not None
