"""`meshctl validate`: what CI runs on every pull request that touches the mesh's YAML."""

from __future__ import annotations

import datetime
import enum
import gc
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl.cli.exits import reported

if TYPE_CHECKING:
    from meshctl.config.findings import Finding

EXIT_OK, EXIT_INVALID = 0, 1  # usage and internal errors exit 2, at the CLI's edge (`meshctl.cli.exits`)


class Format(enum.StrEnum):
    text = "text"
    json = "json"
    github = "github"


@reported
def validate(
    paths: Annotated[list[str], typer.Argument(help="Files or directories to check; - reads stdin.")],
    output: Annotated[Format, typer.Option("--output", "-o", help="text, json (for tools) or github.")] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail the run too.")] = False,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace of resources that name none.")
    ] = "default",
    known_host: Annotated[
        list[str] | None,
        typer.Option("--known-host", help="A host another registry (Consul) provides; repeatable, * allowed."),
    ] = None,
    analyze: Annotated[bool, typer.Option(help="Run cross-resource analysis (IST codes).")] = True,
    allow_unenforced_security: Annotated[
        bool,
        typer.Option(
            "--allow-unenforced-security",
            hidden=True,
            help="No longer needed: every security.istio.io kind is enforced. Accepted and ignored.",
        ),
    ] = False,
    mesh_config: Annotated[
        str | None, typer.Option(help="Also check Istio's MeshConfig YAML, as serve --mesh-config reads it.")
    ] = None,
    ca_dir: Annotated[
        str | None,
        typer.Option(
            envvar="MESHCTL_CA_DIR",
            help="With --mesh-config: the CA serve signs with (--ca-dir); a workload certificate lifetime "
            "that outlasts it is warned about.",
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=0, help="Processes loading files side by side; 0: by the tree's size and idle CPUs."
        ),
    ] = 0,
) -> None:
    """Check Istio YAML as Istio would: schema, per-kind rules and cross-resource analysis.

    Exit status: 0 valid (warnings allowed), 1 invalid input, 2 usage or internal error.
    """
    from functools import partial
    from pathlib import Path

    from meshctl.check.names import name_clashes
    from meshctl.cli import output as out
    from meshctl.config.check import check
    from meshctl.config.findings import Severity, sort_findings
    from meshctl.config.loader import LoadOptions
    from meshctl.config.mesh import DEFAULT_ROOT_NAMESPACE
    from meshctl.errors import UsageError

    missing = [p for p in paths if p != "-" and not Path(p).exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    # Loading makes a few hundred thousand short-lived objects and no reference cycles, so the
    # cyclic garbage collector's passes (a seventh of a big run) would find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        options = LoadOptions(default_namespace=namespace, workers=jobs)
        stdin_text, refused = _read_stdin(options.max_file_bytes) if "-" in paths else (None, [])
        mesh_findings: list[Finding] = []
        root_namespace = DEFAULT_ROOT_NAMESPACE
        settings = None
        if mesh_config is not None:
            from meshctl.config.mesh import load_mesh_config

            settings, mesh_findings = load_mesh_config(Path(mesh_config), ca_not_after=_ca_end(ca_dir))
            root_namespace = settings.root_namespace if settings is not None else root_namespace
        findings = check(
            [p for p in paths if p != "-" or not refused],
            options,
            stdin_text=stdin_text,
            known_hosts=known_host or (),
            analysis=analyze,
            root_namespace=root_namespace,
            proxy_analysis=partial(name_clashes, mesh=settings),
        )
        findings = sort_findings([*findings, *refused, *mesh_findings]) if refused or mesh_findings else findings
    finally:
        if collecting:
            gc.enable()
    out.print_findings(findings, output.value)
    if output is Format.text:
        out.summary(findings)
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    raise typer.Exit(EXIT_INVALID if any(f.severity in failing for f in findings) else EXIT_OK)


def _ca_end(ca_dir: str | None) -> datetime.datetime | None:
    """When the CA of `ca_dir` (Istio's cacerts files) stops issuing; UsageError when unusable."""
    if ca_dir is None:
        return None
    from meshctl.errors import CredentialError, UsageError
    from meshctl.security.ca import CertificateAuthority

    try:
        return CertificateAuthority.from_ca_dir(ca_dir).not_after
    except CredentialError as exc:
        raise UsageError(f"--ca-dir: {exc}") from None


def _read_stdin(limit: int) -> tuple[str | None, list[Finding]]:
    """Stdin as text, or the finding that refuses it as a file's would be: never more than
    `limit` bytes and one are read, so `yes | meshctl validate -` ends, and at once."""
    from meshctl.config.files import decode_text, read_bounded
    from meshctl.config.findings import Finding, Severity
    from meshctl.errors import ConfigError

    try:
        return decode_text(read_bounded(sys.stdin.buffer.read, limit)), []
    except ConfigError as exc:
        return None, [Finding(Severity.ERROR, str(exc), "<stdin>")]
