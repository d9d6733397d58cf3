"""The `meshctl serve` test harness keeps its ports as a real restart does, and a port another
program takes before the first run is picked again rather than failing the test."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from meshctl.testing.envoy import free_port
from meshctl.testing.serve_process import ServeError, ServeProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"


def _taken(port: int) -> socket.socket:
    """`port` held by another program, as a listener."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the last run's TIME_WAIT
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def test_a_port_taken_before_the_first_run_is_picked_again_and_kept_across_a_restart() -> None:
    server = ServeProcess([EXAMPLES])
    taken = free_port()
    server.xds_port = taken
    with _taken(taken), server:
        assert server.xds_port != taken
        assert "address already in use" in server.log().lower()
        ports = (server.xds_port, server.admin_port)
        server.restart()
        assert (server.xds_port, server.admin_port) == ports


def test_a_restart_finding_its_port_taken_fails_rather_than_moving() -> None:
    with ServeProcess([EXAMPLES]) as server:
        server.stop()
        with _taken(server.admin_port), pytest.raises(ServeError, match=r"(?i)address already in use"):
            server.start()
