"""Routing tests: a YAML file of requests and where each should go, checked by `simulate`.

A cases file is a list of cases, each a request sent by a proxy and what is expected of it:

    - name: jason gets the canary
      proxy: productpage-v1-vm.bookinfo          # NAME.NAMESPACE of a WorkloadEntry, or a node id
      request: {url: "http://reviews.bookinfo.mesh:9080/", headers: {end-user: jason}}
      expect: {cluster: "outbound|9080|v2|reviews.bookinfo.mesh", route: canary-jason}

A request whose url is `xds:///HOST:PORT/SERVICE/METHOD` is a call from the proxy as a proxyless
gRPC node (`meshctl.simulate.grpc`); `expect.grpc_status` checks its status code.

A file is checked whole before any case runs, so a typo in the last case is an error (with its
file:line) rather than a pass of everything before it: an expectation that is never checked must
never read as one that holds. An unknown field is refused for the same reason (`expcet:` would
otherwise test nothing).

Each proxy's resources are generated once, however many cases name it (`ProxyResources`), so the
cost of a file is the tree, one generation per proxy, and a walk per case.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshctl.errors import MeshctlError, UsageError
from meshctl.simulate.grpc import CODES as GRPC_CODES
from meshctl.simulate.grpc import GrpcCall, parse_call, simulate_grpc
from meshctl.simulate.request import Request, parse_request
from meshctl.simulate.simulator import Target, simulate

if TYPE_CHECKING:
    from meshctl.simulate.result import Simulation
    from meshctl.simulate.upstream import SourceLookup
    from meshctl.snapshot.model import Snapshot
    from meshctl.snapshot.proxy import Proxy

CASE_FIELDS = ("name", "proxy", "request", "expect")
REQUEST_FIELDS = ("url", "method", "headers")
EXPECT_FIELDS = ("cluster", "route", "status", "grpc_status", "redirect", "header", "source")

#: A proxy reference (as `--proxy` takes it) and whether it is a proxyless gRPC node -> the
#: proxy, or None when the tree has no such one.
ProxyFinder = Callable[[str, bool], "Proxy | None"]


@dataclass(frozen=True, slots=True)
class Case:
    """One routing test, with where it is written. `expect` holds only the fields given, in the
    normal forms `_expectation` makes of them."""

    name: str
    proxy: str
    request: Request
    expect: Mapping[str, Any]
    file: str
    line: int
    #: A proxyless gRPC call (`xds:///HOST:PORT/SERVICE/METHOD`): the channel's target, and the
    #: proxy is a gRPC node; "" for an HTTP request from an Envoy.
    grpc_target: str = ""

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One expectation that does not hold, in words a person compares side by side."""

    field: str
    expected: str
    got: str


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    simulation: Simulation
    mismatches: tuple[Mismatch, ...]

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def diff(self) -> str:
        """The mismatches in one line, then the route that answered and where it was written."""
        diff = "; ".join(f"{m.field}: expected {m.expected}, got {m.got}" for m in self.mismatches)
        return f"{diff} ({where_routed(self.simulation)})"

    def message(self) -> str:
        return f"{self.case.name}: {self.diff()}"

    def as_dict(self) -> dict[str, Any]:
        """The `-o json` form of one case: the verdict, the mismatches, and the whole walk."""
        return {
            "name": self.case.name,
            "file": self.case.file,
            "line": self.case.line,
            "proxy": self.case.proxy,
            "passed": self.passed,
            "mismatches": [{"field": m.field, "expected": m.expected, "got": m.got} for m in self.mismatches],
            "simulation": self.simulation.as_dict(),
        }


def where_routed(result: Simulation) -> str:
    """The route that answered and its Istio resource with file:line; or why none did."""
    if result.route_match is None:
        return f"no route: {result.outcome.reason}"
    text = f"route {result.route_name or '(unnamed)'!s}"
    if result.virtual_host:
        text += f" of virtual host {result.virtual_host}"
    source = result.source
    if source is not None:
        where = f" at {source.file}:{source.line}" if source.file else ""
        text += f", {source.kind} {source.namespace}/{source.name}{where}"
    return text


# -- loading --------------------------------------------------------------------------------------


def load_cases(path: Path) -> list[Case]:
    """Every case of the file at `path`; UsageError (exit 2) naming file:line for anything that
    is not a case as documented in docs/routing-tests.md."""
    from meshctl.config import yamlsource
    from meshctl.config.files import decode_text, read_config_file
    from meshctl.config.positions import Positions
    from meshctl.errors import ConfigError, YamlError

    name = str(path)
    try:
        text = decode_text(read_config_file(path, yamlsource.DEFAULT_MAX_FILE_BYTES).data)
        documents = yamlsource.parse_documents(text)
    except YamlError as exc:
        raise UsageError(f"{name}:{exc.line}: {exc.message}") from None
    except ConfigError as exc:
        raise UsageError(f"{name}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read the cases file: {exc.strerror or exc}") from None
    if len(documents) != 1 or not isinstance(documents[0].data, list) or not documents[0].data:
        line = documents[0].line if documents else 1
        raise UsageError(f"{name}:{line}: a cases file is one YAML list of cases (name, proxy, request, expect)")
    positions = Positions(text)
    return [_case(item, name, i, positions) for i, item in enumerate(documents[0].data)]


