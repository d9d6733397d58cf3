"""The systemd units in systemd/: valid for systemd, hardened, and in step with the CLI they run.

`systemd-analyze verify` and `security` check the units as systemd reads them (skipped where
systemd-analyze is not installed). The rest needs no systemd: the directives the units promise,
the commands they run (the flags must be ones the CLI knows, the variables ones it reads), and
the Envoy unit's bootstrap and Envoy command lines run for real, expanded as systemd would.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import typer.main
from conftest import (
    ENVOY_UNIT,
    INSTANCE,
    NODE_ID,
    UNITS,
    command_line,
    envoy_start,
    examples_copy,
    expand_specifiers,
    one,
    run_start_pre,
    service_section,
)
from ruamel.yaml import YAML

from meshctl.cli.app import app
from meshctl.server.settings import ServeSettings
from meshctl.testing.ads_client import AdsClient

MESHCTL_UNIT = UNITS / "meshctl.service"
GIT_SYNC_UNITS = (UNITS / "meshctl-git-sync.service", UNITS / "meshctl-git-sync.timer")
RENEW_UNIT, RENEW_TIMER = UNITS / "meshctl-ca-renew@.service", UNITS / "meshctl-ca-renew@.timer"

#: Variables systemd itself sets for a service's commands (systemd.exec(5)).
SYSTEMD_VARIABLES = {"MAINPID", "RUNTIME_DIRECTORY", "CREDENTIALS_DIRECTORY"}


# -- reading units ------------------------------------------------------------------------------
# parse_unit, one and the expansion of Exec*= lines are in conftest.py: test_envoy_unit_stop.py and
# test_vm_setup_doc.py run the units too.


def documented_settings(path: Path) -> dict[str, str]:
    """The example environment in a unit's comments: `#   NAME=value   explanation` lines."""
    settings = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"#\s+([A-Z][A-Z0-9_]*)=(.*?)(?:\s{2,}.*)?", line)
        if match:
            settings[match.group(1)] = match.group(2)
    return settings


def referenced_variables(path: Path) -> set[str]:
    """The environment variables the Exec*= lines read: `$NAME`, `${NAME}` and the shell's `$${NAME}`,
    but not a variable a shell script of theirs sets itself (`version=v4; ... $$version`)."""
    text = " ".join(v for key, values in service_section(path).items() if key.startswith("Exec") for v in values)
    local = set(re.findall(r"(?:^|[\s;'])([A-Za-z_][A-Za-z0-9_]*)=", text))
    return set(re.findall(r"\$\$?\{?([A-Za-z_][A-Za-z0-9_]*)", text)) - local


# -- the CLI the units run ----------------------------------------------------------------------


def command(name: str) -> Any:
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def flags(name: str) -> set[str]:
    return {opt for p in command(name).params for opt in (*p.opts, *p.secondary_opts)}


def envvars(name: str) -> set[str]:
    return {p.envvar for p in command(name).params if p.envvar}


def long_flags(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("-")]


# -- systemd-analyze ----------------------------------------------------------------------------


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    return path


