"""The recorder's and the relay's /metrics server reads the scraper's header fields by name in
any case: Prometheus sends ``Accept`` and ``Accept-Encoding`` capitalized, curl and httpx may
send them in lower case, a proxy in upper case; each gets OpenMetrics and gzip alike."""

from __future__ import annotations

import asyncio
import gzip

import pytest

from bulk_recorder.infra.metrics import Metrics
from consumer.health import HealthServer

PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


async def _scrape(port: int, fields: dict[str, str]) -> tuple[dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
    answer = await reader.read()  # the server closes after its answer
    writer.close()
    await writer.wait_closed()
    raw_head, _, body = answer.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")[1:]
    headers = {name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines)}
    return headers, body


@pytest.mark.parametrize(
    ("accept", "accept_encoding"),
    [
        ("Accept", "Accept-Encoding"),  # as Prometheus sends them
        ("accept", "accept-encoding"),
        ("ACCEPT", "ACCEPT-ENCODING"),
    ],
)
async def test_a_scrape_gets_openmetrics_and_gzip_whatever_the_case_of_its_header_names(
    accept: str, accept_encoding: str
) -> None:
    server = HealthServer(Metrics(role="consume").registry, lambda: (True, "ready"), port=0)
    await server.start()
    try:
        headers, body = await _scrape(
            server.port, {accept: PROMETHEUS_ACCEPT, accept_encoding: "gzip"}
        )
    finally:
        await server.stop()
    assert headers["content-type"].startswith("application/openmetrics-text"), headers
    assert headers.get("content-encoding") == "gzip", headers
    assert int(headers["content-length"]) == len(body)
    assert gzip.decompress(body).endswith(b"# EOF\n")
