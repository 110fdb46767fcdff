"""The Grafana dashboard is well formed and covers what an operator needs (issue 12, part 4).

Its queries are run against a live Prometheus by tests/ops/test_prometheus_live.py; this file
checks what Grafana itself relies on: the provisioned datasource, panel ids and layout, and
that every topic of the issue has a panel.
"""

from __future__ import annotations

import json
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
}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def test_every_panel_queries_the_provisioned_prometheus() -> None:
    (source,) = load_yaml(DATASOURCES)["datasources"]
    assert source["type"] == "prometheus"
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{panel['title']}: refIds {ref_ids}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
            assert target["expr"].strip(), f"{panel['title']}: empty query"


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
