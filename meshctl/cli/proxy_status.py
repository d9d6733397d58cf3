"""`meshctl proxy-status`: is every connected proxy in sync, as `istioctl proxy-status` shows it."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, Any

import typer

from meshctl.cli.exits import reported

TYPES = ("CDS", "LDS", "EDS", "RDS", "SDS")
#: The states that make the answer "no" (exit 1), for CI and scripts that wait for a rollout.
OUT_OF_SYNC = ("ERROR", "STALE")


class Format(enum.StrEnum):
    table = "table"
    json = "json"


def sync_state(entry: dict[str, Any] | None) -> str:
    """SYNCED (the node ACKed what it was sent), STALE (sent, not ACKed yet), NOT SENT, or ERROR
    (the node rejected the last config: it keeps running the previous one)."""
    if entry is None or not entry.get("sent"):
        return "NOT SENT"
    if entry.get("nack"):
        return "ERROR"
    return "SYNCED" if entry.get("acked") == entry.get("sent") else "STALE"


@reported
def proxy_status(
    admin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST:PORT",
            show_default=False,
            help="meshctl serve's admin address; repeat it for every replica, whose rows are merged "
            "(a REPLICA column says which one holds each proxy's stream). Default: 127.0.0.1:15014.",
            envvar="MESHCTL_ADMIN_ADDRESS",
        ),
    ] = None,
    output: Annotated[Format, typer.Option("--output", "-o", help="table or json.")] = Format.table,
    errors: Annotated[bool, typer.Option("--errors", help="Show each NACK's message.")] = False,
    admin_token_file: Annotated[
        str | None,
        typer.Option(
            help="File holding the admin bearer token (when serve has --admin-token-file).",
            envvar="MESHCTL_ADMIN_TOKEN_FILE",
        ),
    ] = None,
) -> None:
    """One row per connected proxy with CDS, LDS, EDS, RDS and SDS each SYNCED, STALE, NOT SENT or ERROR.

    A proxyless gRPC node (GENERATOR grpc) is a row like an Envoy's, with a GENERATOR column:
    it asks for its listeners, routes, clusters and endpoints by name and never for SDS.

    With several --admin replicas, a replica that does not answer is one line on stderr and the
    others are still shown; the command fails (2) only when none answers.

    Exit status: 0 every proxy shown is in sync, 1 a proxy shows ERROR (it rejected its config)
    or STALE (it has not ACKed it yet), 2 usage error or no replica answered.
    """
    import json
    import sys

    from meshctl.cli import output as out
    from meshctl.cli.admin_client import syncz
    from meshctl.errors import UsageError

    replicas = list(dict.fromkeys(admin or ["127.0.0.1:15014"]))
    rows = []
    answered = 0
    for replica in replicas:
        try:
            entries = syncz(replica, admin_token_file)
        except UsageError as exc:
            if len(replicas) == 1:
                raise
            out.error(str(exc))
            continue
        answered += 1
        for e in entries:
            states = {t: sync_state(e["types"].get(t)) for t in TYPES}
            row = {
                "proxy": e["proxy"],
                "workload": e.get("workload", ""),
                "generator": e.get("generator", "envoy"),
                **states,
                "HDS": e.get("health", ""),
                "replica": replica,
                # The config version the proxy is offered, and its part in a staged rollout.
                "version": str(e.get("snapshot", "")),
                "rollout": str(e.get("rollout", "")),
            }
            row["client_cert_expires"] = _when(e.get("client_cert_expires"))
            rows.append({**row, "types": e["types"]})
    if not answered:
        raise UsageError(f"none of the {len(replicas)} replicas answered")
    split = _split_trust(replicas, admin_token_file) if len(replicas) > 1 else None
    if split is not None:
        out.error(split)
    # A proxy between replicas can show on both for a moment; sorted, its rows stay together.
    rows.sort(key=lambda r: (r["proxy"], r["replica"]))
    in_sync = not any(r[t] in OUT_OF_SYNC for r in rows for t in TYPES)
    _warn_expiring(rows, out.error)
    if output is Format.json:
        json.dump([{k: v for k, v in r.items() if k != "types"} for r in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
        raise typer.Exit(0 if in_sync and split is None else 1)
    # A table on a terminal; aligned columns when piped, so grep and awk see whole node ids.
    # The VERSION column only while proxies are offered different versions (a staged rollout).
    staged = len({r["version"] for r in rows}) > 1 or any(r["rollout"] == "canary" for r in rows)
    # The GENERATOR column only when a proxyless gRPC node is connected (it never asks for SDS).
    grpc = any(r["generator"] == "grpc" for r in rows)
    headers = ["NAME", "WORKLOAD", *(["GENERATOR"] if grpc else []), *TYPES, "HDS"]
    headers += [*(["VERSION"] if staged else []), "REPLICA"]

    def cells(r: dict[str, Any]) -> list[str]:
        kind = [r["generator"]] if grpc else []
        version = [_version(r)] if staged else []
        return [r["proxy"], r["workload"], *kind, *(r[t] for t in TYPES), r["HDS"], *version, r["replica"]]

    out.print_listing(headers, [cells(r) for r in rows])
    if errors:
        for r in rows:
            for t in TYPES:
                nack = (r["types"].get(t) or {}).get("nack")
                if nack:
                    out.error(f"{r['proxy']} {t}: {nack}")
    raise typer.Exit(0 if in_sync and split is None else 1)


def _version(row: dict[str, Any]) -> str:
    """The version a proxy is offered, shortened, with `(canary)` while it runs one the fleet does not."""
    version = row["version"][:12]
    return f"{version} (canary)" if row["rollout"] == "canary" else version


#: A client certificate this close to its end is said on stderr: renewal (at two thirds of its
#: life, every few minutes) has been failing for a long while.
EXPIRY_WARNING_SECONDS = 3600


def _when(timestamp: float | None) -> str | None:
    import datetime

    if not timestamp:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")


def _warn_expiring(rows: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """One line per proxy whose xDS client certificate ends within the hour (or has ended)."""
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    for r in rows:
        if not r.get("client_cert_expires"):
            continue
        ends = datetime.datetime.fromisoformat(r["client_cert_expires"])
        if (ends - now).total_seconds() < EXPIRY_WARNING_SECONDS:
            say(
                f"{r['proxy']}: its xDS client certificate expires at {r['client_cert_expires']}: it reconnects "
                "only with a renewed one (meshctl ca renew; is meshctl-ca-renew@ running on the VM?)"
            )


def _split_trust(replicas: list[str], token_file: str | None) -> str | None:
    """Why the replicas do not serve one mesh, or None: each publishes the fingerprints of the
    roots its certificates chain to (`/version`), and replicas with different roots split the
    mesh (a proxy failing over to the other is refused, its workload certificates untrusted).
    Replicas that do not answer, or publish none, are left out."""
    from meshctl.cli.admin_client import get_json
    from meshctl.errors import UsageError

    roots: dict[str, tuple[str, ...]] = {}
    for replica in replicas:
        try:
            page = get_json(replica, "/version", token_file, expect=dict)
        except UsageError:
            continue
        fingerprints = page.get("root_fingerprints")
        if isinstance(fingerprints, list) and fingerprints:
            roots[replica] = tuple(sorted(str(f) for f in fingerprints))
    if len(set(roots.values())) <= 1:
        return None
    said = "; ".join(f"{r}: {', '.join(f[:23] + '...' for f in fps)}" for r, fps in roots.items())
    return (
        f"the replicas do not share one root CA ({said}): proxies that fail over between them are refused and "
        "their mutual TLS breaks; give every replica the same --ca-dir or state directory (docs/replicas.md)"
    )