def systemd_version(analyze: str) -> int:
    first = subprocess.run([analyze, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.match(r"systemd (\d+)", first)
    assert match, first
    return int(match.group(1))


@pytest.fixture
def installable_units(tmp_path: Path) -> Iterator[list[Path]]:
    """Copies of the units whose programs exist here: verify checks that ExecStart= is executable,
    and /usr/local/bin/meshctl and envoy are where a host installs them, not where a test runs."""
    copies = []
    for unit in (MESHCTL_UNIT, ENVOY_UNIT, *GIT_SYNC_UNITS, RENEW_UNIT, RENEW_TIMER):
        text = unit.read_text()
        for program in ("/usr/local/bin/meshctl", "/usr/local/bin/envoy", "/usr/local/lib/meshctl/meshctl-git-sync"):
            text = text.replace(program, sys.executable)
        copy = tmp_path / unit.name
        copy.write_text(text)
        copies.append(copy)
    yield copies


def test_systemd_analyze_verify(installable_units: list[Path]) -> None:
    analyze = systemd_analyze()
    result = subprocess.run(
        [analyze, "verify", "--man=no", *map(str, installable_units)], capture_output=True, text=True, check=False
    )
    # verify exits 0 on unknown directives and bad values, which it only prints: any word about
    # our units is a finding. (Lines about the system's own units are not ours to fix.)
    ours = [line for line in result.stderr.splitlines() if "meshctl" in line or "envoy-sidecar" in line]
    # (The git-sync service is Before= and WantedBy= meshctl.service: verify loads the copy beside it.)
    assert result.returncode == 0 and not ours, result.stderr


def test_systemd_analyze_security(installable_units: list[Path]) -> None:
    analyze = systemd_analyze()
    if systemd_version(analyze) < 250:
        pytest.skip("systemd-analyze security --offline needs systemd 250")
    for unit in (u for u in installable_units if u.suffix == ".service"):
        # --threshold is in tenths: 20 fails a unit whose exposure rises above 2.0 ("OK" is < 2.5).
        result = subprocess.run(
            [analyze, "security", "--offline=yes", "--threshold=20", "--no-pager", str(unit)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr


# -- meshctl.service ----------------------------------------------------------------------------


HARDENING = {
    "DynamicUser": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "NoNewPrivileges": "yes",
    "ReadOnlyPaths": "/etc/meshctl",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "SystemCallFilter": "@system-service",
    "SystemCallArchitectures": "native",
    "LockPersonality": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        *HARDENING.items(),
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("EnvironmentFile", "-/etc/meshctl/meshctl.env"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("Restart", "on-failure"),
        ("WatchdogSec", "30s"),
        ("MemoryDenyWriteExecute", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("LimitNOFILE", "65536"),
    ],
)
def test_meshctl_unit_directive(key: str, value: str) -> None:
    assert one(MESHCTL_UNIT, key) == value


def test_meshctl_unit_restarts_after_a_pause_and_outlasts_the_drain() -> None:
    assert one(MESHCTL_UNIT, "RestartSec")
    stop = re.fullmatch(r"(\d+)s", one(MESHCTL_UNIT, "TimeoutStopSec"))
    assert stop, "TimeoutStopSec in seconds"
    # SIGKILL must not cut the drain short: Envoy would see a reset instead of a clean close.
    assert int(stop.group(1)) > ServeSettings(config_dirs=()).drain_seconds


def test_meshctl_unit_runs_serve_with_flags_it_knows() -> None:
    argv = shlex.split(one(MESHCTL_UNIT, "ExecStart"))
    assert argv[:2] == ["/usr/local/bin/meshctl", "serve"]
    assert set(long_flags(argv[2:])) <= flags("serve")


def test_meshctl_unit_variables_are_ones_serve_reads() -> None:
    assigned = {v.split("=", 1)[0] for v in service_section(MESHCTL_UNIT).get("Environment", [])}
    documented = set(documented_settings(MESHCTL_UNIT))
    assert documented, "the unit documents its settings"
    assert assigned | documented <= envvars("serve")
    assert referenced_variables(MESHCTL_UNIT) <= SYSTEMD_VARIABLES | envvars("serve")
    # --config-dir is required: the unit gives it, on the command line or in the environment.
    assert "MESHCTL_CONFIG_DIR" in assigned or "--config-dir" in one(MESHCTL_UNIT, "ExecStart")


def test_every_serve_flag_has_its_meshctl_variable() -> None:
    for param in command("serve").params:
        assert param.envvar == f"MESHCTL_{param.name.upper()}", param.opts


def test_serve_reads_every_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {
        "MESHCTL_CONFIG_DIR": "/etc/meshctl/mesh:/etc/meshctl/gateways",
        "MESHCTL_XDS_ADDRESS": "0.0.0.0:15010",
        "MESHCTL_ADMIN_ADDRESS": "127.0.0.1:9914",
        "MESHCTL_CONSUL": "127.0.0.1:8500",
        "MESHCTL_CONSUL_TOKEN": "secret",
        "MESHCTL_CONSUL_CA_FILE": "/etc/ssl/consul.pem",
        "MESHCTL_CONSUL_DATACENTER": "dc2",
        "MESHCTL_NAMESPACE": "bookinfo",
        "MESHCTL_DEBOUNCE": "0.5",
        "MESHCTL_DEBOUNCE_MAX": "3",
        "MESHCTL_LOG_LEVEL": "DEBUG",
        "MESHCTL_LOG_FORMAT": "json",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    params = command("serve").make_context("serve", []).params
    assert params["config_dir"] == [Path("/etc/meshctl/mesh"), Path("/etc/meshctl/gateways")]
    assert params["xds_address"] == "0.0.0.0:15010"
    assert params["admin_address"] == "127.0.0.1:9914"
    assert (params["consul"], params["consul_token"]) == ("127.0.0.1:8500", "secret")
    assert (params["consul_ca_file"], params["consul_datacenter"]) == ("/etc/ssl/consul.pem", "dc2")
    assert params["namespace"] == "bookinfo"
    assert (params["debounce"], params["debounce_max"]) == (0.5, 3.0)
    assert (params["log_level"], params["log_format"]) == ("debug", "json")
    # A flag still wins over the environment, so `meshctl serve --log-level info` on a host with
    # the env file exported does what it says.
    assert command("serve").make_context("serve", ["--log-level", "info"]).params["log_level"] == "info"


# -- envoy-sidecar@.service ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        *HARDENING.items(),
        ("EnvironmentFile", "/etc/meshctl/envoy-%i.env"),
        ("RuntimeDirectory", "envoy-%i"),
        ("Restart", "on-failure"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ],
)
def test_envoy_unit_directive(key: str, value: str) -> None:
    assert one(ENVOY_UNIT, key) == value


def envoy_command(tmp_path: Path, environ: Mapping[str, str]) -> list[str]:
    """The envoy command line ExecStart= runs: its shell script, run with `environ` up to its
    `exec`, which prints the command instead (specifiers expanded, `$$` as systemd makes it `$`)."""
    start = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStart"), tmp_path), environ)
    assert start[:2] == ["/bin/sh", "-c"]
    script = start[2].replace("exec /usr/local/bin/envoy", "exec /usr/bin/env printf '%s\\n' /usr/local/bin/envoy")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} once in {argv}"
    return argv[argv.index(name) + 1]


def test_envoy_unit_writes_the_bootstrap_envoy_reads(tmp_path: Path) -> None:
    pre = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStartPre"), tmp_path), {})
    start = envoy_command(tmp_path, {})
    bootstrap = tmp_path / f"envoy-{INSTANCE}" / "envoy.yaml"
    assert pre[:2] == ["/bin/sh", "-c"]
    assert pre[2].endswith(f'> "{bootstrap}"')
    assert start[0] == "/usr/local/bin/envoy"
    assert flag(start, "-c") == str(bootstrap)
    assert expand_specifiers(one(ENVOY_UNIT, "RuntimeDirectory"), tmp_path) == bootstrap.parent.name
    # The stop finds the admin API where Envoy writes its address, beside the bootstrap.
    assert flag(start, "--admin-address-path") == str(bootstrap.parent / "admin.address")
    assert str(bootstrap.parent / "admin.address") in expand_specifiers(one(ENVOY_UNIT, "ExecStop"), tmp_path)


@pytest.mark.parametrize(
    ("environ", "drain", "version"),
    [
        ({}, "45", "v4"),
        ({"MESHCTL_VM_IP": "10.10.0.41", "MESHCTL_DRAIN_DURATION": "30"}, "30", "v4"),
        ({"MESHCTL_VM_IP": "fd00::41"}, "45", "v6"),
    ],
)
def test_envoy_unit_starts_envoy_with_istios_flags(
    tmp_path: Path, environ: dict[str, str], drain: str, version: str
) -> None:
    """pilot-agent's flags (pkg/envoy/proxy.go `args`): the drain time (ProxyConfig drainDuration,
    45 s by default), immediate drain, the local address version of the proxy's address, a
    one-second access log flush, no hot restart; then ENVOY_ARGS, word by word."""
    start = envoy_command(tmp_path, {**environ, "ENVOY_ARGS": "--concurrency 2  --log-level info"})
    assert flag(start, "--drain-time-s") == drain
    assert flag(start, "--drain-strategy") == "immediate"
    assert flag(start, "--local-address-ip-version") == version
    assert flag(start, "--file-flush-interval-msec") == "1000"
    assert "--disable-hot-restart" in start
    assert flag(start, "--log-format") == "[%l][%n] %v"
    assert start[-4:] == ["--concurrency", "2", "--log-level", "info"]


def test_envoy_unit_bootstrap_flags_are_ones_meshctl_bootstrap_knows(tmp_path: Path) -> None:
    script = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStartPre"), tmp_path), {})[2]
    argv = shlex.split(script.split(">", 1)[0])
    assert argv[:3] == ["exec", "/usr/local/bin/meshctl", "bootstrap"]
    used = set(long_flags(argv[3:]))
    assert {"--proxy", "--ip", "--xds-address", "-o"} <= used
    documented = long_flags(documented_settings(ENVOY_UNIT)["MESHCTL_BOOTSTRAP_ARGS"].split())
    assert used | set(documented) <= flags("bootstrap")


def test_envoy_unit_documents_every_variable_it_reads() -> None:
    documented = set(documented_settings(ENVOY_UNIT))
    assert {"MESHCTL_VM_IP", "MESHCTL_XDS_ADDRESS"} <= documented
    assert referenced_variables(ENVOY_UNIT) - SYSTEMD_VARIABLES == documented


@pytest.mark.slow
def test_envoy_unit_commands_run_as_documented(tmp_path: Path) -> None:
    environ = documented_settings(ENVOY_UNIT)
    result = run_start_pre(tmp_path, environ)
    assert result.returncode == 0, result.stderr
    bootstrap_path = tmp_path / f"envoy-{INSTANCE}" / "envoy.yaml"
    bootstrap = YAML(typ="safe").load(bootstrap_path.read_text())
    assert bootstrap["node"]["id"] == NODE_ID
    assert bootstrap["admin"]["address"]["socket_address"]["port_value"] == 15001

    # Envoy checks the bootstrap and every flag, including ENVOY_ARGS, without serving.
    validating = {**environ, "ENVOY_ARGS": environ["ENVOY_ARGS"] + " --mode validate"}
    argv = envoy_start(tmp_path, validating)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **validating}
    checked = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK" in checked.stdout + checked.stderr


@pytest.mark.slow
def test_envoy_unit_names_the_env_file_when_a_setting_is_missing(tmp_path: Path) -> None:
    environ = {k: v for k, v in documented_settings(ENVOY_UNIT).items() if k != "MESHCTL_VM_IP"}
    result = run_start_pre(tmp_path, environ)
    assert result.returncode != 0
    assert f"MESHCTL_VM_IP: is not set in /etc/meshctl/envoy-{INSTANCE}.env" in result.stderr


# -- MemoryDenyWriteExecute ---------------------------------------------------------------------

#: Runs `meshctl serve` after turning on the kernel's memory-deny-write-execute (prctl
#: PR_SET_MDWE = 65 with PR_MDWE_REFUSE_EXEC_GAIN = 1, Linux 6.3), which refuses writable and
#: executable mappings as systemd's MemoryDenyWriteExecute= does.
_UNDER_MDWE = """
import ctypes, mmap, runpy, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(77)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("a writable and executable mapping was allowed")
except PermissionError:
    pass
sys.argv = ["meshctl", *sys.argv[1:]]
runpy.run_module("meshctl", run_name="__main__")
"""


def _mdwe_supported() -> bool:
    """Ask in a child (PR_GET_MDWE = 66): MDWE cannot be turned off, so this process never turns it on."""
    probe = "import ctypes, sys; sys.exit(0 if ctypes.CDLL(None).prctl(66, 0, 0, 0, 0) >= 0 else 1)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


@pytest.mark.slow
def test_serve_works_without_writable_executable_memory(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux") or not _mdwe_supported():
        pytest.skip("the kernel has no PR_SET_MDWE (Linux 6.3+)")
    config = examples_copy(tmp_path)
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-c", _UNDER_MDWE, "serve", "--config-dir", str(config)]
    argv += ["--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHCTL_", "NOTIFY_SOCKET", "JOURNAL_STREAM"))}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"serving xDS on \S+:(\d+)", log.read_text())):
            if proc.poll() is not None:
                if proc.returncode == 77:
                    pytest.skip("PR_SET_MDWE refused")
                pytest.fail(f"meshctl serve died under MDWE ({proc.returncode}):\n{log.read_text()[-3000:]}")
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

        async def fetch() -> bool:
            async with AdsClient(f"127.0.0.1:{match.group(1)}", NODE_ID) as client:
                await client.wait_for(lambda c: c.complete(), timeout=30)
                return bool(client.resources)

        assert asyncio.run(fetch())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the certificate renewal units ---------------------------------------------------------------


