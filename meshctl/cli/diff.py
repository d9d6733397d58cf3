"""`meshctl diff`: what a change to the config tree changes in the Envoy config of each proxy.

A pull request review sees YAML; what matters is the Envoy config it turns into. This command
builds both trees exactly as `meshctl dump` does (and so as the server does), generates each
proxy's resources from both, and shows every resource that was added, removed or changed, as a
unified diff of its YAML. Resources are compared by their serialized bytes, which generation
keeps deterministic, so a change that moves resources between files, reorders them or edits a
comment shows nothing. Proxies that share a view share its generation and its comparison
(`meshctl.cli.diff_views`), so a mesh of a thousand VMs costs what its views cost.

With `--live ADMIN_URL` it compares instead what meshctl would send a proxy now (from
`--config-dir`, as `meshctl dump` builds it) with what that proxy's Envoy holds, read from its
admin `/config_dump?include_eds` (`meshctl.check.drift` says what is compared and normalised):
resources missing from Envoy, extra in it, changed, versions, and the last update it rejected.
With `--server ADMIN` it also reads `meshctl serve`'s `/debug/syncz` to say whether drift is in
delivery (sent, not ACKed, or NACKed) or in config (the server sent something else than it
would send now).

Exit status, as `diff(1)`: 0 nothing changes, 1 something does, 2 usage or input error. A crash
exits 2 too, never 1, which would read as "something changes" (`meshctl.cli.exits`).
"""

from __future__ import annotations

import difflib
import enum
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl.cli.diff_views import ViewDiff
from meshctl.cli.exits import reported
from meshctl.cli.offline import INTERCEPTION_HELP, MESH_CONFIG_HELP
from meshctl.snapshot.interception import InterceptionMode

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from meshctl.cli.offline import LoadedTree
    from meshctl.cli.yaml_block import BlockYaml
    from meshctl.snapshot.model import Snapshot
    from meshctl.snapshot.proxy import Proxy


EXIT_OK, EXIT_CHANGED = 0, 1  # errors exit 2, at the CLI's edge (`meshctl.cli.exits`)


class Format(enum.StrEnum):
    text = "text"
    json = "json"


class Change(enum.StrEnum):
    added = "added"
    removed = "removed"
    changed = "changed"


@dataclass(frozen=True, slots=True)
class ProxyPair:
    """One proxy as each tree sees it; None on the side where it does not exist."""

    label: str
    old: Proxy | None
    new: Proxy | None


@dataclass(frozen=True, slots=True)
class ResourceChange:
    proxy: str
    section: str
    name: str
    change: Change
    old: Message | None
    new: Message | None

    def as_dict(self) -> dict[str, str]:
        """The `-o json` shape, stable for tools."""
        return {"proxy": self.proxy, "type": self.section, "name": self.name, "change": self.change.value}


