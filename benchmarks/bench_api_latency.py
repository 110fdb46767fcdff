"""The producer side under load: how long a big job takes to accept and to record, and whether
the API keeps answering meanwhile.

    python -m benchmarks.bench_api_latency                  # quick: a 30,000-annotation job
    python -m benchmarks.bench_api_latency --count 300000   # the main job

Three real processes on a fresh database and unique queue names, as deployed:
``bulk-recorder api`` (uvicorn, uvloop), ``bulk-recorder relay`` and ``python -m consumer``.
The job is generated first (NDJSON, ``consumer.tools.loadgen``), then:

1. idle: probes for ``--idle-seconds``: one ``POST /v1/transactions`` (async: request row +
   outbox row in one DB transaction) then one ``GET /v1/credit-annotation-jobs/{id}`` of a
   small finished job, every ``--probe-interval-ms``, one request at a time on a keep-alive
   connection; latencies from the probe's side;
2. the run: the job is POSTed, streamed in 64 KiB chunks, while the same probes go on; phase
   ``accepting`` lasts until the job's 202, phase ``flowing`` until the job's status says
   ``completed`` (every line recorded), the GET probes now reading the big job's progress.

Printed: time to accept (the 202) and its rate, end-to-end time from the first byte sent to the
last row recorded, the relay's publish rate, the outbox's peak backlog, API latency p50/p99/max
per phase and probe, the peak RSS of the API process (the body is streamed, never held
whole) and CPU seconds per process. The database is checked to hold exactly the job's rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmarks.support.env import rabbitmq_url, use_uvloop
from benchmarks.support.machine import cpu_seconds, facts_table, machine_facts, rss_mib
from benchmarks.support.recorder import free_port
from benchmarks.support.services import temp_database, temp_topology
from benchmarks.support.stats import emit, progress, save_json, table
from bulk_recorder.producer.key_store import create_key
from consumer.tools.generator import Generator
from consumer.topology import Topology

CHUNK = 65_536
JOBS = "/v1/credit-annotation-jobs"


@dataclass
class Probes:
    """Latencies in ms per (phase, probe)."""

    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    errors: int = 0

    def add(self, phase: str, probe: str, ms: float) -> None:
        self.samples.setdefault((phase, probe), []).append(ms)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class Service:
    """One ``bulk-recorder`` subprocess."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self._log = log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=self._log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self._log.close()
        return self.proc.returncode


def service_env(dsn: str, topology: Topology, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RABBITMQ_", "BULK_RECORDER_", "DATABASE_", "API_", "METRICS_"))
    }
    env.update(
        DATABASE_URL=dsn,
        RABBITMQ_URL=rabbitmq_url(),
        RABBITMQ_EXCHANGE=topology.exchange,
        RABBITMQ_QUEUE=topology.queue,
        RABBITMQ_TRANSACTION_ASYNC="true",
        LOG_LEVEL="WARNING",
        METRICS_PORT="0",
    )
    env.update(extra)
    return env


def make_job(count: int, seed: int) -> bytes:
    gen = Generator.create(seed)
    lines = []
    for _ in range(count):
        record = gen.credit_annotation()
        del record["job_id"]  # the API gives every line the job's id
        lines.append(json.dumps(record, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


async def chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), CHUNK):
        yield body[start : start + CHUNK]


async def wait_ready(client: httpx.AsyncClient, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(url)).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready within {timeout} s")


