"""The small things a first-time user meets: empty stdin, a mistyped flag, a bad choice,
proxy-status as a yes/no for scripts, and the admin's config dump named as the CLI names a proxy."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, PRODUCTPAGE, examples_copy
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types

runner = CliRunner()


def test_empty_stdin_fails_like_an_empty_directory(tmp_path: Path) -> None:
    for stdin in ("", "# only a comment\n---\n"):
        result = runner.invoke(app, ["validate", "-"], input=stdin)
        assert result.exit_code == 1, result.output
        assert "error <stdin>: no YAML documents on stdin: nothing to check" in result.stdout
    empty_dir = runner.invoke(app, ["validate", str(tmp_path)])
    assert empty_dir.exit_code == 1


@pytest.mark.parametrize(
    ("args", "suggested"),
    [
        (["validate", "--strcit", "."], "--strict"),
        (["dump", "--prxy", "x"], "--proxy"),
        (["validate", "--job", "2", "."], "--jobs"),
        (["proxy-status", "--server", "x"], None),  # not --errors, which only shares letters
        (["validate", "--quiet", "."], None),
    ],
)
def test_an_unknown_flag_is_offered_only_a_flag_it_nearly_spells(args: list[str], suggested: str | None) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    message = " ".join(result.output.replace("│", " ").split())
    assert f"No such option: {args[1]}" in message
    if suggested is None:
        assert "Possible options" not in message
    else:
        assert f"(Possible options: {suggested})" in message


def test_a_bad_choice_lists_the_choices_on_one_line() -> None:
    result = runner.invoke(app, ["validate", "-o", "xml", "."])
    assert result.exit_code == 2
    assert "Value error" not in result.output
    lines = [line for line in result.output.splitlines() if "xml" in line]
    assert len(lines) == 1 and "'xml' is not one of text, json, github" in lines[0], result.output


def test_proxy_status_exits_1_while_a_proxy_shows_error(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path)
    other = PRODUCTPAGE.replace("productpage-v1-vm", "other")

    def reject_clusters(type_url: str, held: Any) -> str | None:
        return "no, thank you" if type_url == types.CLUSTER else None

    async def status(admin: str) -> tuple[int, dict[str, Any]]:
        result = await asyncio.to_thread(runner.invoke, app, ["proxy-status", "--admin", admin, "-o", "json"])
        return result.exit_code, {r["proxy"]: r for r in json.loads(result.stdout)}

    async def test() -> None:
        async with serving(tree) as server:
            admin = f"127.0.0.1:{server.admin_port}"
            xds = f"127.0.0.1:{server.xds_port}"
            async with AdsClient(xds, PRODUCTPAGE) as good:
                await good.wait_for(lambda c: c.complete())
                code, rows = await status(admin)
                while rows[PRODUCTPAGE]["CDS"] == "STALE":  # until the server has read the ACK
                    await asyncio.sleep(0.05)
                    code, rows = await status(admin)
                assert (code, rows[PRODUCTPAGE]["CDS"]) == (0, "SYNCED")
                async with AdsClient(xds, other, nack=reject_clusters):
                    while (await status(admin))[1].get(other, {}).get("CDS") != "ERROR":
                        await asyncio.sleep(0.05)
                    code, rows = await status(admin)
                    assert code == 1 and rows[other]["CDS"] == "ERROR"
                    table = await asyncio.to_thread(runner.invoke, app, ["proxy-status", "--admin", admin])
                    assert table.exit_code == 1 and "ERROR" in table.stdout

    run(test)


def test_the_admin_config_dump_takes_name_dot_namespace(tmp_path: Path) -> None:
    tree = examples_copy(tmp_path)

    def get(port: int, proxy: str) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{port}/debug/config_dump?proxyID={proxy}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    async def test() -> None:
        async with serving(tree) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as client:
            await client.wait_for(lambda c: c.complete())
            full = await asyncio.to_thread(get, server.admin_port, PRODUCTPAGE)
            short = await asyncio.to_thread(get, server.admin_port, "productpage-v1-vm.bookinfo")
            assert full[0] == short[0] == 200
            assert short[1] == full[1]
            assert (await asyncio.to_thread(get, server.admin_port, "nobody.bookinfo"))[0] == 404

    run(test)


def test_simulate_prints_a_header_matcher_as_text_not_a_dict() -> None:
    url = "http://reviews.bookinfo.mesh:9080/reviews/1"
    args = ["simulate", url, "--config-dir", str(EXAMPLES), "--proxy", "productpage-v1-vm.bookinfo"]
    result = runner.invoke(app, [*args, "-H", "end-user:jason"])
    assert result.exit_code == 0, result.output
    route = next(line for line in result.stdout.splitlines() if line.startswith("route ") and "config" not in line)
    assert route.split(None, 1)[1] == 'canary-jason: prefix /; header end-user exact "jason"'


@pytest.mark.parametrize(
    ("matcher", "text"),
    [
        ({"name": "x-debug", "present_match": True}, "x-debug present"),
        ({"name": "x-debug", "present_match": True, "invert_match": True}, "x-debug absent"),
        ({"name": "v", "string_match": {"prefix": "v1", "ignore_case": True}}, 'v prefix "v1" (any case)'),
        ({"name": "v", "string_match": {"exact": "a"}, "invert_match": True}, 'v not exact "a"'),
        ({"name": "v", "safe_regex_match": {"regex": "a.*"}}, 'v regex "a.*"'),
        ({"name": "n", "range_match": {"start": 1, "end": 5}}, "n in [1, 5)"),
    ],
)
def test_header_matchers_read_as_envoy_names_them(matcher: dict[str, Any], text: str) -> None:
    from envoy.config.route.v3 import route_components_pb2
    from google.protobuf import json_format

    from meshctl.simulate.http import describe_match

    match = json_format.ParseDict({"prefix": "/", "headers": [matcher]}, route_components_pb2.RouteMatch())
    assert describe_match(match) == f"prefix /; header {text}"


def test_serve_says_which_ca_signs_and_whether_it_was_found(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tree = examples_copy(tmp_path)
    state = tmp_path / "state"

    async def start() -> None:
        async with serving(tree, state_dir=state):
            pass

    with caplog.at_level("INFO", logger="meshctl.server"):
        run(start)
        run(start)
    lines = [r.getMessage() for r in caplog.records if "workload certificates are signed by" in r.getMessage()]
    assert len(lines) == 2, lines
    assert str(state / "ca") in lines[0] and "(made now)" in lines[0]
    assert str(state / "ca") in lines[1] and "(found)" in lines[1]
