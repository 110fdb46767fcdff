"""Writes the prometheus-operator component's ``PrometheusRule`` from
``deploy/prometheus/alerts.yml``, the one source of the alert rules.

    python -m tests.ops.gen_rules                        # (re)write prometheusrule.yaml
    python -m tests.ops.gen_rules --check                # exit 1 if the committed file differs
    python -m tests.ops.gen_rules --runbook-base URL     # every runbook link to URL, then write

Every alert's ``runbook_url`` is an absolute URL, a section of the operations guide (default
``RUNBOOK_BASE``, the published one). ``--runbook-base`` points them at another copy of
docs/operations.md: in alerts.yml (which compose's Prometheus loads), in the dashboard's
"Runbooks" link and in the PrometheusRule, one setting for the three.

``tests/ops/test_kubernetes.py`` fails while the committed file is not what this writes, and
checks that the production overlay renders it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.ops.conftest import ALERTS, DEPLOY, GRAFANA_DIR, REPO, load_yaml

# Where every alert's runbook_url points: the operations guide as the project publishes it (its
# source is the Dockerfile's ARG SOURCE). `--runbook-base URL` points them elsewhere.
RUNBOOK_BASE = "https://github.com/bulk-recorder/bulk-recorder/blob/main/docs/operations.md"
DASHBOARD = GRAFANA_DIR / "dashboards" / "bulk-recorder.json"
PROMETHEUS_RULE = (
    DEPLOY / "kubernetes" / "components" / "prometheus-operator" / "prometheusrule.yaml"
)
HEADER = f"""\
# GENERATED from {ALERTS.relative_to(REPO)} by `python -m tests.ops.gen_rules`: edit the rules
# there, then run it again (tests/ops/test_kubernetes.py fails while this file differs). The
# Prometheus Operator loads it when its ruleSelector matches these labels: add the label yours
# wants with a patch, as for the PodMonitor.
"""


def prometheus_rule(alerts: Path = ALERTS) -> dict[str, Any]:
    """The PrometheusRule object holding every group of ``alerts`` as it is."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "bulk-recorder",
            "labels": {"app.kubernetes.io/name": "bulk-recorder"},
        },
        "spec": {"groups": load_yaml(alerts)["groups"]},
    }


def render(alerts: Path = ALERTS) -> str:
    body = yaml.safe_dump(prometheus_rule(alerts), sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def runbook_base(alerts: Path) -> str:
    """The one URL every ``runbook_url`` of ``alerts`` starts with (before its ``#anchor``)."""
    rules = [rule for group in load_yaml(alerts)["groups"] for rule in group["rules"]]
    bases = {str(rule["annotations"]["runbook_url"]).partition("#")[0] for rule in rules}
    if len(bases) != 1:
        raise ValueError(f"{alerts.name}: runbook_url under several bases: {sorted(bases)}")
    return bases.pop()


def absolute_url(text: str) -> str:
    """An argparse type: an http(s) URL with a host, which Alertmanager and Grafana open."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or "#" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: give an absolute http(s) URL, no #anchor")
    return text


def rebase(new: str) -> None:
    """Point every runbook link (alerts.yml's ``runbook_url``, the dashboard's link) at ``new``."""
    old = runbook_base(ALERTS)
    ALERTS.write_text(ALERTS.read_text().replace(f'runbook_url: "{old}#', f'runbook_url: "{new}#'))
    dashboard = DASHBOARD.read_text()
    DASHBOARD.write_text(dashboard.replace(f'"url": "{old}"', f'"url": "{new}"'))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare, write nothing")
    mode.add_argument(
        "--runbook-base",
        type=absolute_url,
        metavar="URL",
        help="point every runbook link at URL, docs/operations.md as you publish it "
        f"(the project's: {RUNBOOK_BASE})",
    )
    args = parser.parse_args(argv)
    if args.runbook_base:
        rebase(args.runbook_base)
    text = render(ALERTS)
    shown = (
        PROMETHEUS_RULE.relative_to(REPO)
        if PROMETHEUS_RULE.is_relative_to(REPO)
        else PROMETHEUS_RULE
    )
    if args.check:
        same = PROMETHEUS_RULE.is_file() and PROMETHEUS_RULE.read_text() == text
        print(f"{shown}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    PROMETHEUS_RULE.write_text(text)
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