async def probe_loop(
    client: httpx.AsyncClient,
    probes: Probes,
    phase: list[str],
    job_url: list[str],
    interval_s: float,
    stop: asyncio.Event,
    gen: Generator,
) -> None:
    """POST a transaction, GET a job status, repeat; one request in flight at a time."""
    while not stop.is_set():
        started = time.perf_counter()
        current = phase[0]
        response = await client.post("/v1/transactions", json=gen.transaction())
        probes.add(current, "POST /v1/transactions", (time.perf_counter() - started) * 1000)
        probes.errors += response.status_code != 202
        t1 = time.perf_counter()
        response = await client.get(job_url[0])
        probes.add(current, "GET job status", (time.perf_counter() - t1) * 1000)
        probes.errors += response.status_code != 200
        pause = interval_s - (time.perf_counter() - started)
        if pause > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    progress(f"generating a {args.count:,}-line NDJSON job")
    body = make_job(args.count, args.seed)
    progress(f"job body: {len(body) / 1_048_576:.1f} MiB")
    results: dict[str, Any] = {"count": args.count, "body_mib": len(body) / 1_048_576}
    logs = Path(args.logs)
    async with temp_database("bench_api") as (dsn, _name), temp_topology("bench_api") as topo:
        api_port = free_port()
        env = service_env(dsn, topo)
        # The lever for the API's p99 on shared cores: the relay and the recorder at a lower
        # CPU priority (nice execs the role, so the pid read for CPU is the role's own).
        nice = ["nice", "-n", str(args.nice_background)] if args.nice_background else []
        services = [
            Service(
                "api",
                [sys.executable, "-m", "consumer.cli", "api"],
                dict(env, API_PORT=str(api_port)),
                logs / "api.log",
            ),
            Service(
                "relay",
                [
                    *nice,
                    sys.executable,
                    "-m",
                    "consumer.cli",
                    "relay",
                    "--batch-size",
                    str(args.relay_batch),
                    "--lanes",
                    str(args.relay_lanes),
                ],
                env,
                logs / "relay.log",
            ),
            Service(
                "recorder",
                [*nice, sys.executable, "-m", "consumer"],
                dict(env, BULK_RECORDER_SIZE=str(args.recorder_size)),
                logs / "recorder.log",
            ),
        ]
        try:
            results.update(await measure(args, body, api_port, dsn, services))
        finally:
            for service in services:
                code = await service.stop()
                results[f"exit_{service.name}"] = code
        conn = await asyncpg.connect(dsn)
        try:
            results["rows_recorded"] = int(
                await conn.fetchval(
                    "SELECT count(*) FROM credit_annotations WHERE job_id = $1",
                    results["job"]["id"],
                )
            )
        finally:
            await conn.close()
    return results


async def measure(
    args: argparse.Namespace, body: bytes, port: int, dsn: str, services: list[Service]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    api = services[0]
    gen = Generator.create(args.seed + 1)
    limits = httpx.Limits(max_connections=4)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits) as probe,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as loader,
    ):
        await wait_ready(probe, "/readyz")
        key_conn = await asyncpg.connect(dsn)  # the API has migrated: a key for this run
        try:
            _, key = await create_key(key_conn, "bench")
        finally:
            await key_conn.close()
        for client in (probe, loader):
            client.headers["Authorization"] = f"Bearer {key}"
        progress("services up; warming up with a 100-line job")
        warm = await loader.post(
            JOBS,
            content=make_job(100, args.seed + 2),
            headers={"content-type": "application/x-ndjson"},
        )
        warm.raise_for_status()
        warm_url = warm.json()["status_url"]
        await wait_until_completed(loader, warm_url, timeout=120)

        probes = Probes()
        phase = ["idle"]
        job_url = [warm_url]
        stop = asyncio.Event()
        interval = args.probe_interval_ms / 1000
        progress(f"idle probes for {args.idle_seconds} s")
        task = asyncio.create_task(probe_loop(probe, probes, phase, job_url, interval, stop, gen))
        await asyncio.sleep(args.idle_seconds)

        cpu0 = {s.name: cpu_seconds(s.pid) for s in services}
        rss_peak = rss_mib(api.pid)
        rss_before = rss_peak
        progress(f"POSTing the {args.count:,}-line job")
        phase[0] = "accepting"
        t0 = time.perf_counter()
        post = asyncio.create_task(
            loader.post(
                JOBS,
                content=chunks(body),
                headers={"content-type": "application/x-ndjson", "Idempotency-Key": "bench"},
            )
        )
        while not post.done():
            rss_peak = max(rss_peak, rss_mib(api.pid))
            await asyncio.sleep(0.05)
        response = post.result()
        accept_s = time.perf_counter() - t0
        response.raise_for_status()
        job = response.json()
        if job["accepted"] != args.count:
            raise RuntimeError(f"accepted {job['accepted']} of {args.count}: {job['rejections']}")
        progress(f"accepted in {accept_s:.2f} s; waiting for every row to be recorded")
        phase[0] = "flowing"
        job_url[0] = job["status_url"]
        backlog_peak = 0
        drained_s = float("nan")
        timeline: list[tuple[float, int, int]] = []  # (s since t0, outbox rows, recorded)
        conn = await asyncpg.connect(dsn)
        try:
            while True:
                status = (await loader.get(job["status_url"])).json()
                backlog = int(await conn.fetchval("SELECT count(*) FROM outbox"))
                now = time.perf_counter() - t0
                timeline.append((round(now, 2), backlog, status["recorded"]))
                backlog_peak = max(backlog_peak, backlog)
                if status["published"] >= args.count and drained_s != drained_s:
                    drained_s = now
                if status["status"] == "completed":
                    break
                if time.perf_counter() - t0 > args.timeout:
                    raise RuntimeError(f"not completed within {args.timeout} s: {status}")
                await asyncio.sleep(0.25)
        finally:
            await conn.close()
        e2e_s = time.perf_counter() - t0
        stop.set()
        await task
        cpu = {s.name: cpu_seconds(s.pid) - cpu0[s.name] for s in services}
    out.update(
        accept_s=accept_s,
        e2e_s=e2e_s,
        drained_s=drained_s,
        timeline=timeline,
        backlog_peak=backlog_peak,
        rss_before_mib=rss_before,
        rss_peak_mib=rss_peak,
        cpu_s=cpu,
        probe_errors=probes.errors,
        job=status,
        latencies={
            f"{ph}|{name}": {
                "n": len(v),
                "p50": quantile(v, 0.5),
                "p99": quantile(v, 0.99),
                "max": max(v),
                "mean": statistics.fmean(v),
            }
            for (ph, name), v in probes.samples.items()
        },
    )
    return out


