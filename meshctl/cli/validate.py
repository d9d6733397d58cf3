"""`meshctl validate`: what CI runs on every pull request that touches the mesh's YAML."""

from __future__ import annotations

import datetime
import enum
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl.cli.exits import reported

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from meshctl.check.envoy_validate import ProxyUnderTest
    from meshctl.cli.offline import LoadedTree
    from meshctl.config.analysis import AnalysisIssue
    from meshctl.config.findings import Finding
    from meshctl.config.mesh import MeshSettings
    from meshctl.config.model import Config

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
    credentials_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Also check the secrets credentialName names in this directory, as serve --credentials-dir "
            "reads it (DIR/NAMESPACE/NAME/tls.crt, tls.key, ca.crt): present, parsing, key matching certificate.",
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=0, help="Processes loading files side by side; 0: by the tree's size and idle CPUs."
        ),
    ] = 0,
    envoy: Annotated[
        bool,
        typer.Option("--envoy", help="Also load each proxy's generated config into a real Envoy (validate mode)."),
    ] = False,
    proxy: Annotated[
        list[str] | None,
        typer.Option("--proxy", help="With --envoy: only this WorkloadEntry NAME.NAMESPACE or node id; repeatable."),
    ] = None,
    envoy_binary: Annotated[
        str | None,
        typer.Option(
            "--envoy-binary",
            metavar="PATH",
            help="With --envoy: the envoy to run (default: beside meshctl, else on PATH).",
        ),
    ] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap", metavar="PATH", help="With --envoy: the fleet's Envoy bootstrap, for its runtime layers."
        ),
    ] = None,
) -> None:
    """Check Istio YAML as Istio would: schema, per-kind rules and cross-resource analysis;
    with --envoy, also as the fleet's Envoy would, by loading each proxy's generated config.

    Exit status: 0 valid (warnings allowed), 1 invalid input, 2 usage or internal error.
    """
    from functools import partial

    from meshctl.check.envoy_validate import find_envoy
    from meshctl.check.names import name_clashes
    from meshctl.cli import output as out
    from meshctl.config.check import check
    from meshctl.config.findings import Severity, sort_findings
    from meshctl.config.loader import LoadOptions
    from meshctl.config.mesh import DEFAULT_ROOT_NAMESPACE
    from meshctl.errors import UsageError

    missing = [
        p for p in [*paths, *([str(credentials_dir)] if credentials_dir else [])] if p != "-" and not Path(p).exists()
    ]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    if not envoy and (proxy or envoy_binary or bootstrap):
        raise UsageError("--proxy, --envoy-binary and --bootstrap go with --envoy")
    if envoy and (len(paths) != 1 or paths[0] == "-"):
        raise UsageError("--envoy checks one directory (or file) of config, not stdin or several")
    binary = find_envoy(envoy_binary) if envoy else None
    # Loading makes a few hundred thousand short-lived objects and no reference cycles, so the
    # cyclic garbage collector's passes (a seventh of a big run) would find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        options = LoadOptions(default_namespace=namespace, workers=jobs, refuse_unserved=True)
        stdin_text, refused = _read_stdin(options.max_file_bytes) if "-" in paths else (None, [])
        mesh_findings: list[Finding] = []
        root_namespace = DEFAULT_ROOT_NAMESPACE
        settings = None
        if mesh_config is not None:
            from meshctl.config.mesh import load_mesh_config

            settings, mesh_findings = load_mesh_config(Path(mesh_config), ca_not_after=_ca_end(ca_dir))
            root_namespace = settings.root_namespace if settings is not None else root_namespace
        analysis = _proxy_analysis(partial(name_clashes, mesh=settings), credentials_dir)
        if settings is not None and mesh_config is not None and settings.providers.collectors:
            analysis = _with_collectors(analysis, settings, Path(mesh_config), known_host or (), mesh_findings)
        findings = check(
            [p for p in paths if p != "-" or not refused],
            options,
            stdin_text=stdin_text,
            known_hosts=known_host or (),
            analysis=analyze,
            root_namespace=root_namespace,
            proxy_analysis=analysis,
        )
        findings = sort_findings([*findings, *refused, *mesh_findings]) if refused or mesh_findings else findings
    finally:
        if collecting:
            gc.enable()
    if binary is not None:
        if any(f.severity is Severity.ERROR for f in findings):
            out.stderr_console().print("note: --envoy skipped: the tree has errors, and no config is built from them")
        else:
            envoy_found = _envoy_findings(Path(paths[0]), binary, proxy or [], bootstrap, namespace, mesh_config)
            findings = sort_findings([*findings, *envoy_found])
    out.print_findings(findings, output.value)
    if output is Format.text:
        out.summary(findings)
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    raise typer.Exit(EXIT_INVALID if any(f.severity in failing for f in findings) else EXIT_OK)


