"""The one supervisor: a long-lived task that ends is named as down, then restarted with a
growing backoff; a task with a natural end (``once``) is restarted only when it failed; nothing
is restarted once the supervisor stops. And a recorder whose supervised task raised answers
``/readyz`` with 503 naming it until it runs again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bulk_recorder.infra.backoff import RESTART, Backoff
from bulk_recorder.infra.supervisor import Supervisor
from consumer.app import Recorder
from consumer.health import HealthServer
from consumer.queue_watch import QueueWatch
from settings import load_settings
from tests.conftest import wait_for

QUICK = Backoff(base_s=0.02, cap_s=0.16)


class Dies:
    """A task body that raises its first ``times`` runs, then runs until cancelled."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.starts: list[float] = []

    async def __call__(self) -> None:
        self.starts.append(asyncio.get_running_loop().time())
        if len(self.starts) <= self.times:
            raise RuntimeError(f"death {len(self.starts)}")
        await asyncio.Event().wait()


def test_the_restart_policy_doubles_from_half_a_second_up_to_thirty() -> None:
    assert [RESTART.ceiling(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


async def test_a_task_that_raises_is_named_down_and_restarted_with_a_growing_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(backoff=QUICK)
    body = Dies(times=3)
    with caplog.at_level(logging.ERROR):
        supervisor.start("watch", body)
        await asyncio.sleep(0)  # the first run raises at once
        await asyncio.sleep(0)
        assert supervisor.down() == ["watch"]
        await wait_for(lambda: len(body.starts) == 4, timeout=10)
    await asyncio.sleep(0)
    assert supervisor.down() == []
    assert supervisor.restarts() == 3
    gaps = [b - a for a, b in zip(body.starts, body.starts[1:], strict=False)]
    for n, gap in enumerate(gaps):  # never sooner than the policy says: 0.02, 0.04, 0.08 s
        assert gap >= QUICK.ceiling(n) * 0.9, gaps
    deaths = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(deaths) == 3
    assert all("watch died (RuntimeError" in line for line in deaths)
    supervisor.close()
    await supervisor.cancel()


async def test_a_cancel_nobody_asked_the_supervisor_for_is_restarted() -> None:
    supervisor = Supervisor(backoff=QUICK)
    body = Dies(times=0)
    supervisor.start("flush-worker-0", body)
    await wait_for(lambda: len(body.starts) == 1)
    victim = supervisor.tasks()[0]
    victim.cancel()
    await asyncio.gather(victim, return_exceptions=True)
    assert supervisor.down() == ["flush-worker-0"]
    await wait_for(lambda: len(body.starts) == 2, timeout=10)
    assert supervisor.restarts("flush-worker-") == 1
    supervisor.close()
    await supervisor.cancel()


async def test_a_task_with_a_natural_end_is_restarted_only_when_it_failed() -> None:
    supervisor = Supervisor(backoff=QUICK)
    runs: list[int] = []

    async def pause() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("the pause failed")

    supervisor.start("intake-pause", pause, once=True)
    await wait_for(lambda: len(runs) == 2, timeout=10)
    await asyncio.sleep(0)
    assert not supervisor.running("intake-pause")
    assert supervisor.down() == []
    await asyncio.sleep(QUICK.cap_s * 2)
    assert len(runs) == 2  # its normal end was not taken for a death


async def test_nothing_is_restarted_once_stop_is_set(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop, backoff=QUICK)
    runs: list[int] = []

    async def loop() -> None:
        runs.append(1)
        await stop.wait()

    with caplog.at_level(logging.ERROR):
        supervisor.start("broker-loop", loop)
        await wait_for(lambda: len(runs) == 1)
        stop.set()
        await asyncio.gather(*supervisor.tasks())
        await asyncio.sleep(QUICK.cap_s * 2)
    assert len(runs) == 1
    assert caplog.records == []  # ending on stop is no death


async def test_a_recorder_task_that_raises_makes_readyz_503_naming_it_until_it_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker nor database here (both refuse at once): the queue watch is the task that
    dies, once; /readyz names it while it is down, and no longer once it was restarted."""
    real_run = QueueWatch.run
    deaths: list[int] = []

    async def dies_once(self: QueueWatch, stop: asyncio.Event) -> None:
        if not deaths:
            deaths.append(1)
            raise RuntimeError("a bug in the queue watch")
        await real_run(self, stop)

    monkeypatch.setattr(QueueWatch, "run", dies_once)
    settings = load_settings(
        database_url="postgresql://postgres@127.0.0.1:1/nowhere",
        rabbitmq_url="amqp://guest:guest@127.0.0.1:1/",
        metrics_port=0,  # no server of its own: this test serves its readiness on a free port
    )
    recorder = Recorder(settings)
    health = HealthServer(recorder.metrics.registry, recorder.ready, "127.0.0.1", 0)
    await health.start()
    port = health.port
    stop = asyncio.Event()
    run = asyncio.create_task(recorder.run(stop))
    try:
        await wait_for(lambda: bool(deaths))

        async def readyz() -> tuple[str, str]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = (await reader.read()).decode()
            writer.close()
            head, _, body = answer.partition("\r\n\r\n")
            return head.splitlines()[0], body

        status, body = await readyz()
        assert "503" in status
        assert "queue-watch down" in body, body
        await wait_for(lambda: "queue-watch" not in recorder.ready()[1], timeout=10)
        status, body = await readyz()
        assert "503" in status  # still: the broker and the database are away
        assert "queue-watch" not in body, body
        assert body.startswith("broker down, database down")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await health.stop()
