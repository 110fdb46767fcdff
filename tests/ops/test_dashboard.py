"""The Grafana dashboard is well formed and covers what an operator needs (issue 12, part 4;
issue 29, part 1; issue 39, part 4), queue shards included.

Its queries are run against a live Prometheus by tests/ops/test_prometheus_live.py; this file
checks what Grafana itself relies on: the datasource variable, the namespace and job variables
every query filters by, this service's label on every selector, panel ids and layout, one unit
per axis, the alert annotations and the runbooks link, and that every topic has a panel. The
queue shards' panel is evaluated by promtool on three shards and on one queue (the live test's
broker runs one queue only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.ops.conftest import GRAFANA_DIR, load_yaml, run_tool
from tests.ops.gen_rules import RUNBOOK_BASE

DASHBOARD = GRAFANA_DIR / "dashboards" / "bulk-recorder.json"
DATASOURCES = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"

# Issue 12, part 4: each topic and the metric whose panel shows it.
TOPICS = {
    "throughput": "bulk_recorder_messages_acked_total",
    "flush sizes": "bulk_recorder_flush_size_bucket",
    "flush reasons": "bulk_recorder_flushes_total",
    "commit latency": "bulk_recorder_flush_duration_seconds_bucket",
    "DLQ by reason": "bulk_recorder_messages_dead_lettered_total",
    "outbox backlog": "bulk_recorder_outbox_backlog",
    "outbox age": "bulk_recorder_outbox_oldest_age_seconds",
    "API latency": "bulk_recorder_api_request_duration_seconds_bucket",
    "pauses": "bulk_recorder_paused",
    # issue 29: measured but not shown before
    "delivery holds": "bulk_recorder_delivery_hold_seconds_bucket",
    "delivery attempts": "bulk_recorder_delivery_attempt_bucket",
    "oldest held": "bulk_recorder_oldest_held_seconds",
    "batches split": "bulk_recorder_fallback_total",
    "rows offered": "bulk_recorder_rows_attempted_total",
    "API auth failures": "bulk_recorder_api_auth_failures_total",
    "delivery limit": "bulk_recorder_delivery_limit",
    "release time": "bulk_recorder_release_after_seconds",
    "DLQ depth": "bulk_recorder_dlq_messages",
    "process memory": "process_resident_memory_bytes",
    # issue 39
    "process CPU": "process_cpu_seconds_total",
    "API event-loop lag": "bulk_recorder_api_event_loop_lag_seconds_bucket",
    "API pool wait": "bulk_recorder_api_db_acquire_seconds_bucket",
    "running versions": "bulk_recorder_build_info",
    # queue shards (RABBITMQ_QUEUE_SHARDS)
    "each shard's depth": "bulk_recorder_shard_messages",
    "each shard's consumers": "bulk_recorder_shard_consumers",
}
SHARD_PANEL = "Queue shards: ready messages and consumers"
# The label the PodMonitor and prometheus.yml give this service's targets: another
# application's job="api" in the same Prometheus is not drawn here.
SERVICE_MATCHER = 'service="bulk-recorder"'
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = re.compile(r"\{([^{}]*)\}")
AGGREGATION = re.compile(r"\b(sum|max|min|count|avg)\s*(by|without)?\s*\(")


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _datasources(node: Any) -> Iterator[dict[str, Any]]:
    """Every ``datasource`` object anywhere in the dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                yield value
            yield from _datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasources(item)


def _variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _dashboard()["templating"]["list"]}


def test_the_datasource_namespace_and_job_are_variables() -> None:
    """An import into another Grafana picks its own Prometheus; dev and production are told
    apart by namespace, and the roles by job."""
    (source,) = load_yaml(DATASOURCES)["datasources"]
    assert source["type"] == "prometheus"  # what the $datasource variable lists
    variables = _variables()
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job"):
        variable = variables[name]
        assert variable["type"] == "query", name
        assert variable["datasource"] == DATASOURCE, name
        assert variable["includeAll"], name
        assert variable["multi"], name
        assert f", {name})" in variable["query"]["query"], variable["query"]
        for selector in SELECTOR.findall(variable["query"]["query"]):
            assert SERVICE_MATCHER in selector, variable["query"]
    assert "$namespace" in variables["job"]["query"]["query"]  # the roles of the chosen ones


def test_every_panel_queries_the_datasource_variable_and_no_uid_is_hard_coded() -> None:
    for source in _datasources(_dashboard()):
        assert source == DATASOURCE, source
    for panel in _panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{panel['title']}: refIds {ref_ids}"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), f"{panel['title']}: empty query"


def test_every_query_filters_by_namespace_and_job_and_keeps_namespaces_apart() -> None:
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            selectors = SELECTOR.findall(expr)
            assert selectors, f"{panel['title']}: no selector in {expr}"
            for selector in selectors:
                assert SERVICE_MATCHER in selector, f"{panel['title']}: {expr}"
                assert 'namespace=~"$namespace"' in selector, f"{panel['title']}: {expr}"
                assert 'job=~"$job"' in selector, f"{panel['title']}: {expr}"
            for match in AGGREGATION.finditer(expr):
                labels = expr[match.end() :].split(")", 1)[0].replace(" ", "").split(",")
                mixes = f"{panel['title']}: {match.group(0)!r} mixes environments in {expr}"
                assert match.group(2) == "by", mixes
                assert {"cluster", "namespace"} <= set(labels), mixes
            assert "{{namespace}}" in target.get("legendFormat", ""), panel["title"]


