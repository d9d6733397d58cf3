"""The options the offline commands (`dump`, `simulate`) take alike to build a proxy's config the
way the server does: one declaration each, so their names, help and variables cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from meshctl.cli.offline import INTERCEPTION_HELP, MESH_CONFIG_HELP
from meshctl.snapshot.interception import InterceptionMode

ConfigDir = Annotated[
    Path,
    typer.Option(
        "--config-dir", help="Directory (or file) of Istio YAML, as the server reads it.", envvar="MESHCTL_CONFIG_DIR"
    ),
]
ConsulOnce = Annotated[
    str | None,
    typer.Option(
        "--consul", help="Also read Consul's catalog once: http(s)://host:port or host:port.", envvar="MESHCTL_CONSUL"
    ),
]
Namespace = Annotated[
    str,
    typer.Option("--namespace", "-n", help="Namespace of resources that name none, and of a bare --proxy NAME."),
]
Interception = Annotated[InterceptionMode, typer.Option(case_sensitive=False, help=INTERCEPTION_HELP)]
MeshConfig = Annotated[Path | None, typer.Option(help=MESH_CONFIG_HELP)]
