"""The admin server's access rule: /ready and /metrics open, /debug behind a bearer token.

The rule is checked on `AdminServer.answer` (a request head in, a response out, no sockets) for
addresses a test must not listen on, and over real HTTP on loopback against the real server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import examples_copy

from meshctl.errors import CredentialError
from meshctl.server.admin import AdminServer
from meshctl.server.app import Server
from meshctl.server.auth import BearerToken, is_loopback
from meshctl.server.settings import ServeSettings
from meshctl.testing.server import run, serving


class State:
    """Admin pages over fixed data, so what a page shows is known."""

    def version(self) -> dict[str, Any]:
        return {"version": "test", "snapshot": ""}

    def ready(self) -> bool:
        return True

    def metrics_text(self) -> str:
        return "pilot_xds 1\n"

    def syncz(self) -> list[dict[str, Any]]:
        return [{"proxy": "sidecar~10.0.0.1~a.b~b.svc.cluster.local"}]

    def config_dump(self, proxy_id: str) -> dict[str, Any] | None:
        return {"proxy": proxy_id}

    def registryz(self) -> dict[str, Any]:
        return {"services": []}

    def configz(self) -> dict[str, Any]:
        return {"configs": []}

    def ready_note(self) -> str:
        return ""

    def history(self, version: str = "") -> Any:
        return []

    def rollout(self) -> dict[str, Any]:
        return {"state": "complete"}

    def rollout_act(self, action: str, version: str = "") -> str:
        self.acted = action
        return f"did {action}"


def head(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers]) + "\r\n\r\n").encode()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text("tok-1\n")
    return path


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.10.0.1", False),
        ("meshctl.internal", False),  # a name could resolve anywhere
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_beyond_loopback_without_a_token_the_debug_pages_are_refused() -> None:
    admin = AdminServer(State(), "0.0.0.0", 15014)
    for path in ("/debug/syncz", "/debug/config_dump?proxyID=x", "/debug/registryz", "/debug/configz", "/debug"):
        response = admin.answer(head(path, "Authorization: Bearer anything"))
        assert response.status == 403, path
        assert b"--admin-token-file" in response.body
    assert admin.answer(head("/ready")).status == 200
    assert admin.answer(head("/metrics")).body == b"pilot_xds 1\n"
    # On loopback the pages stay open without a token, as before.
    assert AdminServer(State(), "127.0.0.1", 15014).answer(head("/debug/syncz")).status == 200


def test_with_a_token_the_debug_pages_need_it_wherever_the_server_listens(token_file: Path) -> None:
    for host in ("0.0.0.0", "127.0.0.1"):
        admin = AdminServer(State(), host, 15014, BearerToken(token_file))
        missing = admin.answer(head("/debug/syncz"))
        assert missing.status == 401
        assert dict(missing.headers)["WWW-Authenticate"] == 'Bearer realm="meshctl", error="invalid_request"'
        for wrong in ("Bearer tok-2", "Bearer tok-1x", "Bearer ", "Basic dG9rLTE=", "tok-1", "Bearertok-1"):
            refused = admin.answer(head("/debug/syncz", f"Authorization: {wrong}"))
            assert refused.status == 401, wrong
            assert "invalid_token" in dict(refused.headers)["WWW-Authenticate"]
        for right in ("Authorization: Bearer tok-1", "authorization:   bearer tok-1  "):
            assert admin.answer(head("/debug/syncz", "Accept: */*", right)).status == 200, right
        assert admin.answer(head("/debug/config_dump?proxyID=p", "Authorization: Bearer tok-1")).body.startswith(b"{")
        assert admin.answer(head("/ready")).status == 200
        assert admin.answer(head("/metrics")).status == 200


def test_the_token_file_is_reread_when_it_changes_and_a_bad_rewrite_keeps_the_last_token(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = BearerToken(token_file)
    assert token.verify("Bearer tok-1")
    tmp = token_file.with_name("next")
    tmp.write_text("tok-2")
    os.replace(tmp, token_file)
    assert not token.verify("Bearer tok-1")
    assert token.verify("Bearer tok-2")
    tmp.write_text("  \n")
    os.replace(tmp, token_file)
    with caplog.at_level(logging.WARNING, logger="meshctl.server.auth"):
        assert token.verify("Bearer tok-2")
    assert any("is empty" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("content", ["", "\n", "two words\n"])
def test_a_token_file_without_one_token_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(CredentialError, match="token"):
        BearerToken(path)
    with pytest.raises(CredentialError, match="cannot read"):
        BearerToken(tmp_path / "missing")


# -- the real server --------------------------------------------------------------------------------


def _get(url: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def get(server: Server, path: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET from another thread: the server answers on this test's event loop."""
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{server.admin_port}{path}", token)


@pytest.mark.slow
def test_the_running_server_asks_for_the_token_on_debug_pages_only(tmp_path: Path, token_file: Path) -> None:
    mesh = examples_copy(tmp_path)

    async def test() -> None:
        async with serving(mesh, admin_token_file=token_file) as server:
            status, headers, _ = await get(server, "/debug/configz")
            assert status == 401
            assert headers["WWW-Authenticate"].startswith("Bearer ")
            assert (await get(server, "/debug/configz", "wrong"))[0] == 401
            status, _, body = await get(server, "/debug/configz", "tok-1")
            assert status == 200
            assert b"bookinfo" in body
            assert (await get(server, "/ready"))[0] == 200
            status, _, body = await get(server, "/metrics")
            assert status == 200
            assert b"pilot_services" in body

    run(test)


def test_the_server_does_not_start_with_an_unreadable_token_file(tmp_path: Path) -> None:
    async def test() -> None:
        server = Server(
            ServeSettings(
                config_dirs=(tmp_path,),
                xds_address="127.0.0.1:0",
                admin_address="127.0.0.1:0",
                admin_token_file=tmp_path / "missing",
            )
        )
        with pytest.raises(CredentialError, match="missing"):
            await server.start()
        assert server.xds_port == 0

    run(test)


def test_rollout_actions_are_posts_the_admin_token_protects(token_file: Path) -> None:
    state = State()
    admin = AdminServer(state, "0.0.0.0", 15014, BearerToken(token_file))
    post = "POST /debug/rollout?action=promote HTTP/1.1\r\nHost: x\r\n"
    assert admin.answer(f"{post}\r\n".encode()).status == 401
    assert admin.answer(f"{post}Authorization: Bearer tok-2\r\n\r\n".encode()).status == 401
    assert not hasattr(state, "acted")
    done = admin.answer(f"{post}Authorization: Bearer tok-1\r\n\r\n".encode())
    assert done.status == 200 and b"did promote" in done.body
    assert state.acted == "promote"
    # A GET reads the rollout and changes nothing; POST goes nowhere else.
    assert admin.answer(head("/debug/rollout?action=hold", "Authorization: Bearer tok-1")).status == 200
    assert state.acted == "promote"
    elsewhere = "POST /debug/syncz HTTP/1.1\r\nAuthorization: Bearer tok-1\r\n\r\n"
    assert admin.answer(elsewhere.encode()).status == 405
    # Beyond loopback without a token, actions are refused like every /debug page.
    assert AdminServer(State(), "0.0.0.0", 15014).answer(f"{post}\r\n".encode()).status == 403
