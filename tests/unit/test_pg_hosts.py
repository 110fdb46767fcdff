"""How a multi-host DATABASE_URL is split into one URL per host, with its per-host timeout."""

from __future__ import annotations

import pytest

from bulk_recorder.infra.pg_hosts import DEFAULT_HOST_TIMEOUT_S, parse


def test_each_host_gets_its_own_url_with_every_other_part_kept() -> None:
    target = parse(
        "postgresql://app:s3cret@db1:5433,db2,[::1]:5434/ledger"
        "?target_session_attrs=read-write&connect_timeout=2.5&sslmode=disable"
    )
    assert target.host_dsns == (
        "postgresql://app:s3cret@db1:5433/ledger?target_session_attrs=read-write&sslmode=disable",
        "postgresql://app:s3cret@db2/ledger?target_session_attrs=read-write&sslmode=disable",
        "postgresql://app:s3cret@[::1]:5434/ledger?target_session_attrs=read-write&sslmode=disable",
    )
    assert target.host_timeout_s == 2.5
    assert target.hosts == ("db1:5433", "db2", "[::1]:5434")  # no user, no password


def test_one_host_is_one_url_and_the_default_timeout() -> None:
    target = parse("postgresql://postgres@127.0.0.1:5432/bulk_recorder")
    assert target.host_dsns == ("postgresql://postgres@127.0.0.1:5432/bulk_recorder",)
    assert target.host_timeout_s == DEFAULT_HOST_TIMEOUT_S


def test_hosts_given_outside_the_netloc_are_left_to_asyncpg() -> None:
    target = parse("postgresql:///ledger?host=/var/run/postgresql")
    assert target.host_dsns == ("postgresql:///ledger?host=/var/run/postgresql",)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u@a,,b/db",
        "postgresql://u@a,b/db?connect_timeout=never",
        "postgresql://u@a,b/db?connect_timeout=-1",
    ],
)
def test_a_bad_host_list_or_timeout_is_refused(dsn: str) -> None:
    with pytest.raises(ValueError, match=r"host|connect_timeout"):
        parse(dsn)
