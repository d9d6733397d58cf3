"""Option values are converted without pydantic (`meshctl.cli.coercion`), as typer converts them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshctl.testing.serve_process import meshctl_command

PARSE_ONLY = """
import runpy, sys
sys.argv = ["meshctl", *sys.argv[1:]]
try:
    runpy.run_module("meshctl", run_name="__main__")
except SystemExit:
    pass
print("pydantic loaded:", "pydantic" in sys.modules)
"""


def test_serve_reads_its_options_without_loading_pydantic() -> None:
    """Every kind of option serve has (paths, numbers with bounds, a choice, a flag), given;
    the server then stops at the missing config directory, after the options were read."""
    args = ["serve", "-c", "/nonexistent/mesh", "--debounce", "0.2", "--max-names-per-stream", "10"]
    args += ["--log-level", "WARNING", "--tls-cert", "/nonexistent/cert.pem", "--allow-empty-mesh"]
    command = [sys.executable, "-c", PARSE_ONLY, *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert "no such file or directory: /nonexistent/mesh" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "pydantic loaded: False"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--debounce", "soon"], "Input should be a valid number, unable to parse string as a number"),
        (["--max-names-per-stream", "many"], "Input should be a valid integer"),
        (["--history-size", "0"], "Input should be greater than or equal to 1"),
        (["--log-format", "xml"], "xml' is not one of text, json"),
    ],
)
def test_a_wrong_value_is_refused_naming_the_option(args: list[str], words: str) -> None:
    command = [*meshctl_command(), "serve", "-c", "/nonexistent/mesh", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    text = " ".join(proc.stderr.replace("│", " ").split())  # the error box's lines joined
    assert args[0] in text and words in text, proc.stderr