async def wait_until_completed(client: httpx.AsyncClient, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await client.get(url)).json()["status"] == "completed":
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not complete in {timeout} s")


def report(results: dict[str, Any], facts: dict[str, str], args: argparse.Namespace) -> None:
    emit("machine", facts_table(facts))
    n = results["count"]
    emit(
        f"bench_api_latency: one {n:,}-annotation NDJSON job "
        f"({results['body_mib']:.1f} MiB) through api -> outbox -> relay -> queue -> recorder",
        table(
            ["figure", "value"],
            [
                ("time to accept (202)", f"{results['accept_s']:.2f} s"),
                ("accept rate", f"{n / results['accept_s']:,.0f} lines/s"),
                ("end to end (first byte sent -> last row recorded)", f"{results['e2e_s']:.2f} s"),
                ("end-to-end rate", f"{n / results['e2e_s']:,.0f} rows/s"),
                ("job fully published (relay) after", f"{results['drained_s']:.2f} s"),
                ("outbox peak backlog (sampled)", f"{results['backlog_peak']:,}"),
                (
                    "API RSS before / peak while accepting",
                    f"{results['rss_before_mib']:.0f} / {results['rss_peak_mib']:.0f} MiB",
                ),
                *(
                    (f"CPU s during the run: {name}", f"{sec:.1f}")
                    for name, sec in results["cpu_s"].items()
                ),
                ("rows recorded / accepted", f"{results['rows_recorded']:,} / {n:,}"),
                ("probe errors (non-2xx)", str(results["probe_errors"])),
            ],
        ),
    )
    rows = []
    for phase in ("idle", "accepting", "flowing"):
        for probe in ("POST /v1/transactions", "GET job status"):
            stats = results["latencies"].get(f"{phase}|{probe}")
            if stats is None:
                continue
            rows.append(
                (
                    phase,
                    probe,
                    stats["n"],
                    f"{stats['p50']:.1f}",
                    f"{stats['p99']:.1f}",
                    f"{stats['max']:.1f}",
                )
            )
    emit(
        f"API latency, ms (one probe pair every {args.probe_interval_ms} ms, one at a time)",
        table(["phase", "probe", "n", "p50", "p99", "max"], rows),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30_000, help="lines in the job")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--probe-interval-ms", type=float, default=20.0)
    parser.add_argument("--relay-batch", type=int, default=500)
    parser.add_argument("--relay-lanes", type=int, default=2)
    parser.add_argument("--recorder-size", type=int, default=1000, help="BULK_RECORDER_SIZE")
    parser.add_argument(
        "--nice-background",
        type=int,
        default=0,
        help="run the relay and the recorder under nice -n N (0: as the API)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--logs", default="/tmp/bench_api_latency", help="service logs folder")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    use_uvloop()

    async def go() -> tuple[dict[str, Any], dict[str, str]]:
        facts = await machine_facts()
        return await run(args), facts

    results, facts = asyncio.run(go())
    report(results, facts, args)
    save_json(args.json, results)
    if results["rows_recorded"] != args.count:
        sys.exit(f"FAILED: {results['rows_recorded']} rows recorded, expected {args.count}")


if __name__ == "__main__":
    main()
