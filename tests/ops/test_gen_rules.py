"""``python -m tests.ops.gen_rules``: the PrometheusRule from alerts.yml, and one setting for where
every runbook link points (the alerts' ``runbook_url`` and the dashboard's link)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.ops import gen_rules
from tests.ops.conftest import ALERTS, alert_rules, load_yaml

ELSEWHERE = "https://docs.example.org/bulk-recorder/operations.html"


def _runbook_urls(path: Path) -> list[str]:
    if path.name == ALERTS.name:
        return [str(rule["annotations"]["runbook_url"]) for rule in alert_rules(path)]
    groups = load_yaml(path)["spec"]["groups"]
    return [str(rule["annotations"]["runbook_url"]) for g in groups for rule in g["rules"]]


def _dashboard_links(path: Path) -> list[str]:
    return [str(link["url"]) for link in json.loads(path.read_text())["links"]]


@pytest.fixture
def copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The three files gen_rules writes, copied: the test edits the copies only."""
    paths = {}
    for name in ("ALERTS", "DASHBOARD", "PROMETHEUS_RULE"):
        source: Path = getattr(gen_rules, name)
        copy = tmp_path / source.name
        shutil.copy(source, copy)
        monkeypatch.setattr(gen_rules, name, copy)
        paths[name] = copy
    return paths


def test_the_committed_rules_link_the_published_runbooks() -> None:
    """Both alerts.yml and the PrometheusRule hold absolute URLs (Alertmanager and Grafana
    resolve no repository path), and the dashboard links the same guide."""
    for path in (ALERTS, gen_rules.PROMETHEUS_RULE):
        urls = _runbook_urls(path)
        assert urls, path
        for url in urls:
            assert url.startswith(gen_rules.RUNBOOK_BASE + "#"), (path.name, url)
    assert gen_rules.RUNBOOK_BASE.startswith("https://")
    assert gen_rules.RUNBOOK_BASE in _dashboard_links(gen_rules.DASHBOARD)


def test_one_runbook_base_points_every_link_elsewhere(copies: dict[str, Path]) -> None:
    before = {name: path.read_text() for name, path in copies.items()}
    assert gen_rules.main(["--runbook-base", ELSEWHERE]) == 0
    for name in ("ALERTS", "PROMETHEUS_RULE"):
        urls = _runbook_urls(copies[name])
        assert urls, name
        assert all(url.startswith(ELSEWHERE + "#") for url in urls), (name, urls)
        anchors = [url.partition("#")[2] for url in urls]
        assert anchors == [u.partition("#")[2] for u in _runbook_urls(ALERTS)], name
    assert ELSEWHERE in _dashboard_links(copies["DASHBOARD"])
    # Nothing else moved: the texts differ by the base alone.
    for name, path in copies.items():
        after = path.read_text().replace(ELSEWHERE, gen_rules.RUNBOOK_BASE)
        assert after == before[name], name
    assert gen_rules.main(["--check"]) == 0  # the PrometheusRule is alerts.yml's as it is now


@pytest.mark.parametrize("base", ["docs/operations.md", "/docs/operations.md", "ftp://x/y", ""])
def test_a_runbook_base_that_no_browser_resolves_is_refused(
    base: str, copies: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = {name: path.read_text() for name, path in copies.items()}
    with pytest.raises(SystemExit) as exited:
        gen_rules.main(["--runbook-base", base])
    assert exited.value.code == 2
    assert "absolute http(s) URL" in capsys.readouterr().err
    assert {name: path.read_text() for name, path in copies.items()} == before
