"""`meshctl simulate`: where a request from a proxy goes, before any Envoy runs the config.

The proxy's resources are built as `meshctl dump` builds them (the same tree loading, the same
`generate`), and `meshctl.simulate` walks them as Envoy would: listener, filter chain, route
config, virtual host, route, action, clusters, endpoints. The route's Istio resource is named
with the file:line it was read from. The exit status is an answer CI can assert on: 0 when the
request reaches an upstream or a configured redirect or direct response, 1 when Envoy refuses,
404s or 503s it.

With `--cases FILE` it runs routing tests instead (`meshctl.simulate.cases`): the tree is loaded
once, each proxy's resources generated once, and each case's walk compared with what it expects.
Exit 0 when every case holds, 1 when any does not, 2 for a cases file that is not one.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl.cli import options
from meshctl.cli.exits import reported
from meshctl.snapshot.interception import InterceptionMode

if TYPE_CHECKING:
    from meshctl.cli.offline import LoadedTree
    from meshctl.cli.output import TableData
    from meshctl.simulate.result import Simulation
    from meshctl.simulate.upstream import SourceLookup
    from meshctl.snapshot.model import Snapshot

STEP_COLUMNS = ("STEP", "VALUE")
UPSTREAM_COLUMNS = ("CLUSTER", "WEIGHT", "TLS", "ENDPOINT", "LOCALITY", "PRIORITY", "HEALTH")

#: The exit status of a request Envoy would refuse, 404 or 503.
EXIT_NOT_ROUTED = 1


class Format(enum.StrEnum):
    short = "short"
    json = "json"
    github = "github"


@reported
def simulate(
    config_dir: options.ConfigDir,
    url: Annotated[
        str | None,
        typer.Argument(
            metavar="URL",
            help="The request's URL: http://HOST[:PORT]/PATH[?QUERY], or a proxyless gRPC call "
            "xds:///HOST:PORT/SERVICE/METHOD (the proxy is then a gRPC node); none with --cases.",
        ),
    ] = None,
    proxy: Annotated[
        str | None,
        typer.Option(
            "--proxy",
            metavar="NODE_ID|NAME.NAMESPACE",
            help="The sending proxy: a node id (sidecar~IP~NAME.NAMESPACE~DOMAIN) or a WorkloadEntry NAME.NAMESPACE.",
        ),
    ] = None,
    method: Annotated[str, typer.Option("--request", "-X", metavar="METHOD", help="The HTTP method.")] = "GET",
    tcp: Annotated[
        str | None,
        typer.Option(
            "--tcp",
            metavar="HOST:PORT",
            help="A TCP connection instead of an HTTP request (a database, a protocol Envoy passes through).",
        ),
    ] = None,
    sni: Annotated[
        str | None,
        typer.Option("--sni", metavar="NAME", help="With --tcp: a TLS connection sending this SNI (not terminated)."),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", metavar="NAME:VALUE", help="A request header; repeat for more."),
    ] = None,
    consul: options.ConsulOnce = None,
    output: Annotated[
        Format,
        typer.Option(
            "--output", "-o", help="short (tables) or json (one object); with --cases also github (annotations)."
        ),
    ] = Format.short,
    namespace: options.Namespace = "default",
    interception: options.Interception = InterceptionMode.NONE,
    mesh_config: options.MeshConfig = None,
    cases: Annotated[
        Path | None,
        typer.Option(
            "--cases",
            metavar="FILE",
            help="Run the routing tests of a YAML file (docs/routing-tests.md) instead of one request.",
        ),
    ] = None,
) -> None:
    """Show where a request sent by a proxy goes: the listener, filter chain, route config,
    virtual host and route Envoy picks, the Istio resource (file:line) the route came from, the
    action (clusters and weights, redirect, direct response, timeout, retries, fault, mirrors),
    and each cluster's TLS mode and endpoints.

    A URL xds:///HOST:PORT/SERVICE/METHOD is a call made by a proxyless gRPC node (GENERATOR
    grpc) instead: its listener is the one named HOST:PORT, routes match the /SERVICE/METHOD
    path and -H metadata, and the outcome is the call's gRPC status.

    With --cases FILE, runs each case of the file (a request from a proxy, and the cluster,
    route, status, redirect, header or source it should get) and prints the ones that fail.

    Exit status: 0 the request reaches an upstream or a configured redirect or direct response
    (with --cases: every case holds), 1 Envoy would refuse, 404 (NR) or 503 (NC, UH) it (with
    --cases: a case fails), 2 usage error, a tree that fails to load, or a bad cases file.
    """
    from meshctl.cli import offline
    from meshctl.errors import UsageError
    from meshctl.simulate import Target, parse_request
    from meshctl.simulate import simulate as run
    from meshctl.simulate.request import parse_connection
    from meshctl.snapshot.node import ProxyType
    from meshctl.xds.generate import generate

    if cases is not None:
        if url is not None or tcp is not None or proxy is not None or header or method != "GET":
            raise UsageError("--cases FILE names each case's request and proxy: give no URL, --proxy, -H or -X")
        tree = offline.load_tree(config_dir, consul=consul, namespace=namespace, mesh=offline.mesh_from(mesh_config))
        raise typer.Exit(run_cases_file(cases, tree, output, namespace, interception))
    if (url is None) == (tcp is None) or proxy is None:
        raise UsageError("give a URL (or --tcp HOST:PORT) and --proxy, or --cases FILE")
    if sni is not None and tcp is None:
        raise UsageError("--sni goes with --tcp; for HTTPS give an https:// URL")
    if output is Format.github:
        raise UsageError("-o github annotates a cases file: use it with --cases")
    grpc = url is not None and url.startswith("xds:")
    if grpc and method != "GET":
        raise UsageError("a gRPC call (xds:///...) is a POST of its method: give no -X")
    if not grpc:
        request = parse_connection(tcp, sni or "") if tcp is not None else parse_request(str(url), method, header or ())
    tree = offline.load_tree(config_dir, consul=consul, namespace=namespace, mesh=offline.mesh_from(mesh_config))
    target = offline.resolve_proxy(tree, proxy, namespace, interception.value, grpc=grpc)
    offline.report(tree)
    _stderr(offline.proxy_note(target))
    how = Target(
        target.id,
        router=target.type is ProxyType.ROUTER,
        intercepted=target.interception is not InterceptionMode.NONE,
    )
    if grpc:
        from meshctl.simulate.grpc import parse_call, simulate_grpc
        from meshctl.xds.grpc_gen import generate_grpc

        call = parse_call(str(url), header or ())
        result = simulate_grpc(generate_grpc(tree.snapshot, target), call, how, source_lookup(tree.snapshot))
    else:
        result = run(generate(tree.snapshot, target), request, how, source_lookup(tree.snapshot))
    if output is Format.json:
        sys.stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
    else:
        from meshctl.cli.output import print_tables

        for note in result.notes:
            _stderr(f"note: {note}")
        print_tables(short_tables(result))
    if not result.outcome.routed:
        raise typer.Exit(EXIT_NOT_ROUTED)


def run_cases_file(path: Path, tree: LoadedTree, output: Format, namespace: str, mode: InterceptionMode) -> int:
    """Run the cases of `path` on `tree`, print the ones that fail (or every result, as json),
    and return the exit status: 0 every case holds, 1 one does not. The file is checked whole,
    its proxies too, before any case runs."""
    from meshctl.cli import offline
    from meshctl.cli import output as out
    from meshctl.simulate.cases import ProxyResources, load_cases, run_cases

    cases = load_cases(path)
    offline.report(tree)
    proxies = ProxyResources(
        tree.snapshot,
        lambda ref, grpc: offline.find_proxy(tree.snapshot, ref, namespace, mode.value, grpc=grpc),
        mode is not InterceptionMode.NONE,
    )
    results = run_cases(cases, proxies, source_lookup(tree.snapshot))
    failed = [r for r in results if not r.passed]
    if output is Format.json:
        out.print_data([r.as_dict() for r in results], "json")
    elif output is Format.github:
        from meshctl.config.findings import Finding, Severity

        findings = [
            Finding(Severity.ERROR, r.diff(), r.case.file, r.case.line, field=r.case.name, code="routing test")
            for r in failed
        ]
        out.print_findings(findings, "github")
    else:
        for r in failed:
            sys.stdout.write(f"{r.case.location}: FAIL {r.message()}\n")
    _stderr(f"{len(results)} case(s): {len(results) - len(failed)} passed, {len(failed)} failed")
    return EXIT_NOT_ROUTED if failed else 0


def source_lookup(snapshot: Snapshot) -> SourceLookup:
    """Where an Istio resource of the snapshot was read, by (kind, namespace, name)."""

    def lookup(kind: str, namespace: str, name: str) -> tuple[str, int] | None:
        config = snapshot.get(kind, namespace, name)
        return None if config is None else (config.source.file, config.source.line)

    return lookup


def _stderr(message: str) -> None:
    from meshctl.cli import output as out

    out.stderr_console().print(message, markup=False, soft_wrap=True, highlight=False)


def short_tables(result: Simulation) -> list[TableData]:
    """The steps taken, then the upstreams (a row per endpoint); steps not reached are left out."""
    from meshctl.cli.output import TableData

    outcome = result.outcome
    answer = " ".join(str(p) for p in (outcome.status, outcome.flag) if p) or ("forwarded" if outcome.routed else "-")
    steps = [
        ("request", f"{result.request['method']} {result.request['url']}"),
        ("listener", result.listener),
        ("filter chain", result.filter_chain),
        ("route config", result.route_config),
        ("virtual host", result.virtual_host),
        ("route", f"{result.route_name or '(unnamed)'}: {result.route_match}" if result.route_match else None),
        ("source", str(result.source) if result.source else None),
        ("action", _describe_action(result.action) if result.action else None),
        ("outcome", f"{answer}: {outcome.reason}" if outcome.status or outcome.flag else outcome.reason),
    ]
    rows = [[step, value] for step, value in steps if value]
    upstream_rows = []
    for u in result.clusters:
        if not u.found:
            upstream_rows.append([u.name, str(u.weight), "-", "(cluster not found)", "-", "-", "-"])
            continue
        for e in u.endpoints or ():
            upstream_rows.append(
                [u.name, str(u.weight), e.tls, e.address, e.locality or "-", str(e.priority), e.health]
            )
        if not u.endpoints:
            none_text = _NO_ENDPOINTS.get(u.type, "(no endpoints)")
            upstream_rows.append([u.name, str(u.weight), u.tls, none_text, "-", "-", "-"])
    tables = [TableData("Route", STEP_COLUMNS, rows)]
    if upstream_rows:
        tables.append(TableData("Upstreams", UPSTREAM_COLUMNS, upstream_rows))
    return tables


#: What a cluster that lists no endpoints connects to, by its type.
_NO_ENDPOINTS = {"ORIGINAL_DST": "(original destination)", "DYNAMIC_FORWARD_PROXY": "(the host resolved per request)"}


def _describe_action(action: dict[str, object]) -> str:
    """The action in one line: its kind, then its settings as key=value."""
    parts = [str(action.get("kind"))]
    parts += [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in action.items() if k != "kind"]
    return " ".join(parts)
