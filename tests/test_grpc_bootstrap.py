"""`meshctl bootstrap --grpc`: gRPC's xDS bootstrap JSON, as grpcio reads it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from meshctl.cli.app import app

runner = CliRunner()


def test_grpc_bootstrap_names_the_servers_the_node_and_the_certificate_provider(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["bootstrap", "--grpc", "--proxy", "client.shop", "--ip", "10.0.0.9", "--label", "app=client",
         "--xds-address", "10.0.0.1:15010", "--xds-address", "10.0.0.2:15010", "--cert-dir", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert [s["server_uri"] for s in config["xds_servers"]] == ["10.0.0.1:15010", "10.0.0.2:15010"]
    assert config["xds_servers"][0]["server_features"] == ["xds_v3"]
    assert config["xds_servers"][0]["channel_creds"] == [{"type": "insecure"}]
    assert config["node"]["id"] == "sidecar~10.0.0.9~client.shop~shop.svc.cluster.local"
    assert config["node"]["metadata"]["GENERATOR"] == "grpc"
    assert config["node"]["metadata"]["LABELS"] == {"app": "client"}
    assert config["server_listener_resource_name_template"] == "xds.istio.io/grpc/lds/inbound/%s"
    provider = config["certificate_providers"]["default"]
    assert provider["plugin_name"] == "file_watcher"
    assert provider["config"]["certificate_file"] == str(tmp_path / "cert-chain.pem")


def test_grpc_bootstrap_over_tls_trusts_the_ca_and_presents_the_certificate(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["bootstrap", "--grpc", "--proxy", "client.shop", "--ip", "10.0.0.9", "--xds-cert-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    [creds] = json.loads(result.stdout)["xds_servers"][0]["channel_creds"]
    assert creds == {
        "type": "tls",
        "config": {
            "ca_certificate_file": str(tmp_path / "root-cert.pem"),
            "certificate_file": str(tmp_path / "cert-chain.pem"),
            "private_key_file": str(tmp_path / "key.pem"),
        },
    }


def test_grpc_speaks_state_of_the_world_though_an_envoy_defaults_to_delta() -> None:
    for args in ([], ["--sotw"]):
        result = runner.invoke(app, ["bootstrap", "--proxy", "client.shop", "--ip", "10.0.0.9", "--grpc", *args])
        assert result.exit_code == 0, (args, result.output)
        assert json.loads(result.stdout)["xds_servers"][0]["server_features"] == ["xds_v3"], args


def test_what_grpc_cannot_do_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["--grpc", "--delta"], ["--cert-dir", str(tmp_path)]):
        result = runner.invoke(app, ["bootstrap", "--proxy", "client.shop", "--ip", "10.0.0.9", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