@reported
def diff(
    old: Annotated[Path | None, typer.Argument(help="The config directory before the change.")] = None,
    new: Annotated[Path | None, typer.Argument(help="The config directory after the change.")] = None,
    proxy: Annotated[
        str | None,
        typer.Option("--proxy", help="A full node id or a WorkloadEntry NAME.NAMESPACE."),
    ] = None,
    all_proxies: Annotated[
        bool, typer.Option("--all-proxies", help="Every WorkloadEntry of either tree, with a summary.")
    ] = False,
    output: Annotated[
        Format, typer.Option("--output", "-o", help="text (unified diffs) or json (a list, for tools).")
    ] = Format.text,
    namespace: Annotated[
        str,
        typer.Option("--namespace", "-n", help="Namespace of resources that name none, and of a bare --proxy NAME."),
    ] = "default",
    interception: Annotated[
        InterceptionMode, typer.Option(case_sensitive=False, help=INTERCEPTION_HELP)
    ] = InterceptionMode.NONE,
    mesh_config: Annotated[Path | None, typer.Option(help=MESH_CONFIG_HELP)] = None,
    live: Annotated[
        str | None,
        typer.Option(
            "--live", metavar="ADMIN_URL", help="Compare with a live Envoy instead: its admin URL, http://HOST:PORT."
        ),
    ] = None,
    config_dir: Annotated[
        Path | None,
        typer.Option("--config-dir", metavar="DIR", help="With --live: the config directory meshctl serves."),
    ] = None,
    consul: Annotated[
        str | None,
        typer.Option("--consul", metavar="ADDR", help="With --live: also read Consul's catalog once, as dump does."),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="ADMIN",
            help="With --live: meshctl serve's admin address, to tell delivery from config.",
        ),
    ] = None,
    live_timeout: Annotated[
        float,
        typer.Option(
            "--live-timeout",
            metavar="SECONDS",
            help="With --live: how long the Envoy may take to send its whole config dump.",
        ),
    ] = 30.0,
    grpc: Annotated[
        bool,
        typer.Option("--grpc", help="With --proxy: the proxy is a proxyless gRPC node (GENERATOR grpc)."),
    ] = False,
) -> None:
    """Show how the Envoy config of a proxy (or of every proxy) changes from OLD to NEW, or with
    --live how a running Envoy's config differs from what meshctl would send it now.

    Exit status: 0 nothing changes (no drift), 1 something does, 2 usage error, input that fails
    to load, or an Envoy that cannot be read.
    """
    import math

    from meshctl.cli import offline
    from meshctl.cli import output as out
    from meshctl.errors import UsageError

    if live is not None:
        if old is not None or new is not None or all_proxies or proxy is None or config_dir is None:
            raise UsageError("--live takes --proxy NODE_ID and --config-dir DIR, and no OLD NEW directories")
        if not math.isfinite(live_timeout) or live_timeout <= 0:
            raise UsageError(f"--live-timeout {live_timeout!r} is not a finite number of seconds above 0")
        code = diff_live(
            live,
            proxy,
            config_dir,
            timeout=live_timeout,
            consul=consul,
            server=server,
            json_output=output is Format.json,
            namespace=namespace,
            interception=interception.value,
            mesh_config=mesh_config,
        )
        raise typer.Exit(code)
    if old is None or new is None:
        raise UsageError("give OLD and NEW config directories, or --live ADMIN_URL --config-dir DIR")
    if (proxy is None) == (not all_proxies):
        raise UsageError("give either --proxy NODE_ID or --all-proxies")
    if grpc and proxy is None:
        raise UsageError("--grpc goes with --proxy NODE_ID (and OLD NEW directories)")
    mesh = offline.mesh_from(mesh_config)
    before = offline.load_tree(old, namespace=namespace, mesh=mesh)
    after = offline.load_tree(new, namespace=namespace, mesh=mesh)
    mode = interception.value
    pairs = (
        all_pairs(before, after, mode)
        if proxy is None
        else [proxy_pair(before, after, proxy, namespace, mode, grpc=grpc)]
    )
    offline.report(after)  # the tree being proposed; the old one's warnings are history
    views = ViewDiff(before.snapshot, after.snapshot)
    changes = [c for pair in pairs for c in diff_proxy(views, pair)]
    if output is Format.json:
        sys.stdout.write(json.dumps([c.as_dict() for c in changes], indent=2) + "\n")
    else:
        _print_text(changes, summary=all_proxies)
    if not changes:
        out.stderr_console().print(f"no changes for {len(pairs)} prox{'y' if len(pairs) == 1 else 'ies'}")
    raise typer.Exit(EXIT_CHANGED if changes else EXIT_OK)


def proxy_pair(
    before: LoadedTree, after: LoadedTree, ref: str, namespace: str, interception: str = "NONE", *, grpc: bool = False
) -> ProxyPair:
    """The proxy `ref` names, in each tree (a proxyless gRPC node with `grpc`); an error when it
    names nothing in either."""
    from meshctl.cli import offline
    from meshctl.errors import OfflineError

    old = offline.find_proxy(before.snapshot, ref, namespace, interception, grpc=grpc)
    new = offline.find_proxy(after.snapshot, ref, namespace, interception, grpc=grpc)
    if old is None and new is None:
        raise OfflineError(
            f"--proxy {ref!r} names no WorkloadEntry in {before.path} or {after.path}; "
            f"{offline.known_proxies(after.snapshot)}"
        )
    label = new.id if new is not None else old.id if old is not None else ref
    return ProxyPair(label, old, new)


