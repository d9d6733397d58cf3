"""Every command ends at one edge: an error of meshctl's tree is one `error:` line on stderr and
exit 2, a crash is one `internal error:` line and exit 2, and 0 and 1 stay the commands' answers."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import meshctl.errors
from meshctl.cli import exits
from meshctl.cli.app import app
from meshctl.errors import (
    ConfigError,
    CredentialError,
    MeshctlError,
    NodeIdError,
    OfflineError,
    RegistryError,
    SubscriptionLimitError,
    UsageError,
    YamlError,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "configs"
NODE = "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local"

runner = CliRunner()


def failed(args: list[str]) -> str:
    """The line a failing command ends with: exit 2, nothing on stdout, no traceback (notes the
    command printed on its way, `dump`'s proxy line say, may come before)."""
    result = runner.invoke(app, args)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), result.stderr
    return line


# -- the edge is on every command --------------------------------------------------------------


def test_every_command_is_behind_the_edge() -> None:
    """Each wrapper `reported` returns runs the same code, so a command registered without it
    shows here rather than as a traceback in front of a user."""
    edge = exits.reported(lambda: None).__code__
    commands = {c.name: c.callback for c in app.registered_commands}
    assert len(commands) >= 8
    for name, callback in commands.items():
        assert callback is not None and callback.__code__ is edge, name


# -- one tree ------------------------------------------------------------------------------------


def _drawn_tree() -> dict[str, str]:
    """{class: parent} as errors.py's docstring draws it."""
    doc = meshctl.errors.__doc__ or ""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^( *)(?:([│ ]*)[├└]── )?([A-Z]\w+Error)\b", line)
        if not match:
            continue
        depth = len(match.group(1)) + len(match.group(2) or "") + (4 if match.group(2) is not None else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[match.group(3)] = stack[-1][1]
        stack.append((depth, match.group(3)))
    return parents


def test_the_docstring_draws_the_tree_the_classes_make() -> None:
    defined = {
        name: cls
        for name, cls in vars(meshctl.errors).items()
        if isinstance(cls, type) and issubclass(cls, MeshctlError) and cls is not MeshctlError
    }
    drawn = _drawn_tree()
    assert set(drawn) == set(defined)
    for name, cls in defined.items():
        assert cls.__base__.__name__ == drawn[name], name


def test_no_error_class_of_meshctl_grows_outside_the_tree() -> None:
    """An error class deriving from the tree is defined in meshctl/errors.py, nowhere else."""
    tree = {"MeshctlError", *_drawn_tree()}
    strays = []
    for path in sorted((ROOT / "meshctl").rglob("*.py")):
        if path.relative_to(ROOT / "meshctl").parts[0] in ("api", "errors.py"):  # generated; the tree
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if bases & tree:
                    strays.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert strays == []


# -- what the edge prints, and the exit status ---------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("a.yaml: not config"),
        YamlError("a.yaml:3: duplicate key", 3, 1),
        RegistryError("cannot read consul at http://127.0.0.1:8500: connection refused"),
        CredentialError("cannot read /etc/meshctl/tls.key"),
        NodeIdError("node id 'x' is not TYPE~IP~NAME.NAMESPACE~DOMAIN"),
        SubscriptionLimitError("too many names", type_url="t", limit=1),
        UsageError("--tls-cert and --tls-key go together"),
        OfflineError("no such file or directory: nope"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_of_the_tree_is_its_own_message_and_exit_2(error: MeshctlError) -> None:
    assert exits.failure(error) == (str(error), 2)


def test_anything_else_is_an_internal_error_and_exit_2() -> None:
    assert exits.failure(KeyError("x")) == ("internal error: KeyError: 'x'", 2)


def test_findings_come_before_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    from meshctl.config.findings import Finding, Severity

    finding = Finding(Severity.ERROR, "expected an integer", "traffic.yaml", 4, field="spec.http[0].route[0].weight")
    assert exits.report(OfflineError("1 error(s) in mesh/", [finding])) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "traffic.yaml:4" in lines[0]
    assert lines[-1] == "error: 1 error(s) in mesh/"


@pytest.mark.parametrize("exit", [typer.Exit(0), typer.Exit(1), typer.BadParameter("not one of"), typer.Abort()])
def test_answers_and_typers_own_errors_pass_through(exit: Exception) -> None:
    """0 and 1 are the commands' answers; typer reports its own usage errors in its own way."""

    def command() -> None:
        raise exit

    with pytest.raises(type(exit)) as raised:
        exits.reported(command)()
    assert raised.value is exit


# -- through the commands ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["validate", "nope/"], "error: no such file or directory: nope/"),
        (["services"], "error: nothing to list: give --config-dir DIR, --consul ADDR (or both), or --admin ADDR"),
        (["diff", str(EXAMPLES), str(EXAMPLES)], "error: give either --proxy NODE_ID or --all-proxies"),
        (["dump", "--config-dir", "nope", "--proxy", NODE], "error: no such file or directory: nope"),
        (["bootstrap", "--proxy", NODE, "--xds-address", "nowhere"], "error: 'nowhere' is not HOST:PORT"),
        (["bootstrap", "--proxy", "gateway~10.0.0.1~a.b~b.svc"], "type must be sidecar or router"),
        (["serve", "-c", str(EXAMPLES), "--xds-address", "nowhere"], "error: 'nowhere' is not HOST:PORT"),
    ],
)
def test_a_users_mistake_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    assert line in failed(args)


@pytest.mark.parametrize(
    ("args", "module", "function"),
    [
        (["validate", str(EXAMPLES)], "meshctl.config.check", "check"),
        (["services", "--config-dir", str(EXAMPLES)], "meshctl.config.tree", "load_paths"),
        (["dump", "--config-dir", str(EXAMPLES), "--proxy", NODE], "meshctl.xds.generate", "generate"),
        (["bootstrap", "--proxy", NODE], "meshctl.bootstrap", "build_bootstrap"),
    ],
)
def test_a_crash_is_one_internal_error_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str], module: str, function: str
) -> None:
    """Never exit 1 (an answer) and never a traceback."""
    import importlib

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(importlib.import_module(module), function, broken)
    assert failed(args) == "error: internal error: RuntimeError: boom"
