"""`meshctl history` and `meshctl rollout`: what a running server pushed, and staging it.

Both read `meshctl serve`'s admin server (`/debug/history`, `/debug/rollout`); the rollout's
actions are POSTs to `/debug/rollout`, which the admin token protects as every /debug page.
"""

from __future__ import annotations

import datetime
import enum
import json
import sys
from typing import Annotated, Any

import typer

from meshctl.cli.exits import reported


class Format(enum.StrEnum):
    table = "table"
    json = "json"


ServerOption = Annotated[
    str,
    typer.Option(
        "--server",
        envvar="MESHCTL_ADMIN_ADDRESS",
        help="meshctl serve's admin address (HOST:PORT).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        help="File holding the admin bearer token (when serve has --admin-token-file).",
        envvar="MESHCTL_ADMIN_TOKEN_FILE",
    ),
]
OutputOption = Annotated[Format, typer.Option("--output", "-o", help="table or json.")]


def _when(timestamp: object) -> str:
    if not isinstance(timestamp, int | float):
        return ""
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="milliseconds")


def _commit(entry: dict[str, Any]) -> str:
    gits = entry.get("git") or []
    return ", ".join(f"{g.get('commit', '')[:12]}{'+dirty' if g.get('dirty') else ''}" for g in gits) or "-"


