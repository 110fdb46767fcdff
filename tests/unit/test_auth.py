"""API keys and refusals, the pure parts: key format and hash, scopes, who may read a job, the
WWW-Authenticate challenges, and API_AUTH on by default (the rest runs against a real API in
tests/faults/test_auth_refusals.py)."""

from __future__ import annotations

import hashlib
import re

import pytest

from bulk_recorder.infra.metrics import AUTH_FAILURE_REASONS, Metrics
from bulk_recorder.producer.api.auth import ANONYMOUS_PRINCIPAL, AuthError, Principal
from bulk_recorder.producer.key_store import (
    DEFAULT_SCOPES,
    SCOPES,
    ApiKeyRefused,
    check_scopes,
    generate_key,
    hash_key,
)
from settings import load_settings


def test_keys_are_random_256_bit_and_stored_as_their_sha256() -> None:
    keys = {generate_key() for _ in range(1000)}
    assert len(keys) == 1000
    for key in list(keys)[:50]:
        assert re.fullmatch(r"brk_[A-Za-z0-9_-]{43}", key)  # 32 bytes, URL-safe base64
        assert hash_key(key) == hashlib.sha256(key.encode()).digest()
        assert len(hash_key(key)) == 32


def test_scopes_are_checked_and_put_in_order() -> None:
    assert check_scopes(["jobs:read", "transactions:write"]) == ("transactions:write", "jobs:read")
    assert DEFAULT_SCOPES == ("transactions:write", "jobs:write", "jobs:read")
    assert "admin" in SCOPES
    assert "admin" not in DEFAULT_SCOPES
    with pytest.raises(ApiKeyRefused, match="unknown scope jobs:delete"):
        check_scopes(["jobs:delete"])
    with pytest.raises(ApiKeyRefused, match="at least one scope"):
        check_scopes([])


def test_a_job_is_readable_by_its_client_and_by_admin_only() -> None:
    alice = Principal("alice", frozenset({"jobs:read"}))
    ops = Principal("ops", frozenset({"admin"}))
    assert alice.may_read("alice")
    assert not alice.may_read("bob")
    assert not alice.may_read("")  # rows from before keys, or from API_AUTH=off
    assert ops.may_read("bob")
    assert ANONYMOUS_PRINCIPAL.may_read("bob")  # API_AUTH=off: one client, every scope
    assert ANONYMOUS_PRINCIPAL.scopes == frozenset(SCOPES)


def test_challenges_follow_rfc_6750() -> None:
    realm = 'Bearer realm="bulk-recorder"'
    assert AuthError("missing", "x").www_authenticate() == realm
    for reason in ("malformed", "unknown", "revoked"):
        error = AuthError(reason, "x")
        assert error.status == 401
        assert error.www_authenticate() == f'{realm}, error="invalid_token"'
    scope = AuthError("scope", "x", scope="jobs:write")
    assert scope.status == 403
    assert scope.www_authenticate() == (f'{realm}, error="insufficient_scope", scope="jobs:write"')


def test_every_failure_reason_is_a_series_from_the_start() -> None:
    metrics = Metrics()
    for reason in AUTH_FAILURE_REASONS:
        value = metrics.registry.get_sample_value(
            "bulk_recorder_api_auth_failures_total", {"reason": reason}
        )
        assert value == 0.0, reason


def test_api_auth_is_on_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("API_AUTH", raising=False)
    assert load_settings().api_auth == "on"
    monkeypatch.setenv("API_AUTH", " OFF ")
    assert load_settings().api_auth == "off"