def test_panels_have_unique_ids_titles_descriptions_and_do_not_overlap() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "bulk-recorder"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] < grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert len(panel.get("description", "")) > 20, f"{panel['title']}: no description"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel["title"])
                assert other == panel["title"], f"{panel['title']} overlaps {other}"


def test_every_topic_of_the_issue_has_a_panel() -> None:
    queries = " ".join(t["expr"] for p in _panels() for t in p["targets"])
    missing = [topic for topic, metric in TOPICS.items() if metric not in queries]
    assert not missing, f"no panel for {missing}"


def test_rate_windows_use_grafanas_rate_interval() -> None:
    """A fixed window too short for the scrape interval draws nothing; $__rate_interval adapts."""
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            if "rate(" in expr or "increase(" in expr:
                assert "[$__rate_interval]" in expr, f"{panel['title']}: {expr}"


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))


def test_bytes_and_cpu_cores_are_never_drawn_on_one_axis() -> None:
    """Memory in bytes beside CPU in cores draws the CPU flat at the bottom: each gets a panel
    with its own unit."""
    for panel in _panels():
        exprs = [t["expr"] for t in panel["targets"]]
        has_bytes = any("_bytes" in e for e in exprs)
        has_cpu = any("process_cpu_seconds_total" in e for e in exprs)
        assert not (has_bytes and has_cpu), f"{panel['title']}: bytes and CPU on one axis"
        if has_bytes:
            assert _unit(panel) == "bytes", panel["title"]
            assert all("_bytes" in e for e in exprs), f"{panel['title']}: bytes beside others"
        if has_cpu:
            assert _unit(panel) == "short", panel["title"]
            axis = panel["fieldConfig"]["defaults"]["custom"]["axisLabel"]
            assert "cores" in axis, f"{panel['title']}: CPU axis labelled {axis!r}"


def test_the_running_versions_are_shown_with_their_revision() -> None:
    """Which version and source revision each process runs, e.g. in the middle of a rollout."""
    (panel,) = [
        p for p in _panels() if any("bulk_recorder_build_info" in t["expr"] for t in p["targets"])
    ]
    for target in panel["targets"]:
        for label in ("version", "revision", "job", "instance"):
            assert label in target["expr"], target["expr"]


def test_this_services_alerts_are_annotated_on_every_panel() -> None:
    """A firing alert of this service, in the chosen namespaces, marks the time axis."""
    annotations = _dashboard()["annotations"]["list"]
    (alerts,) = [a for a in annotations if "ALERTS" in a.get("expr", "")]
    assert alerts["datasource"] == DATASOURCE
    assert alerts["enable"], alerts
    (selector,) = SELECTOR.findall(alerts["expr"])
    for matcher in (SERVICE_MATCHER, 'alertstate="firing"', 'namespace=~"$namespace"'):
        assert matcher in selector, alerts["expr"]
    assert "{{alertname}}" in alerts["titleFormat"], alerts


def test_the_dashboard_links_the_runbooks() -> None:
    links = _dashboard()["links"]
    assert any(
        link["url"] == RUNBOOK_BASE and "unbook" in link["title"] and link["targetBlank"]
        for link in links
    ), links


def _series(metric: str, namespace: str, value: float, **labels: str) -> dict[str, str]:
    chosen = {"service": "bulk-recorder", "namespace": namespace, "job": "recorder", **labels}
    text = ", ".join(f'{k}="{v}"' for k, v in chosen.items())
    return {"series": f"{metric}{{{text}}}", "values": f"{value:g}"}


def test_the_shard_panel_draws_each_shard_or_else_the_one_queue(
    promtool: str, tmp_path: Path
) -> None:
    """promtool evaluates the panel's queries: in prod, three shards exported by two recorders
    give one line a shard (its queue label; not the whole-queue sum beside them); in dev, one
    queue (no shard series) gives that queue's line, as the panel above draws it."""
    (panel,) = [p for p in _panels() if p["title"] == SHARD_PANEL]
    shards = {"records": (5, 2), "records.shard-2": (7, 0), "records.shard-3": (9, 3)}
    cases = []
    for target, (shard, whole, index) in zip(
        panel["targets"],
        (
            ("bulk_recorder_shard_messages", "bulk_recorder_queue_messages", 0),
            ("bulk_recorder_shard_consumers", "bulk_recorder_queue_consumers", 1),
        ),
        strict=True,
    ):
        assert shard in target["expr"], target["expr"]
        assert "{{queue}}" in target["legendFormat"], target
        series = [
            _series(shard, "prod", figures[index], instance=instance, queue=queue)
            for queue, figures in shards.items()
            for instance in ("a:9464", "b:9464")
        ]
        series += [
            _series(whole, "prod", (21, 0)[index], instance="a:9464"),
            _series(whole, "dev", (4, 1)[index], instance="c:9464"),
        ]
        expected = [
            {"labels": f'{{namespace="prod", queue="{queue}"}}', "value": figures[index]}
            for queue, figures in shards.items()
        ]
        expected.append({"labels": '{namespace="dev"}', "value": (4, 1)[index]})
        expr = target["expr"].replace("$namespace", ".*").replace("$job", "recorder|relay|api")
        cases.append(
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [{"expr": expr, "eval_time": "0m", "exp_samples": expected}],
            }
        )
    (tmp_path / "panel.test.yml").write_text(yaml.safe_dump({"rule_files": [], "tests": cases}))
    tested = run_tool(promtool, "test", "rules", "panel.test.yml", cwd=tmp_path)
    assert tested.ok, tested.output
