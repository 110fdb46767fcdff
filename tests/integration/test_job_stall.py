"""A stalled pipeline is visible in the job status (issue 12 item 2), with real processes.

Seen by an operator: the relay was not running, a 300,000-line job was answered 202, and its
status said "publishing" for ever. Here ``bulk-recorder api``, ``consume`` and ``relay`` run
through the CLI; the relay is stopped (SIGTERM) in the middle of a job. The job status then shows
the rows still unsent and the age of the oldest, growing, and says ``stalled`` once nothing was
published for API_JOB_STALL_AFTER_S. Meanwhile the recorder's metrics show an empty queue with
a consumer attached while the API reports the outbox backlog: "nothing is arriving", not
"nothing is consuming". A relay started again publishes the rest and the job completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumer.tools.generator import Generator
from tests.conftest import SettingsFactory, free_port, settings_env, wait_for
from tests.integration.producer_support import bearer, ndjson, provision_key

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

CLI = str(Path(sys.executable).with_name("bulk-recorder"))
LINES = 6_000
STALL_AFTER_S = 3.0


class Procs:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as log_file:
            self.procs[name] = await asyncio.create_subprocess_exec(
                CLI, *argv, env=env, stdout=log_file, stderr=log_file
            )

    async def stop(self, name: str) -> int:
        proc = self.procs[name]
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 40)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        return int(proc.returncode or 0)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.log_dir.glob("*.log"))
        )


@contextlib.asynccontextmanager
async def processes(log_dir: Path) -> AsyncIterator[Procs]:
    procs = Procs(log_dir)
    try:
        yield procs
    finally:
        await asyncio.gather(*(procs.stop(name) for name in list(procs.procs)))


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_relay_stopped_mid_job_shows_unsent_rows_their_age_then_stalled_then_completes(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = make_settings(api_job_stall_after_s=STALL_AFTER_S)
    api_port, recorder_port, relay_port = free_port(), free_port(), free_port()
    env = settings_env(settings, API_HOST="127.0.0.1", METRICS_HOST="127.0.0.1")
    api = f"http://127.0.0.1:{api_port}"
    relay_argv = ["relay", "--batch-size", "20", "--lanes", "1", "--poll-interval", "0.2"]
    relay_env = {**env, "METRICS_PORT": str(relay_port)}
    gen = Generator.create(1212)
    body = ndjson([gen.credit_annotation() for _ in range(LINES)])
    async with processes(tmp_path) as procs, httpx.AsyncClient(timeout=30) as http:

        async def ready(url: str) -> bool:
            with contextlib.suppress(httpx.TransportError):
                return (await http.get(url)).status_code == 200
            return False

        await procs.start("api", ["api"], {**env, "API_PORT": str(api_port), "METRICS_PORT": "0"})
        await wait_for(lambda: ready(f"{api}/readyz"), timeout=60)  # the API migrates
        http.headers.update(bearer(await provision_key(env["DATABASE_URL"])))
        await procs.start("recorder", ["consume"], {**env, "METRICS_PORT": str(recorder_port)})
        await procs.start("relay", relay_argv, relay_env)
        await wait_for(lambda: ready(f"http://127.0.0.1:{recorder_port}/readyz"), timeout=60)
        await wait_for(lambda: ready(f"http://127.0.0.1:{relay_port}/readyz"), timeout=60)

        posted = await http.post(
            f"{api}/v1/credit-annotation-jobs",
            content=body,
            headers={"content-type": "application/x-ndjson"},
        )
        assert posted.status_code == 202, posted.text
        url = api + posted.json()["status_url"]
        status: dict[str, Any] = {}

        async def status_where(check: Any) -> bool:
            nonlocal status
            status = (await http.get(url)).json()
            return bool(check(status))

        # The relay is stopped once it has published part of the job.
        await wait_for(lambda: status_where(lambda s: s["published"] > 0), timeout=30)
        assert await procs.stop("relay") == 0, procs.logs()
        first = (await http.get(url)).json()
        assert 0 < first["published"] < LINES, f"not stopped mid-job: {first}"
        assert first["unsent"] == LINES - first["published"], first
        assert first["oldest_unsent_age_s"] > 0, first
        assert first["last_published_at"] is not None, first
        assert first["status"] in ("publishing", "stalled"), first

        await wait_for(lambda: status_where(lambda s: s["status"] == "stalled"), timeout=30)
        assert status["unsent"] == first["unsent"], (first, status)
        assert status["oldest_unsent_age_s"] > first["oldest_unsent_age_s"], (first, status)

        # Nothing is arriving (the API sees the backlog; the recorder an empty queue with a
        # consumer, and no delivery since it drained what was published): not a consumer fault.
        async def arriving_stopped() -> bool:
            ours = (await http.get(f"http://127.0.0.1:{recorder_port}/metrics")).text
            return (
                _sample(ours, "bulk_recorder_queue_messages") == 0
                and _sample(ours, "bulk_recorder_queue_consumers") >= 1
            )

        await wait_for(arriving_stopped, timeout=30)
        api_metrics = (await http.get(f"{api}/metrics")).text
        assert _sample(api_metrics, "bulk_recorder_outbox_backlog") == first["unsent"]

        await procs.start("relay-again", relay_argv, relay_env)
        await wait_for(lambda: status_where(lambda s: s["status"] == "completed"), timeout=90)
    assert (status["unsent"], status["recorded"], status["progress"]) == (0, LINES, 1.0), status
    assert status["oldest_unsent_age_s"] is None, status


TRANSACTION_ROWS = 10_000
BUSY_STALL_AFTER_S = 2.0


async def test_a_job_behind_transaction_rows_reads_publishing_while_the_relay_batches_them(
    make_settings, database_url, db, broker
) -> None:
    """Issue 18 item 5: stall means "the relay published nothing recently", whatever the row.

    A relay slowed to batches of 5 on one lane drains 10,000 transaction rows that were queued
    before a job; the job's own rows wait their turn. Past API_JOB_STALL_AFTER_S, with the
    relay still publishing the transaction rows, the job must read ``publishing``: it used to
    read ``stalled``, the relay's activity being taken from jobs' last publish only.
    """
    from bulk_recorder.infra.migrate import migrate
    from bulk_recorder.producer.outbox import copy_to_outbox, notify
    from bulk_recorder.producer.relay import RelayConfig
    from tests.integration.producer_support import api_client, running_relay

    settings = make_settings(api_job_stall_after_s=BUSY_STALL_AFTER_S)
    await migrate(database_url)
    conn = await db()
    gen = Generator.create(1805)
    rows = []
    for _ in range(TRANSACTION_ROWS):
        record = gen.transaction()
        rows.append(("transaction", record["id"], None, json.dumps(record).encode()))
    async with conn.transaction():
        await copy_to_outbox(conn, rows)
        await notify(conn)
    lines = [gen.credit_annotation() for _ in range(10)]
    config = RelayConfig(batch_size=5, lanes=1, poll_interval_s=0.2)
    async with api_client(settings) as (client, _):
        posted = await client.post(
            "/v1/credit-annotation-jobs",
            content=ndjson(lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert posted.status_code == 202, posted.text
        url = posted.json()["status_url"]
        async with running_relay(settings, config) as relay:
            seen: list[str] = []

            async def past_the_stall_time() -> bool:
                status = (await client.get(url)).json()
                assert status["published"] == 0, (
                    "the relay reached the job's rows before the stall time: not shown"
                )
                seen.append(status["status"])
                return bool(status["oldest_unsent_age_s"] >= 1.5 * BUSY_STALL_AFTER_S)

            await wait_for(past_the_stall_time, timeout=60, interval=0.2)
            assert 0 < relay.published < TRANSACTION_ROWS, relay.published  # still draining
            assert seen[-1] == "publishing", seen
            assert "stalled" not in seen, seen
