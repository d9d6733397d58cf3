"""`meshctl validate --mesh-config` on the workload certificate lifetime (Istio's SECRET_TTL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from test_ca import make_ca_cert, write_cacerts
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config.cert_lifetime import FIELD, LEFT_AT_RENEWAL
from meshctl.security.ca import RENEW_FRACTION

MESH_CONFIG = """apiVersion: v1
kind: ConfigMap
metadata: {{name: istio, namespace: istio-system}}
data:
  mesh: |
    trustDomain: cluster.local
    defaultConfig:
      proxyMetadata:
        SECRET_TTL: {ttl}
"""


def validate(tmp_path: Path, ttl: str, *extra: str) -> tuple[int, list[dict[str, object]]]:
    (tmp_path / "mesh").mkdir(exist_ok=True)
    (tmp_path / "mesh" / "empty-mesh.yaml").write_text("")
    config = tmp_path / "meshconfig.yaml"
    config.write_text(MESH_CONFIG.format(ttl=ttl))
    result = CliRunner().invoke(
        app, ["validate", str(tmp_path / "mesh"), "--mesh-config", str(config), "-o", "json", *extra]
    )
    assert result.exit_code in (0, 1), result.output
    findings = [f for f in json.loads(result.stdout) if f.get("field") == FIELD]
    return result.exit_code, findings


def test_a_lifetime_too_short_for_the_renewal_timer_is_named(tmp_path: Path) -> None:
    code, findings = validate(tmp_path, "30m")
    assert code == 0  # a warning, not an error
    assert [f["severity"] for f in findings] == ["warning"]
    message = str(findings[0]["message"])
    assert message.startswith(f"{FIELD} 30m") and "renewal timer" in message and "45m" in message
    assert findings[0]["line"] == 9  # the SECRET_TTL line, inside the ConfigMap's mesh block


def test_a_lifetime_leaving_under_an_hour_of_outage_is_warned(tmp_path: Path) -> None:
    _, findings = validate(tmp_path, "2h")
    assert len(findings) == 1 and "down only 40m" in str(findings[0]["message"])
    _, findings = validate(tmp_path, "24h")
    assert findings == []


def test_a_lifetime_longer_than_the_ca_has_left_is_warned(tmp_path: Path) -> None:
    root = make_ca_cert("root")
    ending = make_ca_cert("mesh CA", root, not_after=datetime.now(UTC) + timedelta(days=10))
    cacerts = write_cacerts(tmp_path / "cacerts", ending, root)
    _, findings = validate(tmp_path, "720h", "--ca-dir", str(cacerts))
    assert len(findings) == 1 and "longer than the CA has left" in str(findings[0]["message"])
    _, findings = validate(tmp_path, "24h", "--ca-dir", str(cacerts))
    assert findings == []


def test_a_lifetime_that_is_no_duration_is_an_error(tmp_path: Path) -> None:
    code, findings = validate(tmp_path, "soon")
    assert code == 1 and [f["severity"] for f in findings] == ["error"]


def test_the_renewal_share_is_the_one_the_server_uses() -> None:
    assert abs(LEFT_AT_RENEWAL - (1 - RENEW_FRACTION)) < 1e-9
