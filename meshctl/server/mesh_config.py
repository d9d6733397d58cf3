"""Following a MeshConfig file (`meshctl serve --mesh-config`) as the config directory is followed.

The file is looked at once a second (one stat); when it changes it is loaded again. Settings that
load replace the old ones and are pushed; a file that fails to load, or disappears, keeps the
settings last loaded, and the log says so once per change of the file, as for a config file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from meshctl.config.files import signature
from meshctl.config.findings import Severity
from meshctl.config.mesh import MeshSettings, load_mesh_config

logger = logging.getLogger("meshctl.server.mesh_config")

_LEVELS = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING}


class MeshConfigFile:
    """The settings of one MeshConfig file, as last loaded; `check()` loads a changed file."""

    def __init__(self, path: Path, fallback: MeshSettings) -> None:
        self.path = path
        self.settings = fallback
        self._stamp: tuple[int, ...] | None = None
        self.check()

    def check(self) -> MeshSettings | None:
        """The new settings when the file changed and loads, else None (nothing to push)."""
        try:
            stamp: tuple[int, ...] | None = signature(os.stat(self.path))
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        settings, findings = load_mesh_config(self.path)
        for finding in findings:
            logger.log(_LEVELS.get(finding.severity, logging.INFO), "%s", finding)
        if settings is None:
            logger.error("%s: keeping the mesh settings last loaded", self.path)
            return None
        if settings == self.settings:
            return None
        logger.info("mesh settings from %s: %s", self.path, settings)
        self.settings = settings
        return settings
