"""Writes the prometheus-operator component's ``PrometheusRule`` from
``deploy/prometheus/alerts.yml``, the one source of the alert rules.

    python -m tests.ops.gen_rules          # (re)write prometheusrule.yaml
    python -m tests.ops.gen_rules --check  # exit 1 if the committed file differs

``tests/ops/test_kubernetes.py`` fails while the committed file is not what this writes, and
checks that the production overlay renders it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.ops.conftest import ALERTS, DEPLOY, REPO, load_yaml

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = PROMETHEUS_RULE.is_file() and PROMETHEUS_RULE.read_text() == text
        print(f"{PROMETHEUS_RULE.relative_to(REPO)}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    PROMETHEUS_RULE.write_text(text)
    print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
