"""How often the server speaks of its CA's end (`meshctl.server.ca_expiry`): a warning at most
once a day while the end is near, an error at every look (once a minute) once it has passed,
and the next look at the very moment it passes."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from test_ca import NOW, make_ca_cert, write_cacerts

from meshctl.security.ca import CertificateAuthority
from meshctl.server.ca_expiry import CaExpiryWatch


def authority(tmp_path: Path, expires_in: timedelta) -> CertificateAuthority:
    root = make_ca_cert("root", not_before=NOW - timedelta(days=1), not_after=NOW + timedelta(days=3650))
    signing = make_ca_cert("mesh", root, not_before=NOW - timedelta(days=1), not_after=NOW + expires_in)
    return CertificateAuthority.from_ca_dir(write_cacerts(tmp_path, signing, root), now=NOW)


def said(caplog: pytest.LogCaptureFixture, level: int) -> int:
    return sum(r.levelno == level and "CN=mesh" in r.getMessage() for r in caplog.records)


def test_a_near_end_is_warned_about_once_a_day(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watch = CaExpiryWatch(authority(tmp_path, timedelta(days=20)))
    with caplog.at_level(logging.INFO, logger="meshctl.server"):
        for minute in range(0, 24 * 60, 7):
            assert watch.check(NOW + timedelta(minutes=minute)) == 60
        assert said(caplog, logging.WARNING) == 1
        watch.check(NOW + timedelta(days=1, minutes=1))
        assert said(caplog, logging.WARNING) == 2


def test_a_far_end_is_not_spoken_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watch = CaExpiryWatch(authority(tmp_path, timedelta(days=300)))
    with caplog.at_level(logging.INFO, logger="meshctl.server"):
        watch.check(NOW)
    assert said(caplog, logging.WARNING) == said(caplog, logging.ERROR) == 0


def test_a_passed_end_is_an_error_at_every_look(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watch = CaExpiryWatch(authority(tmp_path, timedelta(seconds=30)))
    with caplog.at_level(logging.INFO, logger="meshctl.server"):
        assert watch.check(NOW) == pytest.approx(30.05)  # the next look is when it expires
        for minute in range(1, 4):
            assert watch.check(NOW + timedelta(minutes=minute)) == 60
    assert said(caplog, logging.WARNING) == 1
    assert said(caplog, logging.ERROR) == 3