def all_pairs(before: LoadedTree, after: LoadedTree, interception: str = "NONE") -> list[ProxyPair]:
    """A pair for every WorkloadEntry of either tree, by (namespace, name); each side bound with
    the node id its own tree gives (a new IP or a new Gateway changes the id)."""
    from meshctl.cli.diff_views import entries_by_ref, proxy_of_entry
    from meshctl.errors import NodeIdError, OfflineError

    was, now = entries_by_ref(before), entries_by_ref(after)
    pairs = []
    for ref in sorted(was.keys() | now.keys()):
        try:
            old = proxy_of_entry(before.snapshot, was.get(ref), interception)
            new = proxy_of_entry(after.snapshot, now.get(ref), interception)
        except NodeIdError as exc:
            raise OfflineError(str(exc)) from exc
        label = new.id if new is not None else old.id if old is not None else ""
        pairs.append(ProxyPair(label, old, new))
    return pairs


def diff_proxy(views: ViewDiff, pair: ProxyPair) -> Iterator[ResourceChange]:
    """Every resource that differs for one proxy, in push order, then by name: computed once per
    pair of views (`ViewDiff`), however many proxies share it."""
    from meshctl.xds.config_dump import SECTION_NAMES

    for d in views.differences(pair.old, pair.new):
        yield ResourceChange(pair.label, SECTION_NAMES[d.type_url], d.name, Change(d.change), d.old, d.new)


def unified_diff(change: ResourceChange, writer: BlockYaml | None = None) -> list[str]:
    """The change as a unified diff of the resources' YAML, headed `a/TYPE/NAME` and `b/TYPE/NAME`
    (`/dev/null` for a side that has none), as git writes them. `writer` keeps the scalars it
    wrote for the next change (the same text, sooner)."""
    from meshctl.cli.yaml_block import BlockYaml
    from meshctl.xds.config_dump import message_dict

    yaml = writer or BlockYaml()

    def text(message: Message | None) -> list[str]:
        return yaml.text(message_dict(message)).splitlines() if message is not None else []

    path = f"{change.section}/{change.name}"
    return list(
        difflib.unified_diff(
            text(change.old),
            text(change.new),
            fromfile=f"a/{path}" if change.old is not None else "/dev/null",
            tofile=f"b/{path}" if change.new is not None else "/dev/null",
            lineterm="",
        )
    )


def summary_rows(changes: list[ResourceChange]) -> list[list[str]]:
    """PROXY, TYPE, ADDED, REMOVED, CHANGED: one row per proxy and type that has changes."""
    counts: dict[tuple[str, str], dict[Change, int]] = {}
    for c in changes:
        row = counts.setdefault((c.proxy, c.section), dict.fromkeys(Change, 0))
        row[c.change] += 1
    return [
        [proxy, section, *(str(n[k]) for k in (Change.added, Change.removed, Change.changed))]
        for (proxy, section), n in counts.items()
    ]


SUMMARY_COLUMNS = ("PROXY", "TYPE", "ADDED", "REMOVED", "CHANGED")


