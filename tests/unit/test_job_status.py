"""The job status's state and unsent figures, from a job row (no database needed)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bulk_recorder.producer.api.job_status import job_status

CREATED = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
PUBLISHED = datetime(2026, 12, 1, 4, 1, tzinfo=UTC)


def _row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "0193a3c4-0000-7000-8000-000000000001",
        "accepted": 1000,
        "rejected": 2,
        "published": 0,
        "dead_lettered": 0,
        "created_at": CREATED,
        "last_published_at": None,
        "age_s": 12.5,
        "quiet_s": 12.5,
        "relay_quiet_s": None,
    }
    row.update(overrides)
    return row


def test_unsent_rows_and_their_age_while_publishing() -> None:
    status = job_status(
        _row(published=400, last_published_at=PUBLISHED, quiet_s=0.2),
        recorded=300,
        completed_at=None,
        stall_after_s=60,
    )
    assert status.status == "publishing"
    assert (status.unsent, status.oldest_unsent_age_s) == (600, 12.5)
    assert status.last_published_at == PUBLISHED
    assert status.progress == 0.3


def test_stalled_once_nothing_was_published_for_the_stall_time() -> None:
    never = job_status(_row(quiet_s=60.0), recorded=0, completed_at=None, stall_after_s=60)
    assert (never.status, never.unsent, never.last_published_at) == ("stalled", 1000, None)
    young = job_status(_row(quiet_s=59.9), recorded=0, completed_at=None, stall_after_s=60)
    assert young.status == "publishing"
    # Published once, then nothing for the stall time: stalled too, with the rest unsent.
    stopped = job_status(
        _row(
            published=250,
            last_published_at=PUBLISHED,
            age_s=200.0,
            quiet_s=61.0,
            relay_quiet_s=61.0,
        ),
        recorded=250,
        completed_at=None,
        stall_after_s=60,
    )
    assert (stopped.status, stopped.unsent, stopped.oldest_unsent_age_s) == ("stalled", 750, 200)


def test_parked_rows_are_not_unsent_and_a_job_with_none_left_is_recording() -> None:
    status = job_status(
        _row(published=990, dead_lettered=10, quiet_s=500.0),
        recorded=900,
        completed_at=None,
        stall_after_s=60,
    )
    assert (status.status, status.unsent, status.oldest_unsent_age_s) == ("recording", 0, None)


def test_a_job_waiting_behind_another_that_is_being_published_is_not_stalled() -> None:
    waiting = job_status(
        _row(quiet_s=300.0, relay_quiet_s=0.5), recorded=0, completed_at=None, stall_after_s=60
    )
    assert (waiting.status, waiting.unsent) == ("publishing", 1000)
    nobody = job_status(
        _row(quiet_s=300.0, relay_quiet_s=60.0), recorded=0, completed_at=None, stall_after_s=60
    )
    assert nobody.status == "stalled"


@pytest.mark.parametrize("quiet_s", [0.0, 10_000.0])
def test_completed_whatever_the_quiet_time(quiet_s: float) -> None:
    done = datetime(2026, 12, 1, 4, 2, tzinfo=UTC)
    status = job_status(
        _row(published=1000, quiet_s=quiet_s), recorded=1000, completed_at=done, stall_after_s=1
    )
    assert (status.status, status.unsent, status.progress) == ("completed", 0, 1.0)
