"""The dashboard and the alert rules, proven on a real Prometheus scraping real processes.

``bulk-recorder consume``, ``relay`` and ``api`` run through the CLI on free ports with this
test's database and queues; Debian's ``prometheus`` scrapes them every second with the scrape
jobs of ``deploy/prometheus/prometheus.yml`` (only their targets are replaced) and loads
``deploy/prometheus/alerts.yml``. A short load goes through both doors: ``bulk-recorder
publish`` (with invalid messages, so the dead-letter counters have series) and the API (a
transaction and a job, so the outbox and the API histograms have series). One real fault: the
queue is unbound for a moment, so the broker returns the relay's publish and the publish
failure counters have a series too.

Then every panel query of the dashboard and every alert expression Prometheus loaded is run
through ``/api/v1/query``: each must parse and evaluate. A panel query must return series. An
alert expression is normally empty on a healthy pipeline, so ``ALERT_PROBES`` names, for each
alert, the parts of its expression that must return series; each part must appear in the
expression as written (so a probe cannot drift from its alert), and the few parts that
cannot have series in a healthy minute are listed with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import Broker, free_port, settings_env, wait_for
from tests.integration.producer_support import bearer, provision_key
from tests.ops.conftest import ALERTS, GRAFANA_DIR, PROMETHEUS_CONFIG, alert_rules, load_yaml

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.timeout(180),
]

# The venv's console script: the same command an operator runs.
CLI = str(Path(sys.executable).with_name("bulk-recorder"))
DASHBOARD = GRAFANA_DIR / "dashboards" / "bulk-recorder.json"
# Grafana's $__rate_interval, for this test: the whole run fits in one minute of samples.
RATE_WINDOW = "1m"
# The dashboard's variables as Grafana fills them: the compose stack's namespace (what
# prometheus.yml labels its targets with, kept by this test's config) and every role chosen
# (a multi-value variable is written as a regex alternation). A panel that filtered on another
# label, or none, would draw nothing and fail here.
VARIABLES = {"$namespace": "compose", "$job": "(recorder|relay|api)"}

# This service's label, as prometheus.yml's relabelling gives every target.
S = 'service="bulk-recorder"'
# For each alert: parts of its expression (as written in alerts.yml, whitespace aside) that must
# return series on the live pipeline. That proves the metric names, the job labels and the
# label matchers the alert relies on. The alert itself is empty while the pipeline is healthy.
ALERT_PROBES: dict[str, list[str]] = {
    # absent(x) is empty exactly when x has series, and `x == 0` is empty while x is 1.
    "BulkRecorderDown": [f'up{{{S}, job="recorder"}}'],
    # absent(...) is empty while anything is scraped; the per-namespace count and sum have series.
    "BulkRecorderAbsent": [
        f"count by (cluster, namespace) (up{{{S}}})",
        f'sum by (cluster, namespace) (up{{{S}, job="recorder"}}) > 0',
    ],
    "OutboxRelayDown": [f'up{{{S}, job="relay"}}'],
    "OutboxRelayAbsent": [
        f"count by (cluster, namespace) (up{{{S}}})",
        f'sum by (cluster, namespace) (up{{{S}, job="relay"}}) > 0',
    ],
    "IngestApiDown": [f'up{{{S}, job="api"}}'],
    "IngestApiAbsent": [
        f"count by (cluster, namespace) (up{{{S}}})",
        f'sum by (cluster, namespace) (up{{{S}, job="api"}}) > 0',
    ],
    "RecorderPaused": [f'bulk_recorder_paused{{{S}, job="recorder"}}'],
    "RecorderDbRetriesClimbing": [
        "sum by (cluster, namespace, job, instance) "
        f'(rate(bulk_recorder_db_retries_total{{{S}, job="recorder"}}[5m]))'
    ],
    # Every reason is exported at 0 from the start: each has a series.
    "DeadLettersArriving": [
        "sum by (cluster, namespace, job, reason) "
        f'(rate(bulk_recorder_messages_dead_lettered_total{{{S}, job="recorder"}}[5m]))',
    ],
    # The live gauge; the +Inf bucket and the 1200 s one (written "1200.0"): both must match.
    "DeliveryHeldNearConsumerTimeout": [
        f'max_over_time(bulk_recorder_oldest_held_seconds{{{S}, job="recorder"}}[5m])',
        "increase(bulk_recorder_delivery_hold_seconds_bucket"
        f'{{{S}, job="recorder", le="+Inf"}}[15m])',
        "increase(bulk_recorder_delivery_hold_seconds_bucket"
        f'{{{S}, job="recorder", le=~"1200(\\\\.0)?"}}[15m])',
    ],
    "RecorderCommitSlow": [
        "histogram_quantile(0.99, sum by (cluster, namespace, job, instance, le) "
        f'(rate(bulk_recorder_flush_duration_seconds_bucket{{{S}, job="recorder"}}[5m])))'
    ],
    "OutboxStalled": [
        f'max by (cluster, namespace) (bulk_recorder_outbox_backlog{{{S}, job=~"relay|api"}})',
        "sum by (cluster, namespace) "
        f'(increase(bulk_recorder_outbox_published_total{{{S}, job="relay"}}[10m]))',
    ],
    "OutboxOldestTooOld": [
        "max by (cluster, namespace) "
        f'(bulk_recorder_outbox_oldest_age_seconds{{{S}, job=~"relay|api"}})'
    ],
    # Every reason is exported at 0 from the start; the test also makes the broker return a
    # publish (the queue unbound), so unroutable moves.
    "OutboxPublishFailing": [
        "sum by (cluster, namespace, job, reason) "
        f'(rate(bulk_recorder_outbox_publish_failures_total{{{S}, job="relay"}}[5m]))'
    ],
    "OutboxRowsParked": [f'increase(bulk_recorder_outbox_parked_total{{{S}, job="relay"}}[15m])'],
    "PipelineNotConsuming": [
        "sum by (cluster, namespace) "
        f'(rate(bulk_recorder_outbox_published_total{{{S}, job="relay"}}[5m]))',
        "sum by (cluster, namespace) "
        f'(rate(bulk_recorder_messages_received_total{{{S}, job="recorder"}}[5m]))',
    ],
    "QueueWithoutConsumers": [
        f'max by (cluster, namespace) (bulk_recorder_queue_messages{{{S}, job="recorder"}})',
        f'max by (cluster, namespace) (bulk_recorder_queue_consumers{{{S}, job="recorder"}})',
    ],
    # The shard gauges exist only with RABBITMQ_QUEUE_SHARDS > 1, which this test's broker (no
    # rabbitmq_random_exchange plugin) cannot run: its expression must parse and evaluate, and
    # the promtool cases of alerts.test.yml prove it on three shards.
    "QueueShardBacklogGrowing": [],
    "QueueNotConsumed": [
        "min by (cluster, namespace) "
        f'(time() - bulk_recorder_last_delivery_timestamp_seconds{{{S}, job="recorder"}})',
        f'max by (cluster, namespace) (bulk_recorder_queue_messages{{{S}, job="recorder"}})',
    ],
    "NothingArriving": [
        f'max by (cluster, namespace) (bulk_recorder_outbox_backlog{{{S}, job=~"relay|api"}})',
        f'max by (cluster, namespace) (bulk_recorder_queue_messages{{{S}, job="recorder"}})',
        "max by (cluster, namespace) "
        f'(bulk_recorder_outbox_last_publish_timestamp_seconds{{{S}, job="relay"}})',
    ],
    # The numerator differs only by status=~"5..": a healthy API answers no 5xx.
    "IngestApiErrors": [
        "sum by (cluster, namespace, job) "
        f'(rate(bulk_recorder_api_requests_total{{{S}, job="api", route=~"/v1/.*"}}[5m]))'
    ],
}


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@dataclass
class Stack:
    """The processes of one run, their logs, and the Prometheus that scrapes them."""

    log_dir: Path
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    prometheus_port: int = 0

    def logs(self, lines: int = 25) -> str:
        out = []
        for name in self.procs:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
            out.append(f"--- {name} (last {lines} lines) ---\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    async def until(self, what: str, predicate: Any, timeout: float = 45) -> None:
        try:
            await wait_for(predicate, timeout=timeout, interval=0.25)
        except AssertionError as exc:
            died = {n: p.returncode for n, p in self.procs.items() if p.returncode is not None}
            raise AssertionError(f"{what}: {exc}; exited: {died}\n{self.logs()}") from None


async def _start(stack: Stack, name: str, argv: list[str], env: dict[str, str]) -> None:
    with (stack.log_dir / f"{name}.log").open("wb") as log_file:
        stack.procs[name] = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=log_file, stderr=log_file
        )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def running_stack(log_dir: Path) -> AsyncIterator[Stack]:
    stack = Stack(log_dir)
    try:
        yield stack
    finally:
        await asyncio.gather(*(_stop(p) for p in stack.procs.values()))


def prometheus_config(ports: dict[str, int], scrape_interval: str = "1s") -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its jobs pointed at local ports, 1 s scrapes; its
    relabelling (the namespace label) kept."""
    config: dict[str, Any] = load_yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == set(ports), (
        f"prometheus.yml scrapes {sorted(jobs)}, this test runs {sorted(ports)}"
    )
    config["global"] = {
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
        "evaluation_interval": scrape_interval,
    }
    config["rule_files"] = [str(PROMETHEUS_CONFIG.parent / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs")]:
            del job[key]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    return config


def panel_queries() -> list[tuple[str, str]]:
    """(panel title and refId, query with $__rate_interval and the dashboard's variables filled
    in) for every panel target."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']} [{target['refId']}]", _fill(target["expr"])))
    return out


def _fill(expr: str) -> str:
    """A dashboard query with $__rate_interval and the variables as Grafana fills them."""
    expr = expr.replace("$__rate_interval", RATE_WINDOW)
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a variable this test cannot fill: {expr}"
    return expr


def _transaction() -> dict[str, Any]:
    debit, credit = str(uuid.uuid4()), str(uuid.uuid4())
    return {
        "id": str(uuid.uuid4()),
        "organization_id": str(uuid.uuid4()),
        "ledger_id": str(uuid.uuid4()),
        "status": "APPROVED",
        "asset_code": "BRL",
        "amount": "10.00",
        "created_at": "2026-11-29T12:00:00Z",
        "operations": [
            {
                "id": str(uuid.uuid4()),
                "account_id": debit,
                "type": "DEBIT",
                "amount": "10.00",
                "asset_code": "BRL",
            },
            {
                "id": str(uuid.uuid4()),
                "account_id": credit,
                "type": "CREDIT",
                "amount": "10.00",
                "asset_code": "BRL",
            },
        ],
    }


def _job_lines(valid: int) -> bytes:
    lines = [
        json.dumps(
            {
                "id": str(uuid.uuid4()),
                "document": "529.982.247-25",
                "kind": "RESTRICTION",
                "creditor": "ops test",
                "amount": "12.50",
                "occurred_on": "2026-11-20",
            }
        )
        for _ in range(valid)
    ]
    lines.append(json.dumps({"id": "not-a-uuid", "document": "123"}))  # rejected by the API
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True)
class LoadedRule:
    query: str
    health: str  # unknown (not evaluated yet), ok or err
    error: str


class Prometheus:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def query(self, expr: str) -> tuple[bool, list[dict[str, Any]], str]:
        """(ok, result, error): ok is False when Prometheus refuses or fails the query."""
        response = await self.client.get("/api/v1/query", params={"query": expr})
        body = response.json()
        if body.get("status") != "success":
            return False, [], f"{body.get('errorType')}: {body.get('error')}"
        result = body["data"]["result"]
        return True, result if isinstance(result, list) else [result], ""

    async def has_series(self, expr: str) -> bool:
        ok, result, _ = await self.query(expr)
        return ok and bool(result)

    async def rules(self) -> dict[str, LoadedRule]:
        """The alerting rules Prometheus loaded, by name."""
        response = await self.client.get("/api/v1/rules", params={"type": "alert"})
        groups = response.json()["data"]["groups"]
        return {
            rule["name"]: LoadedRule(rule["query"], rule["health"], rule.get("lastError", ""))
            for group in groups
            for rule in group["rules"]
        }

    async def value(self, expr: str) -> float:
        ok, result, error = await self.query(expr)
        assert ok, f"{expr}: {error}"
        return float(result[0]["value"][1]) if result else math.nan


@pytest.mark.exclusive(reason="scrapes every second and waits 15 s for series")
async def test_every_panel_query_and_alert_expression_returns_series_on_a_live_prometheus(
    make_settings, broker: Broker, tmp_path: Path, prometheus_binary: str
) -> None:
    started = time.monotonic()
    ports = {"recorder": free_port(), "relay": free_port(), "api": free_port()}
    prometheus_port = free_port()
    settings = make_settings()
    env = settings_env(settings, METRICS_HOST="127.0.0.1", API_HOST="127.0.0.1")
    await _run(CLI, "migrate", env=env)
    key = await provision_key(settings.database_url, "prometheus-test")
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(prometheus_config(ports)))
    async with (
        running_stack(tmp_path) as stack,
        httpx.AsyncClient(timeout=10, headers=bearer(key)) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{prometheus_port}", timeout=10) as client,
    ):
        prom = Prometheus(client)
        await _start(
            stack,
            "prometheus",
            [
                prometheus_binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            dict(os.environ),
        )
        await _start_services(stack, http, env, ports)
        # Prometheus applies discovered targets every 5 s: wait until it scrapes all three.
        await stack.until(
            "Prometheus scraping recorder, relay and api",
            lambda: _equals(prom, f"sum(up{{{S}}})", 3),
        )
        await _load(stack, prom, http, env, f"http://127.0.0.1:{ports['api']}", broker)
        queries = await _check_panels(stack, prom)
        alerts = await _check_alerts(stack, prom)
        await _check_tune(stack, prom, prometheus_port, ports["recorder"], env)
    elapsed = time.monotonic() - started
    print(f"live Prometheus: {queries} panel queries, {alerts} alerts, {elapsed:.1f} s")


async def _check_tune(
    stack: Stack, prom: Prometheus, prometheus_port: int, recorder_port: int, env: dict[str, str]
) -> None:
    """``bulk-recorder tune`` reads the same figures through Prometheus's query API as from the
    recorder's own /metrics: the bucket bounds and attempts exactly, the count of settles up to
    the extrapolation of ``increase``.

    That extrapolation is bounded, not guessed: once Prometheus's last sample holds every settle
    the recorder reports, ``increase`` over series that start at 0 (the recorder exports every
    outcome from its start, before the load) extends the last sample to the query's time by at
    most 1.1 average scrape intervals (Prometheus's rule), so it reads between the count and
    the count times ``1 + 1.1 / (samples - 1)``. This whole test lasts about 12 s, so that is
    10-20% here (seen: 642 settles read as 716-800), and nothing over a real window."""
    metrics_url = f"http://127.0.0.1:{recorder_port}/metrics"
    held_by_prometheus = 'sum(bulk_recorder_delivery_hold_seconds_count{job="recorder"})'

    async def caught_up() -> bool:
        settled = (await _tune_json(env, metrics_url))["measured"]["settled"]
        return await _equals(prom, held_by_prometheus, settled)

    await stack.until("Prometheus holding every settle the recorder reports", caught_up)
    direct = await _tune_json(env, metrics_url)
    # read before tune's own query: a sample more by then makes the true bound tighter still
    samples = await prom.value(
        'min(count_over_time(bulk_recorder_delivery_hold_seconds_count{job="recorder"}[1h]))'
    )
    via = await _tune_json(
        env, "--prometheus", f"http://127.0.0.1:{prometheus_port}", "--window", "1h"
    )
    assert direct["measured"]["recorded"] >= 612, direct
    for key in ("worst_hold_seconds_at_most", "attempts_needed", "dead_lettered_attempt_at_most"):
        assert via["measured"][key] == direct["measured"][key], (key, via, direct)
    settled, through = direct["measured"]["settled"], via["measured"]["settled"]
    assert settled - 1e-6 <= through <= settled * (1 + 1.1 / (samples - 1)) + 1e-6, (
        samples,
        via,
        direct,
    )
    assert via["in_force"] == direct["in_force"], (via, direct)
    assert via["recommended"] == direct["recommended"], (via, direct)


async def _tune_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        CLI, "tune", "--json", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"tune {args}: {err.decode()}"
    report: dict[str, Any] = json.loads(out)
    return report


async def _run(*argv: str, env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"{argv[1:]}: {out.decode()}"


async def _start_services(
    stack: Stack, http: httpx.AsyncClient, env: dict[str, str], ports: dict[str, int]
) -> None:
    """recorder, relay and api through the CLI, each on its own port; wait until ready."""
    recorder_env = {**env, "METRICS_PORT": str(ports["recorder"])}
    await _start(stack, "recorder", [CLI, "consume"], recorder_env)
    relay_env = {**env, "METRICS_PORT": str(ports["relay"])}
    await _start(stack, "relay", [CLI, "relay", "--poll-interval", "0.2"], relay_env)
    api_env = {**env, "METRICS_PORT": "0", "API_PORT": str(ports["api"])}
    await _start(stack, "api", [CLI, "api"], api_env)

    async def ready(port: int) -> bool:
        with contextlib.suppress(httpx.TransportError):
            return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        return False

    for name, port in ports.items():
        await stack.until(f"{name} ready on port {port}", lambda port=port: ready(port))


async def _load(
    stack: Stack,
    prom: Prometheus,
    http: httpx.AsyncClient,
    env: dict[str, str],
    api: str,
    broker: Broker,
) -> None:
    """Through the queue (with invalid messages) and the API; one publish the broker returns."""
    await _run(
        CLI, "publish", "--type", "mixed", "--count", "600", "--invalid", "0.05", "--quiet",
        "--seed", "12", env=env,
    )  # fmt: skip
    accepted = await http.post(f"{api}/v1/transactions", json=_transaction())
    assert accepted.status_code == 202, accepted.text
    job = await http.post(
        f"{api}/v1/credit-annotation-jobs",
        content=_job_lines(10),
        headers={"content-type": "application/x-ndjson"},
    )
    assert job.status_code == 202, job.text
    assert job.json()["rejected"] == 1, job.text
    published = 'sum(bulk_recorder_outbox_published_total{job="relay"})'
    await stack.until(
        "the relay publishes the API's 11 rows", lambda: _at_least(prom, published, 11)
    )
    # A real failed publish: with no queue bound, the broker returns the relay's mandatory
    # publish (an outage: the relay declares the topology again, which binds the queue).
    queue = await broker.channel.declare_queue(broker.topology.queue, passive=True)
    await queue.unbind(broker.topology.exchange, "#")
    try:
        returned = await http.post(f"{api}/v1/transactions", json=_transaction())
        assert returned.status_code == 202, returned.text
        await stack.until(
            "Prometheus sees the relay's returned publish",
            lambda: prom.has_series(
                'bulk_recorder_outbox_publish_failures_total{job="relay", reason="unroutable"}'
            ),
        )
    finally:
        await queue.bind(broker.topology.exchange, "#")
    await stack.until(
        "the relay publishes the returned row once the queue is bound again",
        lambda: _at_least(prom, published, 12),
    )
    await stack.until(
        "the recorder acks every valid message (600 published, 12 through the API)",
        lambda: _at_least(prom, 'sum(bulk_recorder_messages_acked_total{job="recorder"})', 612),
    )


async def _check_panels(stack: Stack, prom: Prometheus) -> int:
    """Every panel query parses and returns series."""
    queries = panel_queries()
    assert len(queries) >= 20, f"the dashboard has only {len(queries)} queries"
    for title, expr in queries:
        ok, _, error = await prom.query(expr)
        assert ok, f"panel {title}: Prometheus refuses {expr}: {error}"
        await stack.until(
            f"panel {title}: no series for {expr}", lambda e=expr: prom.has_series(e), timeout=15
        )
    # The alert annotations: they parse (a healthy pipeline fires nothing to draw).
    for annotation in json.loads(DASHBOARD.read_text())["annotations"]["list"]:
        expr = _fill(annotation["expr"])
        ok, _, error = await prom.query(expr)
        assert ok, f"annotation {annotation['name']}: Prometheus refuses {expr}: {error}"
    return len(queries)


async def _check_alerts(stack: Stack, prom: Prometheus) -> int:
    """Prometheus loaded every alert of alerts.yml; each parses, evaluates, and its probes
    return series; none fires on this healthy pipeline."""
    expected = {str(rule["alert"]): _squash(str(rule["expr"])) for rule in alert_rules()}
    assert set(ALERT_PROBES) == set(expected), (
        f"alerts without probes: {sorted(set(expected) - set(ALERT_PROBES))}; "
        f"probes without alerts: {sorted(set(ALERT_PROBES) - set(expected))}"
    )
    loaded = await prom.rules()
    assert set(loaded) == set(expected), f"Prometheus loaded {sorted(loaded)}"
    for name, probes in ALERT_PROBES.items():
        ok, _, error = await prom.query(loaded[name].query)
        assert ok, f"alert {name}: Prometheus refuses {loaded[name].query}: {error}"
        for probe in probes:
            assert _squash(probe) in expected[name], f"{name}: probe not in its alert: {probe}"
            await stack.until(
                f"alert {name}: no series for {probe}",
                lambda p=probe: prom.has_series(p),
                timeout=15,
            )

    async def evaluated() -> bool:
        return all(rule.health != "unknown" for rule in (await prom.rules()).values())

    await stack.until("every alert rule evaluated", evaluated, timeout=15)
    failed = {n: r.error for n, r in (await prom.rules()).items() if r.health != "ok"}
    assert not failed, f"alert rules failing to evaluate: {failed}"
    _, firing, _ = await prom.query('ALERTS{alertstate="firing"}')
    assert firing == [], f"alerts firing on a healthy pipeline: {firing}"
    return len(expected)


async def _equals(prom: Prometheus, expr: str, expected: float) -> bool:
    return await prom.value(expr) == expected


async def _at_least(prom: Prometheus, expr: str, minimum: float) -> bool:
    return await prom.value(expr) >= minimum


# Not exclusive (it was, by the module's mark): it only builds the live test's config from the
# files in deploy/, scraping and timing nothing.
@pytest.mark.private
def test_prometheus_config_for_the_live_test_keeps_every_job_and_the_rules() -> None:
    """The live test's config differs from deploy/ only by targets and intervals."""
    config = prometheus_config({"recorder": 1, "relay": 2, "api": 3})
    assert [job["job_name"] for job in config["scrape_configs"]] == ["recorder", "relay", "api"]
    assert config["rule_files"] == [str(ALERTS)]
    for job in config["scrape_configs"]:
        assert set(job) == {"job_name", "static_configs", "relabel_configs"}, job
        assert {"target_label": "namespace", "replacement": VARIABLES["$namespace"]} in (
            job["relabel_configs"]
        ), job
        # The label the rules, the dashboard and tune select this service by.
        assert {"target_label": "service", "replacement": "bulk-recorder"} in (
            job["relabel_configs"]
        ), job