def _case(item: Any, file: str, index: int, positions: Any) -> Case:
    def fail(message: str, *path: str | int) -> UsageError:
        line, _ = positions.locate(0, [index, *path])
        label = f"case {index + 1}" + (f" ({item['name']})" if isinstance(item, dict) and "name" in item else "")
        return UsageError(f"{file}:{line}: {label}: {message}")

    if not isinstance(item, dict):
        raise fail("a case is a mapping of name, proxy, request and expect")
    _known(item, CASE_FIELDS, "", fail)
    for required in CASE_FIELDS:
        if required not in item:
            raise fail(f"missing {required}")
    name, proxy, request, expect = (item[f] for f in CASE_FIELDS)
    if not isinstance(name, str) or not name:
        raise fail("name: give the case a name (text)", "name")
    if not isinstance(proxy, str) or not proxy:
        raise fail("proxy: give NAME.NAMESPACE of a WorkloadEntry or a node id", "proxy")
    if not isinstance(request, dict):
        raise fail("request: a mapping of url, method and headers", "request")
    _known(request, REQUEST_FIELDS, "request.", fail, "request")
    if not isinstance(request.get("url"), str):
        raise fail("request: missing url (http://HOST[:PORT]/PATH)", "request")
    method = request.get("method", "GET")
    headers = request.get("headers") or {}
    if not isinstance(headers, dict) or not all(_is_text(v) for v in headers.values()):
        raise fail("request.headers: a mapping of header names to values", "request", "headers")
    given = [f"{k}:{_text(v)}" for k, v in headers.items()]
    target = ""
    try:
        if request["url"].startswith("xds:"):
            if "method" in request:
                raise UsageError("a gRPC call (xds:///...) is a POST of its method: give no method")
            call = parse_call(request["url"], given)
            parsed, target = call.request, call.target
        else:
            parsed = parse_request(request["url"], str(method), given)
    except UsageError as exc:
        raise fail(f"request: {exc}", "request") from None
    if not isinstance(expect, dict) or not expect:
        raise fail(f"expect: a mapping of one or more of {', '.join(EXPECT_FIELDS)}", "expect")
    _known(expect, EXPECT_FIELDS, "expect.", fail, "expect")
    normal = {}
    for key, value in expect.items():
        wanted = _expectation(key, value)
        if wanted is None:
            raise fail(f"expect.{key}: {_FORMS[key]}", "expect", key)
        normal[key] = wanted
    line, _ = positions.locate(0, [index])
    return Case(name, proxy, parsed, normal, file, line, target)


def _known(given: dict[str, Any], fields: Sequence[str], prefix: str, fail: Any, *path: str) -> None:
    for key in given:
        if key not in fields:
            raise fail(f"unknown field {prefix}{key} (known: {', '.join(fields)})", *path, key)


