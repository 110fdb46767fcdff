"""What a real role serves on /metrics besides its own figures (issue 29, part 2): the
process, platform and GC collectors, ``bulk_recorder_build_info``, no ``*_created`` series, the
known reasons of the two labelled failure counters exported at 0 from the start, and
prometheus_client's own exposition (OpenMetrics when asked for, gzip when accepted).

The recorder serves /metrics from its small asyncio server (METRICS_PORT), the API from a
route (API_PORT): both are scraped, as Prometheus scrapes them."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import platform
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import bulk_recorder
from bulk_recorder.build import revision
from bulk_recorder.infra.metrics import DEAD_LETTER_REASONS, PUBLISH_FAILURE_REASONS
from tests.conftest import REPO, SettingsFactory, free_port, settings_env, wait_for
from tests.integration.producer_support import running_api

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.timeout(90)]

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
STANDARD = ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds")


@contextlib.asynccontextmanager
async def _recorder(make_settings: SettingsFactory, log: Path) -> AsyncIterator[str]:
    """``bulk-recorder consume`` on a free METRICS_PORT, ready; its base URL."""
    port = free_port()
    env = settings_env(make_settings(), METRICS_HOST="127.0.0.1", METRICS_PORT=str(port))
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer.cli", "consume", cwd=REPO, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as client:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await client.get("/readyz")).status_code == 200
                return False

            await wait_for(ready, timeout=30)
        yield url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)


@pytest.fixture(params=["recorder", "api"])
async def scraped(
    request: pytest.FixtureRequest, make_settings: SettingsFactory, tmp_path: Path
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A running role (its name) and a client on the port that serves its /metrics."""
    role: str = request.param
    async with contextlib.AsyncExitStack() as stack:
        log = tmp_path / f"{role}.log"
        if role == "recorder":
            url = await stack.enter_async_context(_recorder(make_settings, log))
        else:
            settings = make_settings(api_port=free_port())
            await stack.enter_async_context(running_api(settings, log))
            url = f"http://127.0.0.1:{settings.api_port}"
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=10))
        yield role, client


async def test_a_running_role_serves_the_standard_collectors_build_info_and_no_created_series(
    scraped: tuple[str, httpx.AsyncClient],
) -> None:
    role, client = scraped
    response = await client.get("/metrics", headers={"accept-encoding": "identity"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    for name in STANDARD:
        assert name in names, f"{role}: no {name}"
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert any(n == "python_gc_collections_total" for n in names), f"{role}: no GC collector"
    build = (
        "bulk_recorder_build_info",
        (
            ("python", platform.python_version()),
            ("revision", revision()),
            ("role", role),
            ("version", bulk_recorder.__version__),
        ),
    )
    assert samples.get(build) == 1, f"{role}: {[k for k in samples if 'build' in k[0]]}"
    assert ("python_info", ()) not in samples  # python_info has its labels
    assert any(n == "python_info" for n in names), f"{role}: no platform collector"
    created = sorted(line for line in text.splitlines() if "_created" in line)
    assert created == [], f"{role}: {len(created)} *_created lines, e.g. {created[:3]}"
    for family, reasons in (
        ("bulk_recorder_messages_dead_lettered_total", DEAD_LETTER_REASONS),
        ("bulk_recorder_outbox_publish_failures_total", PUBLISH_FAILURE_REASONS),
    ):
        for reason in reasons:
            assert samples.get((family, (("reason", reason),))) == 0, f"{family} {reason}"


async def test_a_running_role_negotiates_openmetrics_and_gzip_as_prometheus_asks(
    scraped: tuple[str, httpx.AsyncClient],
) -> None:
    _, client = scraped
    # the Accept header Prometheus sends
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    response = await client.get(
        "/metrics", headers={"accept": accept, "accept-encoding": "identity"}
    )
    assert response.headers["content-type"].startswith(OPENMETRICS), response.headers
    assert response.text.endswith("# EOF\n")
    assert "_created" not in response.text
    # raw bytes: httpx would decompress them and hide whether they came compressed
    async with client.stream("GET", "/metrics", headers={"accept-encoding": "gzip"}) as raw:
        body = b"".join([chunk async for chunk in raw.aiter_raw()])
        assert raw.headers.get("content-encoding") == "gzip", raw.headers
    assert b"bulk_recorder_build_info" in gzip.decompress(body)
