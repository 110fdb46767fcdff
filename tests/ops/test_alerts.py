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
    alert_rules,
    load_yaml,
    run_tool,
)

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
