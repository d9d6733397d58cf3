"""Log output: text for people, JSON for shippers, and no doubled timestamps under journald."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
from conftest import EXAMPLES, examples_copy
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.logs import configure_logging, under_journald

TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes the root logger; give the next test the one it had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    watchdog_level = logging.getLogger("watchdog").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("watchdog").setLevel(watchdog_level)


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[TextIO]:
    """A real file, so the stream has the device and inode journald detection compares."""
    with (tmp_path / "stderr").open("w+") as f:
        yield f


def journal_stream_of(f: TextIO) -> str:
    st = os.fstat(f.fileno())
    return f"{st.st_dev}:{st.st_ino}"


def lines(f: TextIO) -> list[str]:
    f.flush()
    f.seek(0)
    return f.read().splitlines()


def test_text_outside_journald_has_timestamps(stream: TextIO) -> None:
    configure_logging("info", "text", environ={}, stream=stream)
    logging.getLogger("meshctl.test").info("serving %d proxies", 3)
    logging.getLogger("meshctl.test").debug("not shown at info")
    [line] = lines(stream)
    assert re.fullmatch(TIMESTAMP + r" INFO meshctl\.test: serving 3 proxies", line), line


def test_text_under_journald_has_priorities_and_no_timestamps(stream: TextIO) -> None:
    configure_logging("debug", "text", environ={"JOURNAL_STREAM": journal_stream_of(stream)}, stream=stream)
    log = logging.getLogger("meshctl.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    out = lines(stream)
    assert out[:4] == [
        "<7>DEBUG meshctl.test: d",
        "<6>INFO meshctl.test: i",
        "<4>WARNING meshctl.test: w",
        "<3>ERROR meshctl.test: failed",
    ]
    # journald splits on newlines: every line of the traceback keeps the error priority.
    assert len(out) > 5
    assert all(line.startswith("<3>") for line in out[3:])
    assert out[-1] == "<3>ValueError: boom"


def test_journal_stream_of_another_file_is_not_journald(stream: TextIO, tmp_path: Path) -> None:
    with (tmp_path / "journal").open("w") as journal:
        environ = {"JOURNAL_STREAM": journal_stream_of(journal)}
        assert under_journald(journal, environ)
        assert not under_journald(stream, environ)  # stderr redirected: keep the timestamps
    configure_logging("info", "text", environ=environ, stream=stream)
    logging.getLogger("meshctl.test").info("hello")
    assert re.fullmatch(TIMESTAMP + r" INFO meshctl\.test: hello", lines(stream)[0])


@pytest.mark.parametrize("value", ["", "garbage", "1:", ":2", "a:b"])
def test_malformed_journal_stream_is_not_journald(stream: TextIO, value: str) -> None:
    assert not under_journald(stream, {"JOURNAL_STREAM": value})


def test_json_lines(stream: TextIO) -> None:
    configure_logging("info", "json", environ={}, stream=stream)
    log = logging.getLogger("meshctl.server")
    log.warning("proxy %s NACKed", "reviews", extra={"proxy": "reviews-v1-vm.bookinfo", "path": Path("/etc/x")})
    try:
        raise RuntimeError("bad snapshot")
    except RuntimeError:
        log.exception("publishing failed")
    first, second = (json.loads(line) for line in lines(stream))
    assert re.fullmatch(TIMESTAMP, first.pop("time"))
    assert first == {
        "level": "warning",
        "logger": "meshctl.server",
        "message": "proxy reviews NACKed",
        "proxy": "reviews-v1-vm.bookinfo",
        "path": "/etc/x",
    }
    assert second["level"] == "error"
    assert second["exception"].startswith("Traceback")
    assert second["exception"].endswith("RuntimeError: bad snapshot")


def test_json_under_journald_keeps_time_and_gains_priority(stream: TextIO) -> None:
    configure_logging("info", "json", environ={"JOURNAL_STREAM": journal_stream_of(stream)}, stream=stream)
    logging.getLogger("meshctl.test").error("e")
    [line] = lines(stream)
    assert line.startswith("<3>{")
    entry = json.loads(line[3:])
    assert entry["message"] == "e"
    assert "time" in entry


def test_configuring_again_replaces_the_handler(stream: TextIO) -> None:
    configure_logging("warning", "text", environ={}, stream=stream)
    configure_logging("info", "json", environ={}, stream=stream)
    logging.getLogger("meshctl.test").info("once")
    [line] = lines(stream)
    assert json.loads(line)["message"] == "once"


def test_debug_keeps_the_file_watcher_library_quiet(stream: TextIO) -> None:
    configure_logging("debug", "text", environ={}, stream=stream)
    logging.getLogger("watchdog.observers").debug("in-event")
    logging.getLogger("meshctl.config.watcher").debug("reloading")
    assert [line.split(" ", 1)[1] for line in lines(stream)] == ["DEBUG meshctl.config.watcher: reloading"]


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "text"), ("info", "yaml")])
def test_unknown_level_or_format(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match=level if level == "verbose" else fmt):
        configure_logging(level, fmt, environ={})


# -- through the CLI -------------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "value"), [("MESHCTL_LOG_FORMAT", "yaml"), ("MESHCTL_LOG_LEVEL", "loud")])
def test_serve_rejects_a_bad_log_setting_from_the_environment(variable: str, value: str) -> None:
    result = CliRunner().invoke(app, ["serve"], env={"MESHCTL_CONFIG_DIR": str(EXAMPLES), variable: value})
    assert result.exit_code == 2
    assert value in result.output


def _serve_until_serving(tmp_path: Path, env: dict[str, str], journal: bool = False) -> list[str]:
    """Run `meshctl serve` with `env` until it logs that it serves, stop it, return its stderr lines."""
    config = examples_copy(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MESHCTL_", "JOURNAL_STREAM", "NOTIFY_SOCKET"))}
    base |= {
        "MESHCTL_CONFIG_DIR": str(config),
        "MESHCTL_XDS_ADDRESS": "127.0.0.1:0",
        "MESHCTL_ADMIN_ADDRESS": "127.0.0.1:0",
        **env,
    }
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("wb") as stderr:
        if journal:
            st = os.fstat(stderr.fileno())
            base["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        proc = subprocess.Popen([sys.executable, "-m", "meshctl", "serve"], env=base, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while "serving xDS on" not in stderr_path.read_text():
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return stderr_path.read_text().splitlines()


@pytest.mark.slow
def test_serve_logs_json_when_the_environment_says_so(tmp_path: Path) -> None:
    out = _serve_until_serving(tmp_path, {"MESHCTL_LOG_FORMAT": "json"})
    entries = [json.loads(line) for line in out]  # every line is one JSON object
    serving = [e for e in entries if e["message"].startswith("serving xDS on 127.0.0.1:")]
    assert len(serving) == 1
    assert serving[0]["logger"] == "meshctl.server"
    assert serving[0]["level"] == "info"


@pytest.mark.slow
def test_serve_under_journald_logs_without_timestamps(tmp_path: Path) -> None:
    out = _serve_until_serving(tmp_path, {"MESHCTL_LOG_LEVEL": "INFO"}, journal=True)
    assert any(line.startswith("<6>INFO meshctl.server: serving xDS on 127.0.0.1:") for line in out), out
    assert all(re.match(r"<\d>[A-Z]+ ", line) for line in out), out


def test_the_default_handler_writes_to_stderr_as_it_is_now(capsys: pytest.CaptureFixture[str]) -> None:
    """A command run with its stderr swapped (a test runner, an embedding program) that closed
    it afterwards: later records go to the stderr of the moment, not to the closed stream."""

    swapped = io.StringIO()
    saved = sys.stderr
    sys.stderr = swapped
    try:
        handler = configure_logging("warning", "text", environ={})
    finally:
        sys.stderr = saved
        swapped.close()
    try:
        logging.getLogger("meshctl.test").warning("after the swap")
        err = capsys.readouterr().err
        assert "Logging error" not in err and "after the swap" in err
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.slow
def test_a_stop_signal_while_serve_starts_stops_it_cleanly(tmp_path: Path) -> None:
    """SIGTERM as soon as serve has read its config, before it serves: it stops as it would once
    serving (exit 0, "stopping" said), not killed by the signal's default action."""
    config = examples_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHCTL_", "JOURNAL_STREAM", "NOTIFY_SOCKET"))}
    stderr_path = tmp_path / "stderr"
    command = [sys.executable, "-m", "meshctl", "serve", "--config-dir", str(config)]
    command += ["--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(command, env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while "config revision 1" not in stderr_path.read_text():
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopping: closing xDS streams" in stderr_path.read_text()
