"""The Grafana dashboard is well formed and covers what an operator needs (issue 12, part 4;
issue 29, part 1).

Its queries are run against a live Prometheus by tests/ops/test_prometheus_live.py; this file
checks what Grafana itself relies on: the datasource variable, the namespace and job variables
every query filters by, panel ids and layout, and that every topic has a panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from tests.ops.conftest import GRAFANA_DIR, load_yaml

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
}
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
                assert 'namespace=~"$namespace"' in selector, f"{panel['title']}: {expr}"
                assert 'job=~"$job"' in selector, f"{panel['title']}: {expr}"
            for match in AGGREGATION.finditer(expr):
                labels = expr[match.end() :].split(")", 1)[0]
                mixes = f"{panel['title']}: {match.group(0)!r} mixes namespaces in {expr}"
                assert match.group(2) == "by", mixes
                assert "namespace" in labels, mixes
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