def timer_section(path: Path) -> dict[str, str]:
    section, values = "", {}
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Timer]" and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_renewal_timer_runs_often_with_jitter() -> None:
    timer = timer_section(RENEW_TIMER)
    assert timer["RandomizedDelaySec"] and timer["OnUnitInactiveSec"]


def run_renewal(tmp_path: Path, environ: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """ExecStart= of the renewal unit as systemd runs it, with this venv's CLI."""
    argv = command_line(expand_specifiers(one(RENEW_UNIT, "ExecStart"), tmp_path), environ)
    assert "exec /usr/local/bin/meshctl ca renew " in argv[2]
    argv[2] = argv[2].replace("/usr/local/bin/meshctl", f"{shlex.quote(sys.executable)} -m meshctl")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)


def test_renewal_unit_runs_ca_renew_with_flags_it_knows_and_documents_its_variables() -> None:
    renew = typer.main.get_command(app).commands["ca"].commands["renew"]  # type: ignore[attr-defined]
    known = {opt for p in renew.params for opt in p.opts}
    script = command_line(expand_specifiers(one(RENEW_UNIT, "ExecStart"), Path("/run")), {})[2]
    documented = documented_settings(RENEW_UNIT)
    used = set(long_flags(shlex.split(script))) | set(long_flags(documented["MESHCTL_RENEW_ARGS"].split()))
    assert {"--server", "--dir"} <= used <= known
    assert referenced_variables(RENEW_UNIT) == set(documented)


@pytest.mark.slow
def test_renewal_unit_command_runs_and_names_the_env_file(tmp_path: Path) -> None:
    certs = tmp_path / "xds"
    issued = subprocess.run(
        [sys.executable, "-m", "meshctl", "ca", "issue", "--proxy", INSTANCE, "--out", str(certs),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    environ = {"MESHCTL_XDS_ADDRESS": "127.0.0.1:1", "MESHCTL_XDS_CERT_DIR": str(certs)}
    # A certificate just issued is not due: the run does nothing and succeeds, server or not.
    result = run_renewal(tmp_path, environ)
    assert result.returncode == 0 and "is not due" in result.stderr, result.stderr
    missing = run_renewal(tmp_path, {"MESHCTL_XDS_CERT_DIR": str(certs)})
    assert missing.returncode != 0
    assert f"MESHCTL_XDS_ADDRESS: is not set in /etc/meshctl/envoy-{INSTANCE}.env" in missing.stderr
