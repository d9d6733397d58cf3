"""WasmPlugin rules (Istio's `ValidateWasmPlugin`), and what meshctl checks of the module itself.

Istio checks that `url` is set with a known scheme, `sha256` is 64 hex digits, `selector` and
`targetRefs` are not both set and name what they may, the environment variables have names,
unique, and no value when taken from the host, and match ports are ports. meshctl adds:

- the module is local (`file://` and an absolute path): the loader refuses a url to download
  before this runs (`WASM_DOWNLOAD_REFUSED`);
- with `sha256`, the module is read and its digest compared, when its document is loaded (by
  `validate` and by a server on every load of the file): a module that cannot be read or does
  not match is an error, so the plugin is not applied and the file keeps its last good contents.
  Without `sha256` the module is only looked for: its path is read by the proxy, on its own host,
  so one missing here is a warning;
- `imagePullPolicy`, `imagePullSecret` and `verificationKey` mean nothing for a local module: a
  warning that they are ignored;
- `targetRefs` resolve as `snapshot/target_refs.py` says; a GatewayClass is refused.

This is the one rule module that reads a file: the module's digest is part of what makes the
resource valid, and the loader is where meshctl does I/O (generators never do).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.api.extensions.v1alpha1 import wasm_pb2
from meshctl.config.references import POLICY_TARGET_KINDS, POLICY_TARGET_NAMES
from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report, check_selector

_SHA256: Final = re.compile(r"[a-f0-9]{64}")
_C_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The largest module read to check a digest: Envoy's own limit on a local data source.
MAX_MODULE_BYTES: Final = 64 * 1024 * 1024


def module_digest(path: str) -> str:
    """The sha256 of the module at `path`; raises OSError when it cannot be read whole."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            size += len(chunk)
            if size > MAX_MODULE_BYTES:
                raise OSError(f"larger than {MAX_MODULE_BYTES // (1024 * 1024)} MiB")
            h.update(chunk)
    return h.hexdigest()


def _check_module(report: Report, plugin: Any) -> None:
    url: str = plugin.url
    if not url:
        report.error(("spec", "url"), "url must be set (a file:// url of a module on the proxy's host)")
        return
    if not url.startswith("file://"):
        return  # refused by the loader before it gets here
    path = url.removeprefix("file://")
    if not path.startswith("/"):
        report.error(("spec", "url"), f"url {url!r} must name an absolute path (file:///path/to/module.wasm)")
        return
    if plugin.sha256 and not _SHA256.fullmatch(plugin.sha256):
        report.error(("spec", "sha256"), f"sha256 {plugin.sha256!r} must be 64 lowercase hex digits")
        return
    if plugin.sha256:
        try:
            digest = module_digest(path)
        except OSError as e:
            reason = e.strerror or str(e)
            report.error(("spec", "sha256"), f"cannot check the sha256 of {path}: {reason}")
            return
        if digest != plugin.sha256:
            report.error(
                ("spec", "sha256"), f"{path} has sha256 {digest}, not {plugin.sha256}: the plugin is not applied"
            )
    elif not os.path.isfile(path):
        report.warn(
            ("spec", "url"), f"{path} is not on this host: the proxy's host must have it, or Envoy refuses the plugin"
        )


def _check_targets(report: Report, plugin: Any) -> None:
    refs: list[tuple[tuple[str | int, ...], Any]] = []
    if plugin.HasField("target_ref"):
        refs.append((("spec", "targetRef"), plugin.target_ref))
    refs.extend((("spec", "targetRefs", i), ref) for i, ref in enumerate(plugin.target_refs))
    if plugin.HasField("selector"):
        check_selector(report, ("spec", "selector", "matchLabels"), plugin.selector.match_labels, "the WasmPlugin")
        if refs:
            report.error(refs[0][0], "only one of targetRefs or selector can be set")
    for path, ref in refs:
        if not ref.name:
            report.error((*path, "name"), "targetRef name must be set")
        if ref.namespace:
            report.error((*path, "namespace"), "targetRef namespace must not be set: it names the WasmPlugin's own")
        group = ref.group or "core"
        if (group, ref.kind) == ("gateway.networking.k8s.io", "GatewayClass"):
            report.error((*path, "kind"), "a GatewayClass names gateways of a class, which meshctl does not have")
        elif (group, ref.kind) not in POLICY_TARGET_KINDS:
            report.error(
                (*path, "kind"),
                f"targetRef must be to a {POLICY_TARGET_NAMES}, not {group}/{ref.kind}",
            )


def validate(spec: Message) -> list[Issue]:
    plugin: Any = spec
    report = Report()
    _check_module(report, plugin)
    _check_targets(report, plugin)
    for field, name in (
        ("image_pull_policy", "imagePullPolicy"),
        ("image_pull_secret", "imagePullSecret"),
        ("verification_key", "verificationKey"),
    ):
        if getattr(plugin, field):
            report.warn(("spec", name), f"{name} is ignored: meshctl pulls nothing, the module is a local file")
    seen: set[str] = set()
    for i, var in enumerate(plugin.vm_config.env):
        path = ("spec", "vmConfig", "env", i)
        if not var.name:
            report.error((*path, "name"), "an environment variable must have a name")
        elif not _C_IDENTIFIER.fullmatch(var.name):
            report.error((*path, "name"), f"environment variable name {var.name!r} must be a C identifier")
        elif var.name in seen:
            report.error((*path, "name"), f"duplicate environment variable {var.name!r}")
        seen.add(var.name)
        if var.value_from == wasm_pb2.HOST and var.value:
            report.error((*path, "value"), "value may only be set when valueFrom is INLINE")
    for i, selector in enumerate(plugin.match):
        for j, port in enumerate(selector.ports):
            if not 1 <= port.number <= 65535:
                report.error(("spec", "match", i, "ports", j, "number"), f"port {port.number} must be in 1-65535")
    return report.issues