def _proxy_analysis(
    clashes: Callable[[Sequence[Config]], list[AnalysisIssue]], credentials_dir: Path | None
) -> Callable[[Sequence[Config]], list[AnalysisIssue]]:
    """The analysis that takes the layers above `config/`: name clashes, and with a credentials
    directory the secrets config names (`meshctl.check.credentials`)."""
    if credentials_dir is None:
        return clashes
    from meshctl.check.credentials import credential_issues

    return lambda configs: [*clashes(configs), *credential_issues(configs, credentials_dir)]


def _with_collectors(
    analysis: Callable[[Sequence[Config]], list[AnalysisIssue]],
    mesh: MeshSettings,
    mesh_file: Path,
    known_hosts: Sequence[str],
    out: list[Finding],
) -> Callable[[Sequence[Config]], list[AnalysisIssue]]:
    """`analysis`, which also checks the MeshConfig's collector services against the tree's
    (`meshctl.check.collectors`), adding those findings, which are the MeshConfig's, to `out`."""
    from meshctl.check.collectors import collector_findings

    def run(configs: Sequence[Config]) -> list[AnalysisIssue]:
        out.extend(collector_findings(configs, mesh, mesh_file, known_hosts))
        return analysis(configs)

    return run


def _envoy_findings(
    path: Path, binary: str, refs: list[str], bootstrap: str | None, namespace: str, mesh_config: str | None
) -> list[Finding]:
    """`meshctl validate --envoy`: the tree built as `dump` builds it, each proxy (every
    WorkloadEntry, or those `refs` name) checked by Envoy (`meshctl.check.envoy_validate`)."""
    from meshctl.check.envoy_static import fleet_settings, read_bootstrap
    from meshctl.check.envoy_validate import EnvoySettings, envoy_findings
    from meshctl.cli import offline
    from meshctl.cli import output as out
    from meshctl.errors import UsageError

    try:
        fleet, notes = fleet_settings(read_bootstrap(Path(bootstrap)) if bootstrap is not None else {})
    except ValueError as exc:
        raise UsageError(f"--bootstrap {exc}") from exc
    tree = offline.load_tree(
        path, namespace=namespace, mesh=offline.mesh_from(Path(mesh_config) if mesh_config else None)
    )
    snapshot = tree.snapshot
    proxies = [_proxy_under_test(tree, ref, namespace) for ref in refs]
    if not refs:
        proxies = [_proxy_under_test(tree, f"{e.name}.{e.namespace}") for e in offline.workload_entries(snapshot)]
    if not proxies:
        raise UsageError(f"--envoy: {path} describes no proxy (no WorkloadEntry); name one with --proxy NODE_ID")
    for note in notes:
        out.stderr_console().print(f"note: {note}", markup=False, soft_wrap=True)
    origin = f"--bootstrap {bootstrap}" if bootstrap is not None else "meshctl bootstrap's runtime"
    report = envoy_findings(snapshot, proxies, EnvoySettings(binary, fleet, origin=origin))
    out.stderr_console().print(f"note: {report.summary()}", markup=False, soft_wrap=True)
    return report.findings


def _proxy_under_test(tree: LoadedTree, ref: str, namespace: str = "default") -> ProxyUnderTest:
    from meshctl.check.envoy_validate import ProxyUnderTest
    from meshctl.cli import offline

    target = offline.resolve_proxy(tree, ref, namespace)
    entry = None if offline.is_node_id(ref) else offline.find_workload_entry(tree.snapshot, ref, namespace)
    return ProxyUnderTest(ref if entry is None else f"{entry.name}.{entry.namespace}", target, entry)


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
