"""The intake pause of a long database outage, without a broker: what it does to the intake, the
probe that ends it, and that a pause which raises is restarted rather than leaving intake paused
for ever. tests/faults/test_db_outage.py proves the same pause against real services."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.recorder.flusher import Pending
from consumer.intake import TASK, IntakePause
from tests.conftest import wait_for

QUICK = Backoff(base_s=0.01, cap_s=0.02)


class FakeIntake:
    """The recorder's side: counts what the pause asks; the probe fails ``down`` times."""

    def __init__(self, *, down: int = 0, stop_fails: int = 0) -> None:
        self.down = down
        self.stop_fails = stop_fails
        self.calls: list[str] = []
        self.held = [cast(Pending, object()) for _ in range(3)]
        self.released: list[Pending] = []
        self.probes = 0

    async def stop_consuming(self) -> None:
        self.calls.append("stop")
        if self.stop_fails:
            self.stop_fails -= 1
            raise RuntimeError("a bug while cancelling the consumer")

    async def start_consuming(self) -> None:
        self.calls.append("start")

    def take_held(self) -> list[Pending]:
        held, self.held = self.held, []
        return held

    async def release(self, held: list[Pending]) -> None:
        self.released.extend(held)

    async def probe(self) -> None:
        self.probes += 1
        if self.probes <= self.down:
            raise OSError("the database is still away")

    def recovered(self) -> None:
        self.calls.append("recovered")


def make(intake: FakeIntake, restart: Backoff = QUICK) -> tuple[IntakePause, Supervisor]:
    supervisor = Supervisor(backoff=restart)
    return IntakePause(intake, supervisor, backoff=QUICK), supervisor


async def test_a_pause_releases_what_is_held_and_resumes_once_a_probe_write_succeeds() -> None:
    intake = FakeIntake(down=3)
    pause, supervisor = make(intake)
    pause.pause()
    await asyncio.sleep(0)
    assert pause.paused
    await wait_for(lambda: "start" in intake.calls, timeout=10)
    assert not pause.paused
    assert intake.probes == 4  # three failed probes, then the one that passed
    assert len(intake.released) == 3
    assert intake.calls == ["stop", "recovered", "start"]
    assert not supervisor.running(TASK)


async def test_a_second_pause_while_one_runs_starts_nothing() -> None:
    intake = FakeIntake(down=1_000_000)
    pause, supervisor = make(intake)
    pause.pause()
    await wait_for(lambda: intake.probes > 0)
    pause.pause()
    assert len(supervisor.tasks(TASK)) == 1
    assert intake.calls == ["stop"]
    pause.close()  # a shutdown ends the probe loop
    await wait_for(lambda: not supervisor.running(TASK), timeout=10)
    supervisor.close()


async def test_a_pause_that_raises_is_restarted_and_never_leaves_intake_paused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    intake = FakeIntake(stop_fails=1)
    pause, supervisor = make(intake, restart=Backoff(base_s=0.3, cap_s=0.3))
    with caplog.at_level(logging.ERROR):
        pause.pause()
        await wait_for(lambda: supervisor.down() == [TASK])  # named down meanwhile
        assert pause.paused
        await wait_for(lambda: not pause.paused, timeout=10)
    assert intake.calls == ["stop", "stop", "recovered", "start"]
    assert supervisor.restarts(TASK) == 1
    assert supervisor.down() == []
    assert any("intake-pause died" in r.getMessage() for r in caplog.records)


async def test_no_pause_starts_after_a_shutdown_began() -> None:
    intake = FakeIntake()
    pause, supervisor = make(intake)
    pause.close()
    pause.pause()
    await asyncio.sleep(0)
    assert supervisor.tasks() == []
    assert intake.calls == []


def test_the_recorder_is_the_intake_the_pause_works_through() -> None:
    from consumer.app import Recorder

    for name in ("stop_consuming", "start_consuming", "take_held", "release", "probe"):
        assert callable(getattr(Recorder, name, None)), name
    assert callable(cast(Any, Recorder).recovered)
