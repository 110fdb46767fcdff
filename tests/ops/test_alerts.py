"""The alert rules pass their promtool unit tests, and every alert is written for an operator.

``deploy/prometheus/alerts.test.yml`` holds the cases (series in, alerts and their rendered
annotations out); promtool's own output is the failure message.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.ops.conftest import (
    ALERTS,
    ALERTS_TESTS,
    PROMETHEUS_CONFIG,
    REPO,
    alert_rules,
    load_yaml,
    run_tool,
)
from tests.unit.test_docs_links import anchors

SEVERITIES = {"critical", "warning"}


def test_alert_rules_pass_promtool_check_and_unit_tests(promtool: str) -> None:
    checked = run_tool(promtool, "check", "rules", str(ALERTS))
    if not checked.ok:
        pytest.fail(checked.output, pytrace=False)
    tested = run_tool(promtool, "test", "rules", str(ALERTS_TESTS))
    if not tested.ok:
        pytest.fail(tested.output, pytrace=False)
    assert "SUCCESS" in tested.output, tested.output


def test_prometheus_config_is_valid_and_loads_the_rule_file(promtool: str) -> None:
    checked = run_tool(promtool, "check", "config", str(PROMETHEUS_CONFIG))
    if not checked.ok:
        pytest.fail(checked.output, pytrace=False)
    assert f"{len(alert_rules())} rules found" in checked.output, checked.output


def test_a_broken_rule_fails_its_promtool_test(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: raise RecorderPaused's threshold and promtool says so."""
    text = ALERTS.read_text()
    broken = text.replace(
        'bulk_recorder_paused{job="recorder"} == 1', 'bulk_recorder_paused{job="recorder"} == 2'
    )
    assert broken != text, "RecorderPaused's expression changed: update this test"
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(ALERTS_TESTS, tmp_path / "alerts.test.yml")
    tested = run_tool(promtool, "test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert not tested.ok, tested.output
    assert "alertname: RecorderPaused" in tested.output, tested.output


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_alert_says_how_long_how_bad_and_what_to_look_at(rule: dict[str, object]) -> None:
    assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{rule['alert']}: no for:"
    labels = rule.get("labels")
    assert isinstance(labels, dict), f"{rule['alert']}: no labels"
    assert labels.get("severity") in SEVERITIES, f"{rule['alert']}: severity {labels}"
    annotations = rule.get("annotations")
    assert isinstance(annotations, dict), f"{rule['alert']}: no annotations"
    assert len(str(annotations.get("summary", ""))) > 10, f"{rule['alert']}: no summary"
    assert len(str(annotations.get("description", ""))) > 100, f"{rule['alert']}: thin description"


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    suite = load_yaml(ALERTS_TESTS)
    assert suite["rule_files"] == [ALERTS.name]
    fired = {
        case["alertname"]
        for test in suite["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    names = [str(rule["alert"]) for rule in alert_rules()]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    missing = sorted(set(names) - fired)
    assert not missing, f"alerts never seen firing in {ALERTS_TESTS.name}: {missing}"
    unknown = sorted(fired - set(names))
    assert not unknown, f"{ALERTS_TESTS.name} tests alerts that do not exist: {unknown}"


# Issue 29: the alerts the issue found mixing environments, each proven on two namespaces.
CROSS_ENVIRONMENT = (
    "OutboxStalled",
    "OutboxOldestTooOld",
    "PipelineNotConsuming",
    "QueueWithoutConsumers",
    "QueueNotConsumed",
    "NothingArriving",
    "BulkRecorderAbsent",
    "DeadLettersArriving",
)
AGGREGATION = re.compile(
    r"\b(sum|max|min|count|avg|group|stddev|topk|bottomk|quantile)\s*(by|without)?\s*\("
)
MATCHING = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_aggregation_keeps_the_environment_apart(rule: dict[str, object]) -> None:
    """No bare max()/sum()/on(): one Prometheus scraping dev and production (job="recorder" in
    both) must not let one environment fire, or hide, the other's alert."""
    expr = str(rule["expr"])
    for match in AGGREGATION.finditer(expr):
        assert match.group(2) == "by", f"{rule['alert']}: {match.group(0)!r} in {expr}"
        labels = expr[match.end() :].split(")", 1)[0]
        assert "namespace" in labels.replace(" ", "").split(","), f"{rule['alert']}: by ({labels})"
    for match in MATCHING.finditer(expr):
        if match.group(1) == "on":
            assert "namespace" in match.group(2), f"{rule['alert']}: {match.group(0)} in {expr}"


@pytest.mark.parametrize("alert", CROSS_ENVIRONMENT)
def test_the_cross_environment_alerts_fire_for_the_broken_namespace_alone(alert: str) -> None:
    """A promtool case with two namespaces where the alert fires, and only for one of them."""
    suite = load_yaml(ALERTS_TESTS)
    proven = []
    for test in suite["tests"]:
        namespaces = set(re.findall(r'namespace="([^"]+)"', str(test["input_series"])))
        for case in test.get("alert_rule_test", []):
            fired = {a["exp_labels"].get("namespace") for a in case.get("exp_alerts") or []}
            if case["alertname"] == alert and len(namespaces) >= 2 and len(fired) == 1:
                assert fired < namespaces, (test["name"], fired)
                proven.append(test["name"])
    assert proven, f"{alert}: no promtool case with two namespaces where it fires for one"


def test_every_runbook_url_leads_to_a_section_of_the_operations_guide() -> None:
    runbooks = REPO / "docs" / "operations.md"
    headings = anchors(runbooks)
    for rule in alert_rules():
        url = str(rule["annotations"].get("runbook_url", ""))
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", f"{rule['alert']}: runbook_url {url!r}"
        assert anchor in headings, f"{rule['alert']}: no heading #{anchor} in {runbooks.name}"
