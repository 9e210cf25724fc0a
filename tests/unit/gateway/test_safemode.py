"""Safemode grants and assignments on the gateway's database (the CLI's functions)."""

from __future__ import annotations

from pathlib import Path

from gateway_http import safemode
from gateway_http.store import MIGRATIONS
from libs.db import Database


def test_a_target_is_cleared_only_by_a_live_grant_and_an_assignment(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'gateway.db'}", MIGRATIONS)
    db.migrate()
    try:
        with db.session() as s, s.begin():
            assert not safemode.cleared(s, "a", "t")
            safemode.grant(s, "a", "t", ttl_s=60, now=1_000_000)
            assert not safemode.cleared(s, "a", "t", now=1_000_001), "a grant alone is not enough"
            assert safemode.assign(s, "a", "t") and not safemode.assign(s, "a", "t")
        with db.session() as s, s.begin():
            assert safemode.cleared(s, "a", "t", now=1_059_999)
            assert not safemode.cleared(s, "a", "t", now=1_060_000), "an expired grant is not live"
            assert not safemode.cleared(s, "b", "t", now=1_000_001), "per agent"
            safemode.grant(s, "a", "t", ttl_s=None)
            assert safemode.cleared(s, "a", "t")
            assert safemode.revoke(s, "a", "t") and not safemode.revoke(s, "a", "t")
            assert not safemode.cleared(s, "a", "t")
            assert [(e.agent_id, e.target, e.granted, e.assigned) for e in safemode.entries(s)] == [
                ("a", "t", "revoked", True)
            ]
            safemode.grant(s, "a", "t", ttl_s=None)
            assert safemode.unassign(s, "a", "t") and not safemode.cleared(s, "a", "t")
    finally:
        db.close()
