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

``--job-workers 0 2`` runs the job once per value of ``API_JOB_WORKERS`` in each of ``--rounds``
rounds (order rotating), fresh services and database each time, and prints the medians side by
side: 0 validates on the API's event loop, N on N worker processes. ``--baseline DIR`` adds a
variant: the three roles run the code of the tree DIR (an older commit, extracted).

What an API request waits on is read from the API's own /metrics at each phase's start and
end: its event loop's lag (``bulk_recorder_api_event_loop_lag_seconds``), the wait for a pooled
connection (``bulk_recorder_api_db_acquire_seconds``) and the server-side duration of each probe
route (``bulk_recorder_api_request_duration_seconds``), per phase: mean and the bucket bound
that holds the p99.

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
import re
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
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.support.cgroups import CpuLimit
from benchmarks.support.env import rabbitmq_url, use_uvloop
from benchmarks.support.machine import cpu_seconds, facts_table, machine_facts, rss_mib
from benchmarks.support.services import temp_database, temp_topology
from benchmarks.support.stats import emit, progress, save_json, table
from bulk_recorder.producer.key_store import create_key
from consumer.tools.demo_support import free_port
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

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: str | None = None
    ) -> None:
        self.name = name
        self._log = log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=self._log, cwd=cwd)

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


async def run(args: argparse.Namespace, body: bytes, variant: str) -> dict[str, Any]:
    results: dict[str, Any] = {
        "count": args.count,
        "body_mib": len(body) / 1_048_576,
        "workers": variant,
        "load_at_start": os.getloadavg()[0],
    }
    logs = Path(args.logs)
    shards = 1
    if variant.startswith("shards="):  # --shards: every role at RABBITMQ_QUEUE_SHARDS=N
        shards = int(variant.removeprefix("shards="))
        variant = str(args.job_workers[0]) if args.job_workers else "default"
    async with (
        temp_database("bench_api") as (dsn, _name),
        temp_topology("bench_api", shards) as topo,
    ):
        api_port = free_port()
        env = service_env(dsn, topo, RABBITMQ_QUEUE_SHARDS=str(shards))
        cwd = None
        if variant == "baseline":  # every role runs the code of the --baseline tree
            cwd = args.baseline  # made absolute by main()
            env["PYTHONPATH"] = cwd
        # INFO for the API: its one line a job splits the 202 into body and outbox seconds
        api_env = dict(env, API_PORT=str(api_port), LOG_LEVEL="INFO")
        if variant not in ("default", "baseline"):
            api_env["API_JOB_WORKERS"] = variant
        # The lever for the API's p99 on shared cores: the relay and the recorder at a lower
        # CPU priority (nice execs the role, so the pid read for CPU is the role's own).
        nice = ["nice", "-n", str(args.nice_background)] if args.nice_background else []
        # The other lever: a CPU limit on them (a CFS quota, as Kubernetes' limits.cpu sets).
        limit = CpuLimit(args.background_cpus) if args.background_cpus else None
        if limit is not None:
            nice = [*limit.prefix(), *nice]
        services = [
            Service(
                "api",
                [sys.executable, "-m", "consumer.cli", "api"],
                api_env,
                logs / "api.log",
                cwd,
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
                cwd,
            ),
            Service(
                "recorder",
                [*nice, sys.executable, "-m", "consumer"],
                dict(env, BULK_RECORDER_SIZE=str(args.recorder_size)),
                logs / "recorder.log",
                cwd,
            ),
        ]
        try:
            results.update(await measure(args, body, api_port, dsn, services))
        finally:
            for service in services:
                code = await service.stop()
                results[f"exit_{service.name}"] = code
            if limit is not None:
                results["background_cpu_throttled_s"] = limit.close()
        results["accept_split"] = accept_split(logs / "api.log", args.count)
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