def _print_text(changes: list[ResourceChange], *, summary: bool) -> None:
    """Each proxy's diffs under its `# NODE_ID` header; proxies whose diffs are identical (the
    replicas of a service, a namespace's sidecars after a route change) share one block, headed by
    each of their ids, so a change to fifty proxies reads once."""
    from meshctl.cli.output import TableData, print_diff, print_tables
    from meshctl.cli.yaml_block import BlockYaml

    # Proxies that share views hold the very same changes (the same messages): each distinct
    # list of them is written out once, and grouped by its text as before.
    by_proxy: dict[str, list[ResourceChange]] = {}
    for c in changes:
        by_proxy.setdefault(c.proxy, []).append(c)
    writer = BlockYaml()
    texts: dict[tuple[tuple[str, str, int, int], ...], tuple[str, ...]] = {}
    lines_of: dict[tuple[str, str, int, int], list[str]] = {}
    groups: dict[tuple[str, ...], list[str]] = {}
    for proxy, held in by_proxy.items():
        key = tuple((c.section, c.name, id(c.old), id(c.new)) for c in held)
        block = texts.get(key)
        if block is None:
            block = texts[key] = tuple(
                line for c, k in zip(held, key, strict=True) for line in _cached(lines_of, k, c, writer)
            )
        groups.setdefault(block, []).append(proxy)
    text: list[str] = []
    for block, proxies in groups.items():
        text.extend(f"# {p}" for p in proxies)
        text.extend(block)
    print_diff(text)
    if summary and changes:
        sys.stdout.write("\n")
        print_tables([TableData("Summary", SUMMARY_COLUMNS, summary_rows(changes))])


def _cached(
    memo: dict[tuple[str, str, int, int], list[str]],
    key: tuple[str, str, int, int],
    change: ResourceChange,
    writer: BlockYaml,
) -> list[str]:
    found = memo.get(key)
    if found is None:
        found = memo[key] = unified_diff(change, writer)
    return found


# -- against a live Envoy -----------------------------------------------------------------------

DRIFT_COLUMNS = ("TYPE", "NAME", "DRIFT", "MESHCTL VERSION", "ENVOY VERSION")
VERSION_COLUMNS = ("TYPE", "MESHCTL", "ENVOY", "STALE")


def _with_live_dns(target: Proxy, live: Mapping[str, Any], snapshot: Snapshot) -> Proxy:
    from dataclasses import replace
    from types import MappingProxyType

    from meshctl.snapshot.binding import bind_proxy
    from meshctl.snapshot.interception import DNS_METADATA_KEYS

    kept = {k: v for k, v in target.node.metadata.items() if k not in DNS_METADATA_KEYS}
    dns = {k: live[k] for k in DNS_METADATA_KEYS if k in live}
    if dns == {k: v for k, v in target.node.metadata.items() if k in DNS_METADATA_KEYS}:
        return target
    return bind_proxy(replace(target.node, metadata=MappingProxyType({**kept, **dns})), snapshot)


def diff_live(
    admin_url: str,
    ref: str,
    config_dir: Path,
    *,
    timeout: float = 30.0,
    consul: str | None = None,
    server: str | None = None,
    json_output: bool = False,
    namespace: str = "default",
    interception: str = "NONE",
    mesh_config: Path | None = None,
) -> int:
    """`diff --live`: compare, print, and return the exit status (0 no drift, 1 drift)."""
    from dataclasses import replace

    from meshctl.check.drift import DumpError, compare, holds_mesh_secrets, node_metadata
    from meshctl.check.envoy_admin import fetch_config_dump
    from meshctl.cli import offline
    from meshctl.cli import output as out
    from meshctl.snapshot.binding import bind_proxy
    from meshctl.xds.config_dump import subscribed
    from meshctl.xds.generate import generate

    tree = offline.load_tree(config_dir, consul=consul, namespace=namespace, mesh=offline.mesh_from(mesh_config))
    target = offline.resolve_proxy(tree, ref, namespace, interception)
    live = fetch_config_dump(admin_url, timeout=timeout)
    offline.report(tree)
    notes = []
    # Only the dump is untrusted here: an entry of the wrong JSON type ends as one of these.
    untrusted = (DumpError, AttributeError, TypeError, KeyError)
    try:
        secrets = holds_mesh_secrets(live)
        live_metadata = node_metadata(live)
    except untrusted as exc:
        raise _not_a_dump(admin_url, exc) from None
    # The DNS listener is the node's own choice (`meshctl bootstrap --dns-port`): compare with
    # what the server sends a node with the live Envoy's DNS metadata.
    target = _with_live_dns(target, live_metadata, tree.snapshot)
    if not secrets and target.node.mesh_certificates:
        # The server sends mesh certificates (and config that names them) only to a proxy whose
        # connection proved its identity; an Envoy that holds none was sent config without them.
        target = bind_proxy(replace(target.node, mesh_certificates=False), tree.snapshot)
        notes.append("Envoy holds no mesh secrets: compared with config without mutual TLS, as the server sends it")
    resources, _ = subscribed(generate(tree.snapshot, target))
    try:
        report = compare(resources, live)
    except untrusted as exc:
        raise _not_a_dump(admin_url, exc) from None
    delivery = _delivery(server, target.id, resources) if server is not None else []
    if json_output:
        data = {"proxy": target.id, **report.as_dict()}
        if server is not None:
            data["delivery"] = delivery
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        _print_live(report, delivery)
    console = out.stderr_console()
    for note in notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True, highlight=False)
    for nack in report.nacks:
        console.print(
            f"NACK: Envoy rejected {nack.section} {nack.name or '(unnamed)'} version {nack.version}: {nack.details}",
            markup=False,
            soft_wrap=True,
            highlight=False,
        )
    if not report.drifted:
        console.print(f"no drift: Envoy at {admin_url} holds what meshctl would send {target.id}", markup=False)
    return EXIT_CHANGED if report.drifted else EXIT_OK


