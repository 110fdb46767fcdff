"""The alert rules pass their promtool unit tests, and every alert is written for an operator.

``deploy/prometheus/alerts.test.yml`` holds the cases (series in, alerts and their rendered
annotations out); promtool's own output is the failure message.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ops.conftest import (
    ALERTS,
    ALERTS_TESTS,
    PROMETHEUS_CONFIG,
    REPO,
    alert_rules,
    load_yaml,
    run_tool,
)
from tests.ops.gen_rules import RUNBOOK_BASE
from tests.unit.test_docs_links import anchors

SEVERITIES = {"critical", "warning"}
DOCKERFILE = REPO / "Dockerfile"
# The label the PodMonitor and prometheus.yml give this service's targets, and every rule.
SERVICE = "bulk-recorder"
SERVICE_MATCHER = f'service="{SERVICE}"'
SELECTOR = re.compile(r"\{([^{}]*)\}")
# What users feel: nothing recorded, accepted work not published, no replica of a role left.
CRITICAL = {
    "BulkRecorderAbsent",
    "OutboxRelayAbsent",
    "IngestApiAbsent",
    "RecorderPaused",
    "OutboxStalled",
    "PipelineNotConsuming",
    "QueueWithoutConsumers",
    "QueueNotConsumed",
}
FOREIGN_CASE = "a foreign application with the same job names fires nothing"
HIDDEN_CASE = "a foreign application's healthy replicas do not hide this service's outage"
HIDDEN_ALERTS = ("BulkRecorderAbsent", "OutboxRelayAbsent", "IngestApiAbsent", "OutboxStalled")


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
    paused = 'bulk_recorder_paused{service="bulk-recorder", job="recorder"}'
    broken = text.replace(f"{paused} == 1", f"{paused} == 2")
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
    "QueueShardBacklogGrowing",
)
AGGREGATION = re.compile(
    r"\b(sum|max|min|count|avg|group|stddev|topk|bottomk|quantile)\s*(by|without)?\s*\("
)
MATCHING = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_aggregation_keeps_the_environment_apart(rule: dict[str, object]) -> None:
    """No bare max()/sum()/on(): one Prometheus scraping dev and production (job="recorder" in
    both) must not let one environment fire, or hide, the other's alert; nor one cluster
    another's, where several clusters' series meet (Thanos, Mimir: an external label)."""
    expr = str(rule["expr"])
    for match in AGGREGATION.finditer(expr):
        assert match.group(2) == "by", f"{rule['alert']}: {match.group(0)!r} in {expr}"
        labels = expr[match.end() :].split(")", 1)[0].replace(" ", "").split(",")
        assert {"cluster", "namespace"} <= set(labels), f"{rule['alert']}: by ({labels})"
    for match in MATCHING.finditer(expr):
        if match.group(1) == "on":
            labels = match.group(2).replace(" ", "").split(",")
            assert {"cluster", "namespace"} <= set(labels), f"{rule['alert']}: {match.group(0)}"


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_selector_picks_this_service_by_its_label(rule: dict[str, object]) -> None:
    """Job names (recorder, relay, api) are common: another application's job="api" must not
    fire, or hide, this service's alert. Every selector names the service's own label."""
    expr = str(rule["expr"])
    selectors = SELECTOR.findall(expr)
    assert selectors, f"{rule['alert']}: no selector in {expr}"
    for selector in selectors:
        assert SERVICE_MATCHER in selector, f"{rule['alert']}: {{{selector}}} in {expr}"


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_every_rule_names_the_service_and_pages_by_what_users_feel(rule: dict[str, object]) -> None:
    """critical: nothing recording, the outbox stalled, no replica of a role left running;
    warning: one replica of several down, and what degrades without stopping."""
    labels = rule["labels"]
    assert isinstance(labels, dict)
    assert labels.get("service") == SERVICE, f"{rule['alert']}: labels {labels}"
    expected = "critical" if rule["alert"] in CRITICAL else "warning"
    assert labels.get("severity") == expected, f"{rule['alert']}: labels {labels}"


def _cases(*names: str) -> dict[str, Any]:
    suite = load_yaml(ALERTS_TESTS)
    cases = [test for test in suite["tests"] if test["name"] in names]
    assert [test["name"] for test in cases] == list(names), f"missing cases: {names}"
    return {**suite, "tests": cases}


def test_a_foreign_application_with_the_same_job_names_fires_nothing() -> None:
    """The promtool case: this service healthy, another application with jobs recorder, relay
    and api (no service label) broken every way the alerts look at; every alert is expected
    silent, and while it is still evaluated (its series last)."""
    (case,) = _cases(FOREIGN_CASE)["tests"]
    series = [str(s["series"]) for s in case["input_series"]]
    foreign = [s for s in series if SERVICE_MATCHER not in s]
    for job in ("recorder", "relay", "api"):
        assert any(s.startswith("up{") and f'job="{job}"' in s for s in foreign), job
    assert any(SERVICE_MATCHER in s for s in series), "this service is not in the case"
    silent = {c["alertname"] for c in case["alert_rule_test"] if c["exp_alerts"] == []}
    missing = sorted({str(rule["alert"]) for rule in alert_rules()} - silent)
    assert not missing, f"{FOREIGN_CASE!r} does not expect these silent: {missing}"


def test_the_foreign_cases_fail_once_the_service_label_is_dropped(
    promtool: str, tmp_path: Path
) -> None:
    """The cases have teeth: with the service matcher taken out of every expression, the foreign
    application fires every alert, and its healthy replicas hide this service's outage."""
    unscoped = re.sub(SERVICE_MATCHER + r",?\s*", "", ALERTS.read_text())
    (tmp_path / ALERTS.name).write_text(unscoped)
    for rule in alert_rules(tmp_path / ALERTS.name):
        assert SERVICE not in str(rule["expr"]), rule["expr"]
    (tmp_path / "cases.yml").write_text(yaml.safe_dump(_cases(FOREIGN_CASE, HIDDEN_CASE)))
    tested = run_tool(promtool, "test", "rules", "cases.yml", cwd=tmp_path)
    assert not tested.ok, tested.output
    failed = set(re.findall(r"name: (.+),\s+alertname: (\w+),", tested.output))
    expected = {(FOREIGN_CASE, str(rule["alert"])) for rule in alert_rules()}
    expected |= {(HIDDEN_CASE, alert) for alert in HIDDEN_ALERTS}
    assert expected <= failed, f"not failing: {sorted(expected - failed)}\n{tested.output}"


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


def test_every_runbook_url_leads_to_a_section_of_the_published_operations_guide() -> None:
    """An absolute URL (Alertmanager and Grafana resolve nothing else): the published docs of
    the project's source (the Dockerfile's SOURCE), at a heading that exists."""
    source = re.search(r"^ARG SOURCE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert source, "no ARG SOURCE in the Dockerfile"
    published = f"{source.group(1)}/blob/main/docs/operations.md"
    assert published == RUNBOOK_BASE, RUNBOOK_BASE
    runbooks = REPO / "docs" / "operations.md"
    headings = anchors(runbooks)
    for rule in alert_rules():
        url = str(rule["annotations"].get("runbook_url", ""))
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_BASE, f"{rule['alert']}: runbook_url {url!r}"
        assert anchor in headings, f"{rule['alert']}: no heading #{anchor} in {runbooks.name}"
