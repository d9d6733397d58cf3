"""The per-version maps the resource cache keeps its generations in hold the versions last
used, not last stored: a change undone brings the snapshot back to a version already held, and
the next change must drop the version nobody is served from, not the one every proxy is."""

from __future__ import annotations

from meshctl.server.cache_parts import Recent


def test_a_version_found_again_is_kept_when_the_next_one_comes() -> None:
    recent: Recent[str, str] = Recent(2)
    recent.put("A", "proxy", "config at A")
    recent.put("B", "proxy", "config at B")
    assert recent.get("A", "proxy") == "config at A"  # the change undone: back at A
    assert recent.put("C", "proxy", "config at C") == ["B"]
    assert recent.get("A", "proxy") == "config at A"
    assert recent.get("B", "proxy") is None


def test_a_miss_does_not_change_which_version_goes_first() -> None:
    recent: Recent[str, str] = Recent(2)
    recent.put("A", "proxy", "config at A")
    recent.put("B", "proxy", "config at B")
    assert recent.get("A", "other") is None
    assert recent.put("C", "proxy", "config at C") == ["A"]
    assert recent.versions == ("B", "C")
