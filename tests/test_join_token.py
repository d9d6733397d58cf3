"""Join tokens as values: minted and verified with the CA-derived key, spent once."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from meshctl.security import join_token
from meshctl.security.ca import CertificateAuthority

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return CertificateAuthority.self_signed(tmp_path_factory.mktemp("state")).derive_key(join_token.PURPOSE)


def test_a_replica_holding_the_same_ca_derives_the_same_key(tmp_path: Path, key: bytes) -> None:
    state = tmp_path / "state"
    assert CertificateAuthority.self_signed(state).derive_key(b"x") == CertificateAuthority.self_signed(
        state
    ).derive_key(b"x")
    assert CertificateAuthority.self_signed(tmp_path / "other").derive_key(join_token.PURPOSE) != key


def test_a_token_verifies_until_it_ends(key: bytes) -> None:
    token = join_token.mint(key, "orders-vm.shop", HOUR, NOW)
    claims = join_token.verify(key, token, NOW + HOUR - datetime.timedelta(seconds=1))
    assert (claims.name, claims.namespace) == ("orders-vm", "shop")
    with pytest.raises(join_token.TokenRefused, match="expired"):
        join_token.verify(key, token, NOW + HOUR)


def test_a_changed_token_is_refused(key: bytes) -> None:
    token = join_token.mint(key, "orders-vm.shop", HOUR, NOW)
    prefix, payload, mac = token.split(".")
    other = join_token.mint(key, "billing.shop", HOUR, NOW).split(".")[1]
    for text in (f"{prefix}.{other}.{mac}", f"{prefix}.{payload}.{mac[:-2]}AA", "mjt1.e30.", "garbage", ""):
        with pytest.raises(join_token.TokenRefused):
            join_token.verify(key, text, NOW)
    with pytest.raises(join_token.TokenRefused, match="not minted by this mesh's CA"):
        join_token.verify(b"another key" * 3, token, NOW)


def test_a_token_is_spent_once_and_its_record_pruned_after_it_ends(tmp_path: Path, key: bytes) -> None:
    first = join_token.verify(key, join_token.mint(key, "a.shop", HOUR, NOW), NOW)
    join_token.use(tmp_path, first, NOW)
    with pytest.raises(join_token.TokenRefused, match="used already"):
        join_token.use(tmp_path, first, NOW)
    later = NOW + 2 * HOUR
    second = join_token.verify(key, join_token.mint(key, "b.shop", HOUR, later), later)
    join_token.use(tmp_path, second, later)
    assert sorted(p.name for p in (tmp_path / join_token.USED_DIR).iterdir()) == [second.id]
