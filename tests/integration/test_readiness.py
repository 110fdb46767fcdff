"""A recorder's `/readyz` says what is wrong, and only what is wrong now.

With the broker and the database up, a supervised task that is down (the queue watch) makes it
503 and is named; a consumer the broker cancelled (its queue deleted and declared again) is no
longer mentioned once the recorder consumes again. Against the real broker and database; the
task's death is the only thing made up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from consumer.health import HealthServer
from consumer.queue_watch import QueueWatch
from tests.conftest import Broker, RunningRecorder, SettingsFactory, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

Start = Callable[..., Awaitable[RunningRecorder]]


async def _readyz(port: int) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
    answer = (await reader.read()).decode()
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition("\r\n\r\n")
    return int(head.split()[1]), body.strip()


@pytest.fixture
async def served() -> AsyncIterator[Callable[[RunningRecorder], Awaitable[int]]]:
    """Serve a running recorder's readiness on a free port, as its own server does."""
    servers: list[HealthServer] = []

    async def serve(running: RunningRecorder) -> int:
        server = HealthServer(running.metrics.registry, running.recorder.ready, "127.0.0.1", 0)
        await server.start()
        servers.append(server)
        return server.port

    yield serve
    for server in servers:
        await server.stop()


async def test_readyz_is_503_and_names_a_supervised_task_that_is_down_while_the_services_are_up(
    make_settings: SettingsFactory,
    start_recorder: Start,
    served: Callable[[RunningRecorder], Awaitable[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_run = QueueWatch.run
    die = asyncio.Event()
    deaths: list[float] = []

    async def dies_twice_when_told(self: QueueWatch, stop: asyncio.Event) -> None:
        """The real watch until told; then this run and the next one raise; then real again."""
        if len(deaths) >= 2:
            return await real_run(self, stop)
        if not die.is_set():
            runs = asyncio.ensure_future(real_run(self, stop))
            told = asyncio.ensure_future(die.wait())
            await asyncio.wait({runs, told}, return_when=asyncio.FIRST_COMPLETED)
            if runs.done():
                told.cancel()
                return runs.result()
            runs.cancel()
            await asyncio.gather(runs, return_exceptions=True)
        deaths.append(asyncio.get_running_loop().time())
        raise RuntimeError("a bug in the queue watch")

    monkeypatch.setattr(QueueWatch, "run", dies_twice_when_told)
    running = await start_recorder(make_settings(bulk_recorder_size=5))
    port = await served(running)
    assert await _readyz(port) == (200, "broker up, database up")

    die.set()
    answers: list[tuple[int, str]] = []

    async def named() -> bool:
        answers.append(await _readyz(port))
        return "queue-watch down" in answers[-1][1]

    await wait_for(named, timeout=10, interval=0.02)
    status, body = answers[-1]
    assert body.startswith("broker up, database up"), body  # only the task is down
    assert status == 503, f"/readyz {status} {body}"
    # restarted (after 0.5 s, then 1 s): ready again, the task no longer named
    await wait_for(lambda: len(deaths) == 2, timeout=10)

    async def ready_again() -> bool:
        return await _readyz(port) == (200, "broker up, database up")

    await wait_for(ready_again, timeout=15)


async def test_readyz_drops_the_cancelled_consumer_once_it_consumes_again(
    make_settings: SettingsFactory,
    start_recorder: Start,
    served: Callable[[RunningRecorder], Awaitable[int]],
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The queue is deleted under the recorder: the broker cancels its consumer; the recorder
    declares the queue again and consumes. Its /readyz is 200 and says nothing of the cancel."""
    running = await start_recorder(make_settings(bulk_recorder_size=5))
    port = await served(running)
    reconnects = running.value("bulk_recorder_broker_reconnects_total")

    await broker.channel.queue_delete(broker.topology.queue)

    def consuming_again() -> bool:
        return running.value("bulk_recorder_broker_reconnects_total") > reconnects

    await wait_for(consuming_again, timeout=30)
    assert "the broker cancelled our consumer" in caplog.text  # the cancel did happen
    answers: list[tuple[int, str]] = []

    async def ready() -> bool:
        answers.append(await _readyz(port))
        return answers[-1][0] == 200

    await wait_for(ready, timeout=30)
    status, body = answers[-1]
    assert body == "broker up, database up", f"/readyz {status} {body}"
