"""The CA's files and the serve flags, as `meshctl serve` meets them: a CA that nears its end is
said (log and metrics), one that has passed it is an error every minute, a key without its root
is never overwritten, state files get the config directory's protections, and duration flags
take only what the server can live with.

Each test runs the real `meshctl serve` command: the claims are about what an operator sees.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import EXAMPLES
from test_ca import Issuer, make_ca_cert, write_cacerts

from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeProcess, limited_meshctl_command, meshctl_command

pytestmark = pytest.mark.slow

#: Far above what serve needs, far below what reading /dev/zero whole would take.
_MEMORY_LIMIT = 2 * 1024**3


def serve_once(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`meshctl serve` on the examples with `args`, expected to stop by itself (exit 2)."""
    flags = ["-c", str(EXAMPLES), "--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]
    return subprocess.run(
        [*limited_meshctl_command(_MEMORY_LIMIT), "serve", *flags, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def plug_in_ca(directory: Path, *, expires_in: timedelta) -> tuple[Path, Issuer]:
    now = datetime.now(UTC)
    since = now - timedelta(days=1)
    root = make_ca_cert("Example Corp root", not_before=since, not_after=now + timedelta(days=3650))
    intermediate = make_ca_cert("Example Corp mesh", root, not_before=since, not_after=now + expires_in)
    return write_cacerts(directory, intermediate, root), root


# -- the CA's end ---------------------------------------------------------------------------------


def test_a_plug_in_ca_near_its_end_is_said_at_start_and_in_metrics(tmp_path: Path) -> None:
    cacerts, root = plug_in_ca(tmp_path / "cacerts", expires_in=timedelta(days=10))
    with ServeProcess([EXAMPLES], extra_args=["--ca-dir", str(cacerts)]) as server:
        log = server.log()
        assert f"signed by the plug-in CA {cacerts} (found): CN=Example Corp mesh" in log
        warning = next(line for line in log.splitlines() if "expires at" in line)
        assert "WARNING" in warning and str(cacerts) in warning and "CA certificate CN=Example Corp mesh" in warning
        assert "in 10.0 days" in warning or "in 9.9 days" in warning
        metrics = dict(
            line.rsplit(" ", 1) for line in server.admin("/metrics").splitlines() if line.startswith("citadel_server")
        )
        left = float(metrics["citadel_server_cert_chain_expiry_seconds"])
        assert 9 * 86400 < left <= 10 * 86400
        assert float(metrics["citadel_server_root_cert_expiry_timestamp"]) == root.cert.not_valid_after_utc.timestamp()


def test_a_ca_that_expires_while_serving_is_an_error_from_that_moment(tmp_path: Path) -> None:
    cacerts, _ = plug_in_ca(tmp_path / "cacerts", expires_in=timedelta(seconds=10))
    with ServeProcess([EXAMPLES], extra_args=["--ca-dir", str(cacerts)]) as server:
        assert "WARNING" in next(line for line in server.log().splitlines() if "expires at" in line)
        deadline = time.monotonic() + 60
        while "expired at" not in server.log():
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.2)
        error = next(line for line in server.log().splitlines() if "expired at" in line)
        assert "ERROR" in error and str(cacerts) in error and "no workload certificate can be issued" in error


# -- the self-signed root's files -------------------------------------------------------------------


def test_a_deleted_root_is_never_replaced_over_its_key(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with ServeProcess([EXAMPLES], extra_args=["--state-dir", str(state)]) as server:
        assert f"signed by the self-signed root CA {state / 'ca'} (made now)" in server.log()
    key = (state / "ca" / "ca-key.pem").read_bytes()
    with ServeProcess([EXAMPLES], extra_args=["--state-dir", str(state)]) as server:
        assert f"signed by the self-signed root CA {state / 'ca'} (found)" in server.log()
    (state / "ca" / "root-cert.pem").unlink()
    line = one_error_line(serve_once("--state-dir", str(state)))
    assert "ca-key.pem exists but" in line and "restore root-cert.pem" in line
    assert (state / "ca" / "ca-key.pem").read_bytes() == key
    assert not (state / "ca" / "root-cert.pem").exists()


@pytest.mark.parametrize("what", ["fifo", "dev-zero", "huge"])
@pytest.mark.parametrize("name", ["root-cert.pem", "ca-key.pem"])
def test_state_files_that_are_no_regular_file_are_refused_at_once(tmp_path: Path, what: str, name: str) -> None:
    state = tmp_path / "state"
    with ServeProcess([EXAMPLES], extra_args=["--state-dir", str(state)]):
        pass
    path = state / "ca" / name
    path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (2 * 1024 * 1024))
    line = one_error_line(serve_once("--state-dir", str(state)))
    assert str(path) in line
    assert ("over 1048576 bytes" if what == "huge" else "not a regular file") in line


def test_a_plug_in_ca_key_others_can_read_is_warned_about(tmp_path: Path) -> None:
    cacerts, _ = plug_in_ca(tmp_path / "cacerts", expires_in=timedelta(days=365))
    (cacerts / "ca-key.pem").chmod(0o644)
    with ServeProcess([EXAMPLES], extra_args=["--ca-dir", str(cacerts)]) as server:
        warning = next(line for line in server.log().splitlines() if "chmod 600" in line)
        assert f"{cacerts / 'ca-key.pem'} is readable by everyone (mode 0644)" in warning
    (cacerts / "ca-key.pem").chmod(0o600)
    with ServeProcess([EXAMPLES], extra_args=["--ca-dir", str(cacerts)]) as server:
        assert "chmod 600" not in server.log()


# -- flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--registry-sync-timeout", "nan", "not a finite number of seconds"),
        ("--registry-sync-timeout", "-1", "not a finite number of seconds"),
        ("--registry-sync-timeout", "inf", "not a finite number of seconds"),
        ("--debounce", "nan", "not a finite number of seconds"),
        ("--debounce", "-1", "not a finite number of seconds"),
        ("--debounce", "inf", "not a finite number of seconds"),
        ("--debounce-max", "inf", "not a finite number of seconds"),
        ("--max-new-streams-per-second", "nan", "not a finite number"),
        ("--workload-cert-lifetime", "1s", "shorter than renewal can serve"),
        ("--workload-cert-lifetime", "99999999999999h", "longer than the CA lives"),
        ("--max-connection-age", "99999999999999h", "over gRPC's longest"),
    ],
)
def test_durations_the_server_cannot_live_with_are_refused(tmp_path: Path, flag: str, value: str, words: str) -> None:
    line = one_error_line(serve_once("--state-dir", str(tmp_path / "state"), flag, value, timeout=30))
    assert flag in line and words in line


def test_a_certificate_lifetime_past_any_date_is_refused(tmp_path: Path) -> None:
    args = ["ca", "issue", "--proxy", "web.shop", "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path)]
    cmd = [*meshctl_command(), *args, "--lifetime", "99999999999999h"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert "--lifetime '99999999999999h' is longer than the CA lives" in one_error_line(proc)


def test_insecure_send_keys_beyond_loopback_says_it_hands_out_private_keys(tmp_path: Path) -> None:
    args = ["--insecure-send-keys", "--xds-address", f"0.0.0.0:{free_port()}"]
    with ServeProcess([EXAMPLES], extra_args=args) as server:
        warning = next(line for line in server.log().splitlines() if "--insecure-send-keys on" in line)
        assert "PRIVATE KEY" in warning and "0.0.0.0" in warning
