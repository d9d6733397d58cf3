"""docs/vm-setup.md, run: the walkthrough's commands work, and do what the page says they do.

The page marks each ```sh block with an HTML comment just before it:

- `<!-- test: NAME -->`: run here, in page order, with `bash -euo pipefail -c`; `NAME, background`
  blocks keep running (the stand-in apps) until the test ends, or until a later block that
  `replaces` them starts (the page restarts an app elsewhere). `EXPECTED` below says, per name,
  the exit status and what the output must show (regexes over the rewritten output, see below;
  `<PORT>` stands for the port that replaced the page's PORT); a block whose output is only true
  after a push has reached Envoy is run again until it shows it, up to `DEADLINE`.
- `<!-- host-only -->`: only makes sense on a real host (pip, scp, systemctl); skipped.
- `<!-- host-only: NAME -->`: skipped too, but the test does its part by other means at that
  point (`HOST_STEPS`): the `LoadCredential=` lines of the drop-ins are honoured by copying the
  files into a credentials directory; `systemctl enable --now meshctl` runs `ExecStart=` of
  systemd/meshctl.service with its environment and env file; `systemctl enable --now
  envoy-sidecar@INSTANCE` runs `ExecStartPre=` (the bootstrap) and `ExecStart=` (Envoy) of
  systemd/envoy-sidecar@.service as systemd would, one Envoy per instance; installing
  systemd/meshctl-resolved.conf makes this test play systemd-resolved: before each block, every
  name of a curl URL in the block that falls under the drop-in's `Domains=` is looked up with a
  real DNS client at its `DNS=` (the Envoy's DNS listener), and the answer becomes a curl
  `resolve` entry (no answer, no entry: curl fails and a waiting block tries again); stopping
  and starting Consul stops and starts the fake Consul that stands in for the control plane's
  agent.

An unmarked ```sh block fails the test, so every command of the page is either run or knowingly
skipped.

All of it runs on loopback, one temporary directory standing for the hosts' file systems. Every
block and unit line is rewritten first (`Rewriter`):

- paths: `/etc/meshctl`, `/srv`, `/run` (systemd's `%t`, and `/run/credentials`) and
  `/var/lib/meshctl` (meshctl's state directory, where its CA lives) move under the temporary
  directory; `/usr/local/bin/meshctl` and `/usr/local/bin/envoy` in the units become this venv's;
- addresses: `10.10.0.N` becomes `127.0.0.N` (control plane 127.0.0.1, the VMs 127.0.0.41 and,
  from section 9, 127.0.0.52);
- ports: 15010 (xDS), 15014 (meshctl admin), 15000 (Envoy admin), 15053 (Envoy's DNS listener),
  8500 (Consul), 9080 and 9443
  (service ports, which Envoy binds on 127.0.0.1), 8443 (inventory's ingress port, on
  127.0.0.52) and 8080 (the apps) become free ports, so the test runs beside anything else on
  this machine. Each VM has an Envoy admin port 15000 and a DNS port 15053 of its own on 127.0.0.1: the blocks that
  run on the second VM (`Expected.on`) get another free port for it.

Commands run in a clean environment (no MESHCTL_* or proxy variables of this shell) with this
venv's bin first on PATH (`meshctl`, `python3`), `CURL_HOME` pointing at a `.curlrc` that plays
the part of the VM's resolver, `COLUMNS=200` as in a wide terminal (tables are cut to the width), and
`MESHCTL_STATE_DIR` naming the moved `/var/lib/meshctl`, the default `meshctl ca` has on a host.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, UNITS, command_line, expand_specifiers, needs_envoy

from meshctl.testing.envoy import envoy_binary, free_port
from meshctl.testing.fake_consul import FakeConsul

DOC = ROOT / "docs" / "vm-setup.md"
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
    pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in ("openssl", "curl", "jq")), reason="needs openssl, curl and jq"
    ),
]

#: How long a block that waits for a push may take to show what the page says.
DEADLINE = 20.0

#: The page's ports, replaced by free ones.
PORTS = (15010, 15014, 15000, 15053, 8500, 9080, 9443, 8443, 8080)
#: The ports each VM has one of on its own 127.0.0.1 (Envoy's admin): on loopback, they differ per VM.
VM_PORTS = (15000, 15053)
#: The VM of section 9, whose blocks get their own VM_PORTS.
INVENTORY_VM = "10.10.0.52"

#: The page's proxies, after the rewriting.
NODE = "sidecar~127.0.0.41~orders-vm.shop~shop.svc.cluster.local"
INVENTORY_NODE = "sidecar~127.0.0.52~inventory-v2.shop~shop.svc.cluster.local"


# -- reading the page ---------------------------------------------------------------------------

_MARKER = re.compile(r"<!--\s*(test|host-only)\s*(?::\s*([\w-]+)\s*(,\s*background\s*)?)?-->")


@dataclass(frozen=True)
class Block:
    line: int
    kind: str  # "test" or "host-only"
    name: str
    background: bool
    text: str


def read_blocks(path: Path) -> list[Block]:
    """Every ```sh block with its marker; an unmarked one is an error."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```sh":
            index += 1
            continue
        start = index
        previous = next((lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        marker = _MARKER.fullmatch(previous)
        assert marker, f"{path.name}:{start + 1}: a sh block needs <!-- test: NAME --> or <!-- host-only --> before it"
        end = lines.index("```", start + 1)
        kind, name, background = marker.group(1), marker.group(2) or "", bool(marker.group(3))
        assert kind == "test" or not background, f"{path.name}:{start + 1}: only test blocks run in the background"
        assert kind == "host-only" or name, f"{path.name}:{start + 1}: a test block needs a name"
        blocks.append(Block(start + 1, kind, name, background, "\n".join(lines[start + 1 : end]) + "\n"))
        index = end + 1
    names = [b.name for b in blocks if b.name]
    assert len(names) == len(set(names)), f"names used twice: {sorted(n for n in names if names.count(n) > 1)}"
    return blocks


class Rewriter:
    """The page's hosts, paths and ports, moved onto loopback and into a temporary directory.

    `vm` names the page's VM a text is for, when it is not the first: its VM_PORTS differ."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {port: free_port() for port in PORTS}
        self.vm_ports: dict[str, dict[int, int]] = {}

    def __call__(self, text: str, vm: str = "") -> str:
        paths = r"(?<![\w./])(/etc/meshctl|/srv|/run|/var/lib/meshctl)(?![\w.-])"
        text = re.sub(paths, lambda m: f"{self.root}{m.group(1)}", text)
        # Not \b: Envoy's stat names put an underscore after the address (`listener.10.10.0.52_8443`).
        text = re.sub(r"(?<!\d)(?<!\d\.)10\.10\.0\.(\d{1,3})(?!\d)", r"127.0.0.\1", text)
        ports = "|".join(map(str, PORTS))
        return re.sub(rf"(?<![\d.])({ports})(?!\d)", lambda m: str(self.port(int(m.group(1)), vm)), text)

    def port(self, port: int, vm: str = "") -> int:
        if vm and port in VM_PORTS:
            return self.vm_ports.setdefault(vm, {p: free_port() for p in VM_PORTS})[port]
        return self.ports[port]


# -- systemd, as far as these units need it -----------------------------------------------------


def unit_service(text: str) -> dict[str, list[str]]:
    """The [Service] section: directive -> values in order."""
    section = ""
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads them: the value is the rest of the line, spaces and all."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def load_credentials(block: str) -> tuple[str, list[tuple[str, str]]]:
    """The unit a drop-in block writes to, and its `LoadCredential=NAME:PATH` lines."""
    unit = re.search(r"/etc/systemd/system/([\w@.-]+)\.d/", block)
    assert unit, f"no drop-in directory in:\n{block}"
    pairs = [(m[1], m[2]) for m in re.finditer(r"^LoadCredential=([^:\s]+):(\S+)$", block, re.M)]
    assert pairs, f"no LoadCredential= in:\n{block}"
    return unit.group(1), pairs


# -- the walkthrough ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What the page says a block does: its exit status, and what its output shows (regexes
    searched in stdout and stderr together; one anchored with \\A is matched against stdout alone,
    what a curl printed)."""

    status: int = 0
    shows: tuple[str, ...] = ()
    #: Run again until it shows this: the block reads state a push or a watcher is bringing.
    wait: bool = False
    #: The page's VM the block runs on, when it is not the first (see `Rewriter`).
    on: str = ""
    #: A background block that this one takes the place of: it is stopped first.
    replaces: str = ""


def _synced() -> str:
    """The orders VM's proxy-status row: every type, SDS included, acknowledged."""
    return re.escape(NODE) + r"[\s│]+shop/orders-vm([\s│]+SYNCED){5}"


def _inventory_synced() -> str:
    """The inventory VM's row: it calls nothing, so it is sent no endpoints and no route configs."""
    return re.escape(INVENTORY_NODE) + r"[\s│]+shop/inventory-v2([\s│]+SYNCED){2}([\s│]+NOT SENT){2}[\s│]+SYNCED"


EXPECTED: dict[str, Expected] = {
    "mesh-files": Expected(),
    "validate": Expected(shows=("no problems found",)),
    "certificates": Expected(
        shows=(
            r"^made a new root CA in /\S+/var/lib/meshctl/ca \(trust domain cluster\.local\)$",
            r"^wrote /\S+/etc/meshctl/tls/xds/cert-chain\.pem, .*: 127\.0\.0\.1, valid until ",
            r"^wrote /\S+/etc/meshctl/tls/orders-vm\.shop/cert-chain\.pem, .*/key\.pem, .*/root-cert\.pem: "
            r"orders-vm\.shop and spiffe://cluster\.local/ns/shop/sa/orders, valid until ",
        )
    ),
    # Only the intermediate's key is on the host: the root's stays with the PKI.
    "own-ca": Expected(
        shows=(
            r"\Asubject=O ?= ?shop, CN ?= ?shop root CA\n"
            r"ca-cert\.pem\nca-key\.pem\ncert-chain\.pem\nroot-cert\.pem\n\Z",
        )
    ),
    "meshctl-env": Expected(),
    "ready": Expected(shows=(r"^ready$",), wait=True),
    "services": Expected(
        shows=(
            r"inventory\.shop\.mesh .*127\.0\.0\.51:<8080> app=inventory,version=v1 HEALTHY",
            r"inventory\.shop\.mesh .*127\.0\.0\.52:<8080> app=inventory,version=v2 HEALTHY",
            r"orders\.shop\.mesh .*127\.0\.0\.41:<8080> app=orders,version=v1 HEALTHY",
        )
    ),
    "inventory-v1-app": Expected(),
    "inventory-v2-app": Expected(),
    "envoy-env": Expected(),
    "proxy-status": Expected(shows=(_synced(),), wait=True),
    "curl": Expected(shows=(r"\Ainventory v1\n\Z",), wait=True),
    "route-to-v2": Expected(shows=("no problems found",)),
    "curl-after-edit": Expected(shows=(r"\A(inventory v2\n){3}\Z",), wait=True),
    "dump": Expected(
        shows=(r"inventory\.shop\.mesh\s+<9080>\s+v2\s+outbound\s+EDS\s+inventory\.shop",),
    ),
    "envoy-admin": Expected(
        shows=(r"\Aoutbound\|<9080>\|v2\|inventory\.shop\.mesh::127\.0\.0\.52:<8080>::health_flags::healthy\n\Z",),
        wait=True,
    ),
    "inventory-certificate": Expected(
        shows=(
            r"inventory-v2\.shop/root-cert\.pem: inventory-v2\.shop and spiffe://cluster\.local/ns/shop/sa/inventory, ",
        )
    ),
    "inventory-sidecar": Expected(shows=("no problems found",)),
    "inventory-envoy-env": Expected(on=INVENTORY_VM),
    "inventory-v2-app-loopback": Expected(on=INVENTORY_VM, replaces="inventory-v2-app"),
    "inventory-mtls": Expected(shows=("no problems found",)),
    "proxy-status-mtls": Expected(shows=(_synced(), _inventory_synced()), wait=True),
    "dump-secrets": Expected(
        shows=(r"^default\s+Cert Chain\s+issued by meshctl serve$", r"^ROOTCA\s+CA\s+issued by meshctl serve$")
    ),
    "inventory-certs": Expected(
        shows=(
            # The xDS client certificate, from its file; the workload certificate, over SDS.
            r"^/\S+/run/credentials/envoy-sidecar@inventory-v2\.shop\.service/proxy\.crt\t"
            r"inventory-v2\.shop spiffe://cluster\.local/ns/shop/sa/inventory\t\d{4}-",
            r"^<inline>\tspiffe://cluster\.local/ns/shop/sa/inventory\t\d{4}-",
        ),
        wait=True,
        on=INVENTORY_VM,
    ),
    # Through orders' Envoy, to inventory's ingress listener: now mutual TLS.
    "curl-mtls": Expected(shows=(r"\Ainventory v2\n\Z",), wait=True),
    "inventory-handshakes": Expected(
        shows=(r"\Alistener\.127\.0\.0\.52_<8443>\.ssl\.handshake: [1-9]\d*\n\Z",),
        wait=True,
        on=INVENTORY_VM,
    ),
    "strict": Expected(shows=("no problems found",)),
    # No HTTP answer without a client certificate on the ingress port; nothing on the app's port.
    "plaintext-refused": Expected(
        shows=(
            r"^port <8443>: refused \(curl exit status (52|56)\)$",
            r"^port <8080>: refused \(curl exit status 7\)$",
        ),
        wait=True,
    ),
    "curl-strict": Expected(shows=(r"\Ainventory v2\n\Z",)),
    "add-payments": Expected(shows=("no problems found",)),
    "proxy-status-errors": Expected(
        status=1,  # a proxy shows ERROR: the answer to "is every proxy in sync?" is no
        shows=(
            re.escape(NODE) + r"[\s│]+shop/orders-vm[\s│]+ERROR([\s│]+SYNCED){4}",
            re.escape(NODE) + r" CDS: .*/etc/ssl/payments/ca\.pem",
        ),
        wait=True,
    ),
    "curl-during-nack": Expected(shows=(r"\Ainventory v2\n\Z",)),
    "remove-payments": Expected(shows=(_synced(), _inventory_synced()), wait=True),
    "registryz-consul-down": Expected(
        shows=(r'\{"name":"files","healthy":true,', r'\{"name":"consul","healthy":false,'), wait=True
    ),
    "curl-consul-down": Expected(shows=(r"\Ainventory v2\n\Z",)),
    "registryz-consul-back": Expected(shows=(r'\{"name":"consul","healthy":true,',), wait=True),
    "break-file": Expected(),
    "validate-broken": Expected(
        status=1, shows=(r"/etc/meshctl/mesh/inventory-routing\.yaml:\d+:\d+ VirtualService shop/inventory ",)
    ),
    "configz": Expected(shows=(r"inventory-routing\.yaml:\d+.*destinaton",), wait=True),
    "curl-broken-file": Expected(shows=(r"\Ainventory v2\n\Z",)),
    "fix-file": Expected(shows=("no problems found",)),
    "unknown-host": Expected(shows=(r"\A502\n\Z",)),
}


@dataclass
class Walkthrough:
    """The temporary hosts: runs blocks, keeps the long-running processes, and the logs."""

    root: Path
    rewrite: Rewriter
    consul: FakeConsul
    processes: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)
    credentials: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)
    #: The resolved drop-in, once installed: its DNS= (address, port) and its routing domains.
    dns: tuple[str, int] | None = None
    domains: tuple[str, ...] = ()

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment: no proxies, this venv first on PATH, and of MESHCTL_* only the
        state directory, moved as the page's paths are (see the module docstring)."""
        path = f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        home = str(self.home)
        state = self.rewrite("/var/lib/meshctl")
        return {
            "PATH": path,
            "HOME": home,
            "CURL_HOME": home,
            "LANG": "C.UTF-8",
            "COLUMNS": "200",
            "MESHCTL_STATE_DIR": state,
            **(extra or {}),
        }

    def expected_pattern(self, pattern: str, vm: str = "") -> str:
        """`<PORT>` in a pattern stands for the free port that replaced the page's PORT."""
        return re.sub(r"<(\d+)>", lambda m: str(self.rewrite.port(int(m[1]), vm)), pattern)

    # -- blocks ---------------------------------------------------------------------------------

    def run(self, block: Block) -> None:
        expected = EXPECTED[block.name]
        script = self.rewrite(block.text, expected.on)
        if expected.replaces:
            self.stop(expected.replaces)
        if block.background:
            self.start(block.name, ["bash", "-euo", "pipefail", "-c", script], self.env())
            return
        deadline = time.monotonic() + DEADLINE
        while True:
            self.resolve_names(script)
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=self.home,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            output = proc.stdout + proc.stderr
            problem = self.check(expected, proc.returncode, proc.stdout, output, expected.on)
            if problem is None:
                self.transcript.append(f"$ [{block.name}]\n{output}")
                return
            self.check_alive()
            if not expected.wait or time.monotonic() > deadline:
                self.transcript.append(f"$ [{block.name}] (failed)\n{output}")
                pytest.fail(f"docs/vm-setup.md:{block.line} [{block.name}]: {problem}\n--- output:\n{output}")
            time.sleep(0.2)

    def check(self, expected: Expected, status: int, stdout: str, output: str, vm: str = "") -> str | None:
        if status != expected.status:
            return f"exit status {status}, the page says {expected.status}"
        for pattern in expected.shows:
            wanted = self.expected_pattern(pattern, vm)
            text = stdout if pattern.startswith(r"\A") else output
            if not re.search(wanted, text, re.M):
                return f"the output does not show /{wanted}/"
        return None

    # -- long-running processes -------------------------------------------------------------------

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        log = self.root / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, cwd=self.home, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes[name] = (proc, log)

    def stop(self, name: str) -> None:
        """Stop one long-running process (the page stops it in its terminal)."""
        proc, _ = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)

    def check_alive(self) -> None:
        for name, (proc, log) in self.processes.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")

    def stop_all(self) -> None:
        for proc, _ in self.processes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.processes.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        parts = [
            f"--- {name} log:\n{log.read_text(errors='replace')[-4000:]}" for name, (_, log) in self.processes.items()
        ]
        return "\n".join(["--- transcript:", *self.transcript, *parts])

    # -- what systemd and the host do ---------------------------------------------------------------

    def unit(self, name: str) -> dict[str, list[str]]:
        text = (UNITS / name).read_text()
        text = text.replace("/usr/local/bin/meshctl", str(BIN / "meshctl"))
        text = text.replace("/usr/local/bin/envoy", str(envoy_binary()))
        return unit_service(self.rewrite(text))

    def hand_over_credentials(self, unit: str, instance: str = "") -> dict[str, str]:
        """LoadCredential=: copy each file to /run/credentials/UNIT/NAME, as systemd does at start."""
        template = unit.replace(f"@{instance}.", "@.") if instance else unit
        pairs = self.credentials.get(template, [])
        directory = self.root / "run" / "credentials" / unit
        directory.mkdir(parents=True, exist_ok=True)
        for name, source in pairs:
            path = Path(self.rewrite(expand_specifiers(source, self.root / "run", instance)))
            shutil.copyfile(path, directory / name)
        return {"CREDENTIALS_DIRECTORY": str(directory)} if pairs else {}

    def environment(self, service: dict[str, list[str]], instance: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for value in service.get("Environment", []):
            key, _, val = value.partition("=")
            env[key] = val
        for value in service.get("EnvironmentFile", []):
            path = Path(expand_specifiers(value.removeprefix("-"), self.root / "run", instance))
            assert path.is_relative_to(self.root), f"EnvironmentFile={value} was not rewritten"
            if path.exists() or not value.startswith("-"):
                env.update(environment_file(path))
        return env

    def start_meshctl(self, block: Block) -> None:
        assert re.search(r"systemctl enable --now meshctl\b", block.text), block.text
        service = self.unit("meshctl.service")
        env = self.environment(service, "") | self.hand_over_credentials("meshctl.service")
        [exec_start] = service["ExecStart"]
        self.start(
            "meshctl-serve", command_line(expand_specifiers(exec_start, self.root / "run", ""), env), self.env(env)
        )

    def start_envoy(self, block: Block) -> None:
        found = re.search(r"systemctl enable --now envoy-sidecar@([\w.-]+)", block.text)
        assert found, block.text
        instance = found.group(1)
        unit = f"envoy-sidecar@{instance}.service"
        service = self.unit("envoy-sidecar@.service")
        runtime = self.root / "run"
        env = self.environment(service, instance) | self.hand_over_credentials(unit, instance)
        for directory in service.get("RuntimeDirectory", []):
            path = runtime / expand_specifiers(directory, runtime, instance)
            path.mkdir(parents=True, exist_ok=True)
            env["RUNTIME_DIRECTORY"] = str(path)
        for line in service.get("ExecStartPre", []):
            argv = command_line(expand_specifiers(line, runtime, instance), env)
            pre = subprocess.run(argv, env=self.env(env), capture_output=True, text=True, timeout=60, check=False)
            assert pre.returncode == 0, f"ExecStartPre of {unit} failed:\n{pre.stderr}"
        [exec_start] = service["ExecStart"]
        self.start(unit, command_line(expand_specifiers(exec_start, runtime, instance), env), self.env(env))

    def resolved(self, block: Block) -> None:
        """The resolved drop-in installed: where it sends the mesh's domains, and which."""
        assert "systemd/meshctl-resolved.conf" in block.text and "resolved.conf.d" in block.text, block.text
        text = self.rewrite((UNITS / "meshctl-resolved.conf").read_text())
        (server,) = re.findall(r"^DNS=(\S+)$", text, re.M)
        (domains,) = re.findall(r"^Domains=(.+)$", text, re.M)
        host, _, port = server.rpartition(":")
        self.dns = (host, int(port))
        self.domains = tuple(d.removeprefix("~") for d in domains.split())

    def resolve_names(self, script: str) -> None:
        """As systemd-resolved would: the block's URL hosts under the drop-in's domains, asked of
        the Envoy's DNS listener; the answers as curl `resolve` entries."""
        if self.dns is None:
            return
        import dns.exception
        import dns.message
        import dns.query
        import dns.rdatatype

        entries = []
        for name, port in sorted(set(re.findall(r"https?://([\w.-]+):(\d+)", script))):
            if not any(name == d or name.endswith("." + d) for d in self.domains):
                continue
            try:
                reply = dns.query.udp(dns.message.make_query(name, "A"), self.dns[0], port=self.dns[1], timeout=2)
            except (OSError, dns.exception.DNSException):
                continue
            for rrset in reply.answer:
                entries.extend(f"resolve = {name}:{port}:{r.address}" for r in rrset if rrset.rdtype == dns.rdatatype.A)
        (self.home / ".curlrc").write_text("".join(f"{e}\n" for e in entries))

    def remember_credentials(self, block: Block) -> None:
        unit, pairs = load_credentials(block.text)
        self.credentials[unit] = pairs

    def stop_consul(self, block: Block) -> None:
        assert "systemctl stop consul" in block.text, block.text
        self.consul.stop()

    def start_consul(self, block: Block) -> None:
        assert "systemctl start consul" in block.text, block.text
        self.consul.start()


HOST_STEPS: dict[str, Callable[[Walkthrough, Block], None]] = {
    "meshctl-credentials": Walkthrough.remember_credentials,
    "start-meshctl": Walkthrough.start_meshctl,
    "envoy-credentials": Walkthrough.remember_credentials,
    "resolved": Walkthrough.resolved,
    "start-envoy": Walkthrough.start_envoy,
    "start-inventory-envoy": Walkthrough.start_envoy,
    "stop-consul": Walkthrough.stop_consul,
    "start-consul": Walkthrough.start_consul,
}


@pytest.fixture
def walkthrough(tmp_path: Path) -> Iterator[Walkthrough]:
    rewrite = Rewriter(tmp_path)
    (tmp_path / "home").mkdir()
    consul = FakeConsul(port=rewrite.port(8500))
    consul.start()
    walk = Walkthrough(tmp_path, rewrite, consul)
    try:
        yield walk
    finally:
        walk.stop_all()
        consul.stop()
        print(walk.logs())


# -- tests --------------------------------------------------------------------------------------


def test_every_block_is_marked_and_every_name_is_known() -> None:
    blocks = read_blocks(DOC)
    assert {b.name for b in blocks if b.kind == "test"} == set(EXPECTED)
    assert {b.name for b in blocks if b.kind == "host-only" and b.name} == set(HOST_STEPS)


def test_the_rewriting_reaches_every_address_and_port_of_the_page(tmp_path: Path) -> None:
    """After rewriting, no block the test runs names a 10.x address, a path outside the temporary
    directory that the test would write to, or a port of the page: else it would touch this host."""
    rewrite = Rewriter(tmp_path)
    for block in read_blocks(DOC):
        if block.kind != "test":
            continue
        text = rewrite(block.text, EXPECTED[block.name].on)
        assert not re.search(r"(?<!\d)(?<!\d\.)10\.\d+\.\d+\.\d+(?!\d)", text), block.name
        assert not re.search(rf"(?<![\d.])({'|'.join(map(str, PORTS))})(?!\d)", text), block.name
        for path in re.findall(r"(?<![\w.-])(/(?:etc|srv|run|var|opt|usr)/[\w./@-]*)", text):
            assert path.startswith(("/etc/ssl/payments/",)), (block.name, path)


def test_the_walkthrough_works_as_the_page_says(walkthrough: Walkthrough) -> None:
    # The NACK of the troubleshooting section needs a CA file that is not there.
    assert not Path("/etc/ssl/payments/ca.pem").exists()
    for block in read_blocks(DOC):
        if block.kind == "test":
            walkthrough.run(block)
        elif block.name:
            HOST_STEPS[block.name](walkthrough, block)
        walkthrough.check_alive()


def test_a_block_the_cli_rejects_fails_the_walkthrough(tmp_path: Path) -> None:
    """The walkthrough's checks bite: `validate` with a flag the CLI does not know (a renamed one)
    fails the block, naming the page's line."""
    walk = Walkthrough(tmp_path, Rewriter(tmp_path), FakeConsul())
    walk.home.mkdir()
    blocks = {b.name: b for b in read_blocks(DOC)}
    walk.run(blocks["mesh-files"])
    original = blocks["validate"]
    renamed = Block(original.line, "test", "validate", False, original.text.replace("validate", "validate --strictest"))
    with pytest.raises(pytest.fail.Exception, match=rf"vm-setup\.md:{original.line} \[validate\]: exit status 2"):
        walk.run(renamed)
