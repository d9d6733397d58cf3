"""Golden files for generated config: YAML of each resource, refreshed with MESHCTL_UPDATE_GOLDEN=1.

A golden file is what a reviewer reads to see what a feature generates, so it is plain YAML in
Envoy's own field names, one document per resource, in name order.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path

from google.protobuf.message import Message
from ruamel.yaml import YAML

from meshctl.testing.envoy import to_dict

UPDATE_ENV = "MESHCTL_UPDATE_GOLDEN"


def render(messages: Iterable[Message]) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    out = io.StringIO()
    # Through JSON: packed Any payloads come back as plain mappings (no `!!omap`), and the
    # dumper sorts every mapping's keys, so the text depends on the content alone.
    yaml.dump_all([json.loads(json.dumps(to_dict(m))) for m in messages], out)
    return out.getvalue()


def assert_golden(path: Path, messages: Iterable[Message]) -> None:
    """Compare `messages` with the golden file at `path` (write it when MESHCTL_UPDATE_GOLDEN=1)."""
    text = render(messages)
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        raise AssertionError(f"golden file {path} is missing; run the tests with {UPDATE_ENV}=1")
    expected = path.read_text()
    assert text == expected, f"{path} differs from generated config; refresh with {UPDATE_ENV}=1 if intended"