@reported
def history(
    version: Annotated[str | None, typer.Argument(help="One version (or a unique prefix of it) to show whole.")] = None,
    server: ServerOption = "127.0.0.1:15014",
    output: OutputOption = Format.table,
    admin_token_file: TokenOption = None,
) -> None:
    """The versions the server built, newest first: when, from which git commit, what changed, and
    how many proxies were sent, ACKed and NACKed each. With VERSION: that version's changes (kind,
    name and file:line) and every proxy's sent, ACK and NACK times, with Envoy's message.

    Exit status: 0 shown, 1 no such version in the history, 2 usage error or no server.
    """
    from meshctl.cli import output as out
    from meshctl.cli.admin_client import get_json
    from meshctl.errors import UsageError

    if version:
        from urllib.parse import quote

        try:
            entry = get_json(server, f"/debug/history?version={quote(version)}", admin_token_file, expect=dict)
        except UsageError as exc:
            if "404" in str(exc):
                out.error(f"no version {version} in the push history of {server}")
                raise typer.Exit(1) from None
            raise
        if output is Format.json:
            json.dump(entry, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        _print_entry(entry)
        return
    entries = get_json(server, "/debug/history", admin_token_file, expect=list)
    if output is Format.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    rows = [
        [
            str(e.get("version", "")),
            _when(e.get("time")),
            _commit(e),
            "endpoints" if e.get("endpoint_only") else str(len(e.get("changes", [])) + e.get("changes_beyond", 0)),
            ",".join(sorted(e.get("rollout", {}), key=lambda k: e["rollout"][k])),
            str(e.get("sent", 0)),
            str(e.get("acked", 0)),
            str(e.get("nacked", 0)),
        ]
        for e in entries
    ]
    out.print_listing(["VERSION", "BUILT", "COMMIT", "CHANGES", "ROLLOUT", "SENT", "ACKED", "NACKED"], rows)


def _print_entry(entry: dict[str, Any]) -> None:
    from meshctl.cli import output as out

    lines = [
        f"version:      {entry.get('version', '')}",
        f"built:        {_when(entry.get('time'))}",
        f"input digest: {entry.get('input_digest', '')}",
        f"previous:     {entry.get('previous', '') or '-'}",
        f"commit:       {_commit(entry)}",
    ]
    for step, when in sorted((entry.get("rollout") or {}).items(), key=lambda kv: kv[1]):
        lines.append(f"{step + ':':<13} {_when(when)}")
    typer.echo("\n".join(lines))
    changes = entry.get("changes") or []
    if changes:
        typer.echo("")
        out.print_listing(
            ["CHANGE", "KIND", "NAME", "SOURCE"],
            [[c.get("change", ""), c.get("kind", ""), c.get("name", ""), c.get("source", "")] for c in changes],
        )
    elif entry.get("endpoint_only"):
        typer.echo("changes:      endpoints only")
    proxies: dict[str, dict[str, dict[str, Any]]] = entry.get("proxies") or {}
    if proxies:
        typer.echo("")
        rows = []
        for node, by_type in sorted(proxies.items()):
            for short, record in sorted(by_type.items()):
                rows.append(
                    [
                        node,
                        short,
                        _when(record.get("sent")),
                        _when(record.get("acked")),
                        _when(record.get("nacked")),
                        str(record.get("error", ""))[:200],
                    ]
                )
        out.print_listing(["PROXY", "TYPE", "SENT", "ACKED", "NACKED", "ERROR"], rows)


@reported
def status(
    server: ServerOption = "127.0.0.1:15014", output: OutputOption = Format.table, admin_token_file: TokenOption = None
) -> None:
    """Which version the fleet and the canaries are offered, whether the rollout is held or
    pinned, and the versions a rollback can go to.

    Exit status: 0 complete or on the canaries, 1 held or pinned, 2 usage error or no server.
    """
    from meshctl.cli.admin_client import get_json

    page = get_json(server, "/debug/rollout", admin_token_file, expect=dict)
    _show(page, output)
    raise typer.Exit(1 if page.get("state") in ("held", "pinned") else 0)


def _show(page: dict[str, Any], output: Format) -> None:
    if output is Format.json:
        json.dump(page, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    lines = [
        f"state:      {page.get('state', '')}",
        f"fleet:      {page.get('fleet', '')}",
        f"candidate:  {page.get('candidate', '') or '-'}",
        f"latest:     {page.get('latest', '')}",
        f"canary:     {page.get('canary', '') or '(none: every version goes to every proxy)'}",
    ]
    if page.get("candidate"):
        lines.append(f"soak left:  {page.get('soak_left_seconds', 0)}s of {page.get('soak_seconds', 0)}s")
    if page.get("held"):
        lines.append(f"held:       {page['held']}")
    if page.get("pinned"):
        lines.append(f"pinned:     {page['pinned']} (meshctl rollout resume lifts it)")
    for canary in page.get("canaries", []):
        lines.append(f"  canary {canary.get('proxy', '')}: {'ACKed' if canary.get('acked') else 'not ACKed yet'}")
    rollback = page.get("rollback_versions") or []
    lines.append(f"rollback:   {', '.join(rollback) if rollback else '(no version every proxy ACKed yet)'}")
    typer.echo("\n".join(lines))


def _act(action: str, server: str, token: str | None, version: str = "") -> None:
    from urllib.parse import quote

    from meshctl.cli import output as out
    from meshctl.cli.admin_client import get_json
    from meshctl.errors import RefusedError

    path = f"/debug/rollout?action={action}" + (f"&version={quote(version)}" if version else "")
    try:
        answer = get_json(server, path, token, expect=dict, method="POST")
    except RefusedError as exc:
        out.error(str(exc))
        raise typer.Exit(1) from None
    out.error(str(answer.get("done", "")))
    _show(answer.get("rollout") or {}, Format.table)


@reported
def promote(server: ServerOption = "127.0.0.1:15014", admin_token_file: TokenOption = None) -> None:
    """Send the version on the canaries to the whole fleet now, soak or hold notwithstanding.

    Exit status: 0 done, 1 nothing to promote, 2 usage error or no server."""
    _act("promote", server, admin_token_file)


@reported
def hold(server: ServerOption = "127.0.0.1:15014", admin_token_file: TokenOption = None) -> None:
    """Keep the fleet on the version it has: new versions go to the canaries only, until resume.

    Exit status: 0 done, 2 usage error or no server."""
    _act("hold", server, admin_token_file)


@reported
def resume(server: ServerOption = "127.0.0.1:15014", admin_token_file: TokenOption = None) -> None:
    """Lift a hold or a rollback's pin: the newest version goes through the canaries again.

    Exit status: 0 done, 2 usage error or no server."""
    _act("resume", server, admin_token_file)


@reported
def rollback(
    version: Annotated[
        str | None,
        typer.Argument(help="The version (or a unique prefix) to pin; default: the last one every proxy ACKed."),
    ] = None,
    server: ServerOption = "127.0.0.1:15014",
    admin_token_file: TokenOption = None,
) -> None:
    """Pin every proxy to an earlier version every proxy ACKed, until the config changes again or
    `meshctl rollout resume`.

    Exit status: 0 done, 1 no such version can be rolled back to, 2 usage error or no server."""
    _act("rollback", server, admin_token_file, version or "")
