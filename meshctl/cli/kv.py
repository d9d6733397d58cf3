"""`meshctl kv push`: put a config tree into the Consul KV prefix `meshctl serve --config-consul-kv` follows.

The tree is checked exactly as `meshctl validate` checks it, and nothing is written unless it is
valid; then it goes in as one Consul transaction of check-and-set writes (`meshctl.kv.push`),
so proxies see the push whole or not at all, and a push racing another fails without writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

import typer

from meshctl.cli.exits import reported

EXIT_OK, EXIT_INVALID = 0, 1  # Consul and usage errors exit 2, at the CLI's edge (`meshctl.cli.exits`)


Consul = Annotated[
    str | None,
    typer.Option(envvar="MESHCTL_CONSUL", help="Consul's address (default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500)."),
]
ConsulToken = Annotated[
    str | None,
    typer.Option(
        envvar="MESHCTL_CONSUL_TOKEN",
        help="Consul ACL token, with key:read to pull and key:write to push (default: CONSUL_HTTP_TOKEN).",
    ),
]
ConsulCaFile = Annotated[
    str | None, typer.Option(envvar="MESHCTL_CONSUL_CA_FILE", help="CA bundle for Consul over TLS.")
]
ConsulDatacenter = Annotated[str | None, typer.Option(envvar="MESHCTL_CONSUL_DATACENTER", help="Consul datacenter.")]
Prefix = Annotated[str, typer.Option(metavar="PREFIX", help="The Consul KV prefix serve --config-consul-kv follows.")]


@reported
def push(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The config tree to push (as for --config-dir).")],
    prefix: Prefix,
    consul: Consul = None,
    consul_token: ConsulToken = None,
    consul_ca_file: ConsulCaFile = None,
    consul_datacenter: ConsulDatacenter = None,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace of resources that name none.")
    ] = "default",
    known_host: Annotated[
        list[str] | None,
        typer.Option("--known-host", help="A host another registry (Consul) provides; repeatable, * allowed."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would change; write nothing.")] = False,
    split: Annotated[
        bool,
        typer.Option(
            "--split",
            help="Write more than 64 changes (Consul's limit per transaction) as several transactions; each is "
            "atomic, the push is not.",
        ),
    ] = False,
) -> None:
    """Validate a config tree and write it to a Consul KV prefix in one transaction: one key per
    YAML file (DIR/bookinfo/traffic.yaml -> PREFIX/bookinfo/traffic.yaml), keys of files no longer
    in the tree deleted.

    Each write is checked against the key's index read just before, so a concurrent push fails
    without writing anything. Exit status: 0 pushed (or nothing to push), 1 invalid tree (nothing
    written), 2 usage or Consul error.
    """
    import os

    from meshctl.check.names import name_clashes
    from meshctl.cli import output as out
    from meshctl.config.check import check
    from meshctl.config.files import read_config_file, walk_yaml
    from meshctl.config.findings import Finding, Severity
    from meshctl.config.loader import LoadOptions
    from meshctl.errors import ConfigError, UsageError
    from meshctl.kv.push import apply_push, plan_push, read_current
    from meshctl.kv.source import KvLocation
    from meshctl.registry.consul_http import ConsulConnection, ConsulOptions

    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
    options = ConsulOptions.from_env(
        address=consul, token=consul_token, ca_file=consul_ca_file, datacenter=consul_datacenter
    )
    location = KvLocation(options, prefix)
    load = LoadOptions(default_namespace=namespace)
    # Read once: what is validated is what is pushed, even if a file changes meanwhile.
    root = str(directory)
    files: dict[str, bytes] = {}
    refused: list[Finding] = []
    for path in walk_yaml([root]).paths:
        try:
            files[path] = read_config_file(path, load.max_file_bytes).data
        except ConfigError as exc:  # a FIFO, a file over the size limit: invalid, as validate says
            refused.append(Finding(Severity.ERROR, str(exc), path))
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    # The same findings `validate` gives, the proxies' name clashes (MC0006) included.
    checked = check([], load, known_hosts=known_host or (), contents=files, proxy_analysis=name_clashes)
    findings = [*refused, *checked]
    if not files and not refused:
        message = f"no YAML files (*.yaml, *.yml) in {directory}: nothing to check"
        findings.append(Finding(Severity.ERROR, message, root))
    if findings:  # warnings are shown as validate shows them; only errors stop the push
        out.print_findings(findings, "text")
        out.summary(findings)
    if any(f.severity is Severity.ERROR for f in findings):
        typer.echo(f"not pushed: {directory} is invalid", err=True)
        raise typer.Exit(EXIT_INVALID)
    tree = {os.path.relpath(path, root).replace(os.sep, "/"): data for path, data in files.items()}
    conn = ConsulConnection(options)
    try:
        plan = plan_push(location.prefix, tree, read_current(conn, options, location.prefix))
        for line in plan.describe():
            typer.echo(line)
        where = f"consul KV {location.prefix or '/'} at {options.url}"
        if plan.empty:
            typer.echo(f"nothing to push: {where} already holds {directory} ({plan.summary()})")
        elif dry_run:
            typer.echo(f"would push to {where}: {plan.summary()} (dry run, nothing written)")
        else:
            transactions = apply_push(conn, options, plan, split=split)
            several = f" in {transactions} transactions" if transactions > 1 else ""
            typer.echo(f"pushed to {where}{several}: {plan.summary()}")
    finally:
        conn.close()
    raise typer.Exit(EXIT_OK)


@reported
def pull(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="Where to write the tree: a new or empty directory.")
    ],
    prefix: Prefix,
    consul: Consul = None,
    consul_token: ConsulToken = None,
    consul_ca_file: ConsulCaFile = None,
    consul_datacenter: ConsulDatacenter = None,
) -> None:
    """Write the config tree a Consul KV prefix holds into a directory: one file per key, as
    `meshctl serve --config-consul-kv` reads them, so that `validate`, `dump`, `simulate` and
    `diff` can be run on exactly what the servers serve (`--config-dir DIR`).

    Keys that are not YAML file names are left out, as the server leaves them out. The tree is
    written whole or not at all. Exit status: 0 written, 2 usage or Consul error (DIR not empty,
    Consul unreachable, keys no tree can hold: `c.yaml` beside `c.yaml/d.yaml`, a NUL in a name).
    """
    from meshctl.errors import UsageError
    from meshctl.kv.push import read_current
    from meshctl.kv.source import KvLocation
    from meshctl.registry.consul_http import ConsulConnection, ConsulOptions

    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory}: not an empty directory (kv pull writes a whole tree, and overwrites nothing)")
    options = ConsulOptions.from_env(
        address=consul, token=consul_token, ca_file=consul_ca_file, datacenter=consul_datacenter
    )
    location = KvLocation(options, prefix)
    conn = ConsulConnection(options)
    try:
        current = read_current(conn, options, location.prefix)
    finally:
        conn.close()
    refused = unwritable_names(current)
    if refused:
        raise UsageError(f"not pulled, nothing written: {refused}")
    write_tree(directory, {name: entry.value for name, entry in current.items()})
    typer.echo(f"pulled {len(current)} files from consul KV {location.prefix or '/'} at {options.url} into {directory}")
    raise typer.Exit(EXIT_OK)


def unwritable_names(names: Iterable[str]) -> str | None:
    """Why the keys `names` (relative to the prefix, `is_config_key` already) cannot all be files
    of one tree, naming them, or None: a key with a NUL, which no file name holds, or a key that
    another one needs as a directory (`c.yaml` and `c.yaml/d.yaml`)."""
    names = sorted(names)
    bad = [n for n in names if "\0" in n]
    if bad:
        return f"consul KV key {bad[0]!r} holds a NUL byte, which no file name can"
    taken = set(names)
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder in taken:
                return f"consul KV keys {folder!r} and {name!r} cannot both be files (one is the other's folder)"
    return None


def write_tree(directory: Path, tree: Mapping[str, bytes]) -> None:
    """Write `tree` (file name -> bytes) under `directory` (new or empty) whole or not at all: into
    a new folder beside it, renamed into place at the end, so a failure leaves no half tree."""
    import os
    import secrets
    import shutil

    from meshctl.errors import UsageError

    directory = directory.absolute()
    staging = directory.with_name(f".{directory.name}.pull-{secrets.token_hex(4)}")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:
        raise UsageError(f"cannot write {directory}: {exc.strerror or exc}; nothing written") from exc
    try:
        for name, value in sorted(tree.items()):
            # Names are relative and checked (`is_config_key`: no empty, hidden, `.` or `..` part).
            path = staging.joinpath(*name.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
        os.replace(staging, directory)  # onto a missing or empty directory: atomic
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UsageError(f"cannot write {directory}: {exc.strerror or exc}; nothing written") from exc