def _not_a_dump(admin_url: str, exc: Exception) -> Exception:
    from meshctl.errors import UsageError

    return UsageError(f"{admin_url}: the config dump is not one Envoy writes ({type(exc).__name__}: {exc})")


def _print_live(report: Any, delivery: list[dict[str, str]]) -> None:
    from meshctl.cli.output import TableData, print_tables

    tables = []
    if report.nacks:
        rows = [[n.section, n.name, n.version, n.details] for n in report.nacks]
        tables.append(TableData("Rejected by Envoy (NACK)", ("TYPE", "NAME", "VERSION", "DETAILS"), rows))
    rows = [
        [d["type"], d["name"], d["drift"], d["meshctl_version"], d["envoy_version"]]
        for d in (x.as_dict() for x in report.differences)
    ]
    if rows:  # no drift is said in a line on stderr, not by a table with no rows
        tables.append(TableData("Drift", DRIFT_COLUMNS, rows))
    versions = [[v.section, v.meshctl, ",".join(v.envoy) or "-", str(v.stale)] for v in report.versions]
    tables.append(TableData("Versions", VERSION_COLUMNS, versions))
    if delivery:
        columns = ("TYPE", "SENT", "ACKED", "NACK", "NOW", "DRIFT")
        tables.append(TableData("Server", columns, [[d[k.lower()] for k in columns] for d in delivery]))
    print_tables(tables)


_XDS_TYPES = {"CDS": "clusters", "EDS": "endpoints", "LDS": "listeners", "RDS": "routes"}


def _delivery(server: str, node_id: str, resources: Any) -> list[dict[str, str]]:
    """Per type, what the server sent the proxy, what it ACKed or NACKed, and the version the
    server would send now: `delivery` when the proxy has not taken what was sent, `config` when
    what was sent is not what would be sent now, `none` when all three agree."""
    from meshctl.cli.admin_client import syncz
    from meshctl.errors import UsageError
    from meshctl.xds.config_dump import TYPE_BY_SECTION, type_version

    entries = syncz(server)
    entry = next((e for e in entries if e["proxy"] == node_id), None)
    if entry is None:
        raise UsageError(f"{server} has no stream for {node_id}: is the proxy connected to this server?")
    rows = []
    for short, section in _XDS_TYPES.items():
        state = entry["types"].get(short) or {}
        sent, acked, nack = state.get("sent", ""), state.get("acked", ""), state.get("nack", "")
        now = type_version(resources, TYPE_BY_SECTION[section])
        kind = "delivery" if nack or sent != acked else "config" if sent != now else "none"
        rows.append({"type": section, "sent": sent, "acked": acked, "nack": nack, "now": now, "drift": kind})
    return rows
