"""The real server in-process on loopback, for tests: free ports, quick timings, always stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from meshctl.server.app import Server
from meshctl.server.discovery import DebounceSettings
from meshctl.server.settings import ServeSettings


@asynccontextmanager
async def serving(config_dirs: Path | Sequence[Path], **settings: Any) -> AsyncIterator[Server]:
    """A started `Server` for the block: xDS and admin on free loopback ports, a 50 ms debounce
    and a short drain unless `settings` (any `ServeSettings` field) say otherwise."""
    dirs = (config_dirs,) if isinstance(config_dirs, Path) else tuple(config_dirs)
    defaults: dict[str, Any] = {
        "xds_address": "127.0.0.1:0",
        "admin_address": "127.0.0.1:0",
        "debounce": DebounceSettings(0.05, 5.0),
        "drain_seconds": 0.2,
    }
    server = Server(ServeSettings(config_dirs=dirs, **{**defaults, **settings}))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def run(test: Callable[[], Awaitable[None]], timeout: float = 60.0) -> None:
    """Run an async test body with a deadline: a hung server fails the test instead of the run."""
    asyncio.run(asyncio.wait_for(test(), timeout))