def accept_split(log: Path, count: int) -> dict[str, float]:
    """The API's own account of the job's 202: body (read, validate, stage) and outbox (the
    job row and the move of the staged lines, one transaction) seconds."""
    pattern = re.compile(
        rf"accepted: {count} lines accepted, \d+ rejected, in ([\d.]+) s "
        r"\(body ([\d.]+) s, outbox ([\d.]+) s\)"
    )
    for line in log.read_text(errors="replace").splitlines():
        found = pattern.search(line)
        if found:
            total, body, outbox = (float(x) for x in found.groups())
            return {"total_s": total, "body_s": body, "outbox_s": outbox}
    return {}


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
        snapshots = [await scrape(probe)]  # idle starts
        task = asyncio.create_task(probe_loop(probe, probes, phase, job_url, interval, stop, gen))
        await asyncio.sleep(args.idle_seconds)

        cpu0 = {s.name: cpu_seconds(s.pid) for s in services}
        rss_peak = rss_mib(api.pid)
        rss_before = rss_peak
        progress(f"POSTing the {args.count:,}-line job")
        snapshots.append(await scrape(probe))
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
        snapshots.append(await scrape(probe))
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
        snapshots.append(await scrape(probe))
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
        waits={
            ph: phase_waits(before, after)
            for ph, before, after in zip(
                ("idle", "accepting", "flowing"), snapshots, snapshots[1:], strict=False
            )
        },
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


WAITS = {
    "event-loop lag": ("bulk_recorder_api_event_loop_lag_seconds", None),
    "pool acquire": ("bulk_recorder_api_db_acquire_seconds", None),
    "server: POST /v1/transactions": (
        "bulk_recorder_api_request_duration_seconds",
        "/v1/transactions",
    ),
    "server: GET job status": (
        "bulk_recorder_api_request_duration_seconds",
        "/v1/credit-annotation-jobs/{job_id}",
    ),
}
Snapshot = dict[str, dict[float, float]]  # wait -> {bucket bound: cumulative count}, +sum


