"""Reading a recorder process's /metrics and /readyz from outside, as Prometheus would."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families


async def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a GET on 127.0.0.1:port; (0, "") while nothing listens there."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, ""
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    except OSError:
        return 0, ""
    finally:
        writer.close()
    head, _, body = raw.decode(errors="replace").partition("\r\n\r\n")
    parts = head.split(" ")
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), body


async def scrape(port: int) -> dict[str, float]:
    """Every sample of /metrics, keyed like ``name{label="value"}`` (no labels: just the name)."""
    status, text = await http_get(port, "/metrics")
    if status != 200:
        return {}
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