def _is_text(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def _text(value: Any) -> str:
    """A scalar as its YAML text: `true`, not Python's `True`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


_FORMS = {
    "cluster": "a cluster name, or for weighted clusters a mapping of cluster name to weight",
    "route": "a route name (text; empty for an unnamed route)",
    "status": "an HTTP status (a number from 100 to 599)",
    "grpc_status": "a gRPC call's status code by name (OK, UNAVAILABLE, PERMISSION_DENIED, ...)",
    "redirect": "the Location of the redirect (text)",
    "header": "a header the route adds: a mapping of name and value, or a list of them",
    "source": "the route's Istio resource as KIND/NAMESPACE/NAME",
}


def _expectation(key: str, value: Any) -> Any | None:
    """The normal form of an expectation, or None when `value` is not one of its forms."""
    if key == "cluster":
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict) and value and all(_is_weight(w) for w in value.values()):
            return {str(k): int(w) for k, w in value.items()}
        return None
    if key == "status":
        return value if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599 else None
    if key == "header":
        items = value if isinstance(value, list) else [value]
        pairs = []
        for item in items:
            if not isinstance(item, dict) or set(item) != {"name", "value"} or not _is_text(item["value"]):
                return None
            pairs.append((str(item["name"]).lower(), _text(item["value"])))
        return tuple(pairs) if pairs else None
    if key == "source":
        return value if isinstance(value, str) and value.count("/") == 2 else None
    if key == "grpc_status":
        return value.upper() if isinstance(value, str) and value.upper() in GRPC_CODES else None
    return value if isinstance(value, str) else None  # route, redirect


def _is_weight(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- running --------------------------------------------------------------------------------------


class ProxyResources:
    """Each proxy's generated resources, made on first use and kept: a thousand cases that name
    ten proxies cost ten generations."""

    def __init__(self, snapshot: Snapshot, find: ProxyFinder, interception: bool) -> None:
        self._snapshot = snapshot
        self._find = find
        self._intercepted = interception
        self._proxies: dict[tuple[str, bool], Proxy] = {}
        self._resources: dict[tuple[str, bool], Mapping[str, Sequence[Any]]] = {}

    def check(self, cases: Sequence[Case]) -> None:
        """Resolve every proxy the cases name, before any runs; UsageError at the first case
        naming one the tree does not describe."""
        for case in cases:
            ref = (case.proxy, bool(case.grpc_target))
            if ref in self._proxies:
                continue
            try:
                proxy = self._find(*ref)
            except MeshctlError as exc:
                raise UsageError(f"{case.location}: {case.name}: proxy: {exc}") from None
            if proxy is None:
                raise UsageError(f"{case.location}: {case.name}: proxy {case.proxy!r} names no WorkloadEntry")
            self._proxies[ref] = proxy

    def get(self, ref: str, grpc: bool = False) -> tuple[Mapping[str, Sequence[Any]], Target]:
        """The resources and walk target of a proxy `check` resolved (a gRPC node's with `grpc`)."""
        from meshctl.snapshot.node import ProxyType
        from meshctl.xds.generate import generate
        from meshctl.xds.grpc_gen import generate_grpc

        proxy = self._proxies[ref, grpc]
        resources = self._resources.get((proxy.id, grpc))
        if resources is None:
            made = generate_grpc(self._snapshot, proxy) if grpc else generate(self._snapshot, proxy)
            resources = self._resources[proxy.id, grpc] = made
        return resources, Target(proxy.id, router=proxy.type is ProxyType.ROUTER, intercepted=self._intercepted)


def run_cases(cases: Sequence[Case], proxies: ProxyResources, lookup: SourceLookup | None = None) -> list[CaseResult]:
    """Every case's walk and verdict, in the file's order."""
    proxies.check(cases)
    results = []
    for case in cases:
        resources, target = proxies.get(case.proxy, bool(case.grpc_target))
        if case.grpc_target:
            simulation = simulate_grpc(resources, GrpcCall(case.grpc_target, case.request), target, lookup)
        else:
            simulation = simulate(resources, case.request, target, lookup)
        results.append(CaseResult(case, simulation, tuple(compare(case.expect, simulation))))
    return results


def compare(expect: Mapping[str, Any], result: Simulation) -> list[Mismatch]:
    """The expectations `result` does not meet, in the order they are written."""
    out = []
    for key, wanted in expect.items():
        got = _GOT[key](result)
        if not _meets(key, wanted, got):
            out.append(Mismatch(key, _show(key, wanted), _show(key, got)))
    return out


def _clusters(result: Simulation) -> Any:
    if len(result.clusters) == 1:
        return result.clusters[0].name
    return {u.name: u.weight for u in result.clusters} or None


def _redirect(result: Simulation) -> Any:
    action = result.action or {}
    return action.get("location") if action.get("kind") == "redirect" else None


def _headers(result: Simulation) -> Any:
    added = (result.action or {}).get("request_headers_to_add", ())
    return tuple((str(h["name"]).lower(), str(h["value"])) for h in added)


def _source(result: Simulation) -> Any:
    s = result.source
    return None if s is None else f"{s.kind}/{s.namespace}/{s.name}"


_GOT: dict[str, Callable[[Simulation], Any]] = {
    "cluster": _clusters,
    "route": lambda r: r.route_name if r.route_match is not None else None,
    "status": lambda r: r.outcome.status,
    # A gRPC call's code: its outcome's flag, OK when it is forwarded (`simulate.grpc`).
    "grpc_status": lambda r: r.outcome.flag or ("OK" if r.outcome.routed else None),
    "redirect": _redirect,
    "header": _headers,
    "source": _source,
}


def _meets(key: str, wanted: Any, got: Any) -> bool:
    if key == "header":
        return all(pair in got for pair in wanted)
    if key == "cluster" and isinstance(wanted, dict) and isinstance(got, str):
        return wanted == {got: 100}
    return bool(wanted == got)


def _show(key: str, value: Any) -> str:
    """A value as a person reads it in a one-line diff."""
    if value is None or value == ():
        return {"cluster": "no cluster", "route": "no route", "status": "no status (forwarded or refused)"}.get(
            key, "none"
        )
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {w}" for k, w in value.items()) + "}"
    if key == "header":
        return ", ".join(f"{n}: {v}" for n, v in value)
    if key == "route" and value == "":
        return '"" (unnamed)'
    return str(value)


__all__ = ["Case", "CaseResult", "Mismatch", "ProxyResources", "compare", "load_cases", "run_cases", "where_routed"]