async def scrape(client: httpx.AsyncClient) -> Snapshot:
    """The API's wait histograms now (cumulative buckets; key -1 holds the sum)."""
    text = (await client.get("/metrics")).text
    out: Snapshot = {name: {} for name in WAITS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, (metric, route) in WAITS.items():
                if route is not None and sample.labels.get("route") != route:
                    continue
                if sample.name == metric + "_bucket":
                    out[name][float(sample.labels["le"])] = sample.value
                elif sample.name == metric + "_sum":
                    out[name][-1.0] = sample.value
    return out


def phase_waits(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """Per wait: count, mean ms and the bucket bound (ms) holding the p99, over a phase."""
    out: dict[str, dict[str, float]] = {}
    for name in WAITS:
        b, a = before.get(name, {}), after.get(name, {})
        bounds = sorted(k for k in a if k >= 0)
        cum = {k: a[k] - b.get(k, 0.0) for k in bounds}
        count = cum[bounds[-1]] if bounds else 0.0
        total = a.get(-1.0, 0.0) - b.get(-1.0, 0.0)
        p99 = next((k for k in bounds if cum[k] >= 0.99 * count), float("inf"))
        out[name] = {
            "n": count,
            "mean_ms": 1000 * total / count if count else float("nan"),
            "p99_le_ms": 1000 * p99,
        }
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
                (
                    "the API's own split of it: body / outbox",
                    " / ".join(
                        f"{results.get('accept_split', {}).get(k, float('nan')):.2f} s"
                        for k in ("body_s", "outbox_s")
                    ),
                ),
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
    parser.add_argument(
        "--background-cpus",
        type=float,
        default=0.0,
        help="a CPU limit shared by the relay and the recorder, in cores (a cgroup CFS quota; "
        "root and cgroup v1's cpu controller; 0: none)",
    )
    parser.add_argument(
        "--job-workers",
        type=int,
        nargs="*",
        default=None,
        help="API_JOB_WORKERS values to run side by side (unset: the API's default)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        nargs="*",
        default=None,
        help="RABBITMQ_QUEUE_SHARDS values to run side by side, with the first --job-workers "
        "value (the broker of RABBITMQ_URL needs rabbitmq_random_exchange past 1)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every variant")
    parser.add_argument(
        "--baseline",
        default=None,
        help="a source tree (e.g. `git archive <ref> | tar -x -C DIR`) whose roles run as one "
        "more variant, side by side",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--logs", default="/tmp/bench_api_latency", help="service logs folder")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    return parser


def report_waits(results: dict[str, Any]) -> None:
    rows = []
    for phase, waits in results.get("waits", {}).items():
        for name, w in waits.items():
            rows.append(
                (phase, name, f"{w['n']:.0f}", f"{w['mean_ms']:.2f}", f"<= {w['p99_le_ms']:g}")
            )
    emit(
        "What an API request waits on, from the API's /metrics (per phase)",
        table(["phase", "wait", "n", "mean ms", "p99 ms (bucket bound)"], rows),
    )


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def summary(runs: list[dict[str, Any]]) -> None:
    """Medians (min-max) per API_JOB_WORKERS value over the rounds, ratios taken per run."""
    rows = []
    for workers in dict.fromkeys(r["workers"] for r in runs):
        mine = [r for r in runs if r["workers"] == workers]

        def lat(r: dict[str, Any], phase: str, probe: str) -> float:
            return float(r["latencies"][f"{phase}|{probe}"]["p99"])

        def wait(r: dict[str, Any], phase: str, name: str, key: str) -> float:
            return float(r["waits"][phase][name][key])

        figures: list[tuple[str, list[float]]] = [
            ("load average (1 min) at start", [r["load_at_start"] for r in mine]),
            ("202 after, s", [r["accept_s"] for r in mine]),
            (
                "of it, API body (read, validate, stage), s",
                [r["accept_split"].get("body_s", float("nan")) for r in mine],
            ),
            (
                "of it, API outbox (job row + INSERT SELECT, commit), s",
                [r["accept_split"].get("outbox_s", float("nan")) for r in mine],
            ),
            ("every row recorded after, s", [r["e2e_s"] for r in mine]),
        ]
        for probe in ("POST /v1/transactions", "GET job status"):
            figures.append((f"{probe} p99 idle, ms", [lat(r, "idle", probe) for r in mine]))
            for phase in ("accepting", "flowing"):
                figures.append((f"{probe} p99 {phase}, ms", [lat(r, phase, probe) for r in mine]))
                figures.append(
                    (
                        f"{probe} p99 {phase} / idle",
                        [lat(r, phase, probe) / lat(r, "idle", probe) for r in mine],
                    )
                )
        for phase in ("idle", "accepting", "flowing"):
            for name in ("event-loop lag", "pool acquire"):
                figures.append(
                    (
                        f"{name} mean ms, {phase}",
                        [wait(r, phase, name, "mean_ms") for r in mine],
                    )
                )
                figures.append(
                    (
                        f"{name} p99 bucket ms, {phase}",
                        [wait(r, phase, name, "p99_le_ms") for r in mine],
                    )
                )
        for label, values in figures:
            rows.append((f"{workers}", label, _med(values)))
    emit(
        "summary: median (min-max) over the rounds, per variant",
        table(["variant", "figure", "median (min-max)"], rows),
    )


def main() -> None:
    args = build_parser().parse_args()
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    use_uvloop()
    variants = [str(n) for n in args.job_workers] if args.job_workers else ["default"]
    if args.shards:
        variants = [f"shards={n}" for n in args.shards]
    if args.baseline:
        args.baseline = str(Path(args.baseline).resolve())
        variants.insert(0, "baseline")

    async def go() -> tuple[list[dict[str, Any]], dict[str, str]]:
        facts = await machine_facts()
        progress(f"generating a {args.count:,}-line NDJSON job")
        body = make_job(args.count, args.seed)
        progress(f"job body: {len(body) / 1_048_576:.1f} MiB")
        runs = []
        for number in range(args.rounds):
            turn = number % len(variants)
            for workers in variants[turn:] + variants[:turn]:
                progress(f"round {number + 1}: {workers}")
                result = await run(args, body, workers)
                result["round"] = number + 1
                runs.append(result)
        return runs, facts

    runs, facts = asyncio.run(go())
    for result in runs:
        emit(f"round {result['round']}, variant {result['workers']}", "")
        report(result, facts, args)
        report_waits(result)
    if len(runs) > 1:
        summary(runs)
    save_json(args.json, runs if len(runs) > 1 else runs[0])
    failed = [r for r in runs if r["rows_recorded"] != args.count]
    if failed:
        sys.exit(f"FAILED: {failed[0]['rows_recorded']} rows recorded, expected {args.count}")


if __name__ == "__main__":
    main()
